package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Epoch notices when Redis lost its data on its own: FLUSHALL, a
// restart without persistence, a failover to a replica that was empty. It
// keeps a marker key, <prefix>:epoch, without a TTL: set once (NX) by the
// first instance, read by every instance every interval. A marker that is
// gone or holds another value than last time means everything rategate
// kept in Redis is gone with it, so what was derived from it (cached
// denials) must go too.
type Epoch struct {
	client redis.UniversalClient
	key    string
	last   string
}

// NewEpoch returns the epoch marker of the given key prefix.
func NewEpoch(client redis.UniversalClient, prefix string) *Epoch {
	return &Epoch{client: client, key: prefix + ":epoch"}
}

// Check reads the marker (setting it when absent) and reports whether
// Redis lost its data since the last Check. The first Check reports false.
func (e *Epoch) Check(ctx context.Context) (lost bool, err error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	mine := hex.EncodeToString(b[:])
	if err := e.client.SetNX(ctx, e.key, mine, 0).Err(); err != nil {
		return false, err
	}
	v, err := e.client.Get(ctx, e.key).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil // flushed between the two commands: the next Check sees it
	}
	if err != nil {
		return false, err
	}
	lost = e.last != "" && v != e.last
	e.last = v
	return lost, nil
}

// Run checks every interval until ctx ends and calls onLoss whenever Redis
// lost its data. A failed read changes nothing: a Redis that is down has
// not been proven empty, and the next read after it is back tells.
func (e *Epoch) Run(ctx context.Context, every time.Duration, onLoss func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, every)
		lost, err := e.Check(cctx)
		cancel()
		if err == nil && lost {
			onLoss()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
