package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Epoch notices when Redis lost its data on its own: FLUSHALL, a
// restart without persistence, a failover to a replica that was empty. It
// keeps a marker key, <prefix>:epoch, without a TTL: set once (NX) by the
// first instance, read by every instance every interval. A marker that is
// gone or holds another value than last time means everything rategate
// kept in Redis is gone with it, so what was derived from it (cached
// denials, leased slices) must go too.
//
// On Redis Cluster one marker cannot see every loss: a primary restarted
// empty while it keeps its slots loses its own keys only. Store.Epoch adds
// a marker on every primary there (<prefix>:epoch:{N}, N chosen so that
// its slot is that primary's), and a loss of any of them is a loss.
type Epoch struct {
	client redis.UniversalClient
	keys   func() []string
	last   map[string]string // marker key → the value it held at the last Check
}

// NewEpoch returns the epoch marker of the given key prefix.
func NewEpoch(client redis.UniversalClient, prefix string) *Epoch {
	key := prefix + ":epoch"
	return &Epoch{client: client, keys: func() []string { return []string{key} }, last: map[string]string{}}
}

// Epoch returns the store's epoch marker under prefix: NewEpoch's, and on
// Redis Cluster one more on every primary of the slot map.
func (s *Store) Epoch(prefix string) *Epoch {
	e := NewEpoch(s.Client(), prefix)
	if s.nodes != nil {
		e.keys = func() []string { return append([]string{prefix + ":epoch"}, s.nodes.epochKeys(prefix)...) }
	}
	return e
}

// Check reads the markers (setting those absent) and reports whether
// Redis lost data since the last Check. The first Check of a marker
// reports nothing for it. A loss is reported even when a later marker's
// read fails (err is then that failure too).
func (e *Epoch) Check(ctx context.Context) (lost bool, err error) {
	keys := e.keys()
	for _, k := range keys {
		l, err := e.check(ctx, k)
		lost = lost || l
		if err != nil {
			return lost, err
		}
	}
	// a primary gone from the slot map, or a marker moved: forgotten, so
	// that a marker used again later is not compared with a stale value
	for k := range e.last {
		if !slices.Contains(keys, k) {
			delete(e.last, k)
		}
	}
	return lost, nil
}

// check reads one marker; see Check.
func (e *Epoch) check(ctx context.Context, key string) (lost bool, err error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	mine := hex.EncodeToString(b[:])
	if err := e.client.SetNX(ctx, key, mine, 0).Err(); err != nil {
		return false, err
	}
	v, err := e.client.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil // flushed between the two commands: the next Check sees it
	}
	if err != nil {
		return false, err
	}
	last := e.last[key]
	e.last[key] = v
	return last != "" && v != last, nil
}

// epochKeys returns one epoch marker key for every primary of the slot
// map, each in a slot that primary serves (none before the map is read:
// it asks for it then).
func (n *clusterNodes) epochKeys(prefix string) []string {
	n.mu.RLock()
	defer n.mu.RUnlock()
	want := map[*clusterNode]bool{}
	for _, nd := range n.slots {
		if nd != nil {
			want[nd] = true
		}
	}
	if len(want) == 0 {
		n.reloadSoon()
		return nil
	}
	var out []string
	for i := 0; len(want) > 0 && i < 1<<16; i++ {
		key := prefix + ":epoch:{" + strconv.Itoa(i) + "}"
		if nd := n.slots[KeySlot(key)]; nd != nil && want[nd] {
			delete(want, nd)
			out = append(out, key)
		}
	}
	return out
}

// Run checks every interval until ctx ends and calls onLoss whenever Redis
// lost its data. A failed read changes nothing: a Redis that is down has
// not been proven empty, and the next read after it is back tells.
func (e *Epoch) Run(ctx context.Context, every time.Duration, onLoss func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, every)
		lost, _ := e.Check(cctx)
		cancel()
		if lost {
			onLoss()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
