// Package memstore is the in-process store: every algorithm as a Go twin
// of its Lua script (algo*.go), operation for operation, so one timeline
// gives the same decisions here and on Redis. It serves `go run .` without
// Redis, the limiter's local fallback, and the tests that compare stores.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rategate/rategate/limits"
)

// memShards is the number of independently locked maps. A decision locks
// only the shards its keys live in, in ascending order, so concurrent
// decisions on unrelated keys rarely contend and never deadlock.
const memShards = 64

// Store is the embedded store: the same algorithms and the same
// all-or-nothing batches as Redis, for one process. Keys expire like their
// Redis twins and a janitor removes expired keys, so memory is bounded by the
// number of keys active within their TTL, not by how many were ever seen;
// and by SetMaxKeys, so that a flood of new identities (one per request,
// with a rule keyed on the route or on a header) cannot grow it without
// end before their TTLs pass.
type Store struct {
	seed   maphash.Seed
	shards [memShards]memShard
	now    func() int64
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
	// perShard is how many keys a shard keeps (SetMaxKeys); evicted counts
	// the live keys dropped to make room.
	perShard atomic.Int64
	evicted  atomic.Uint64
}

// DefaultMaxKeys is how many keys a Store keeps unless SetMaxKeys says
// otherwise: about 250 MB of counters.
const DefaultMaxKeys = 1_000_000

// evictSample is how many keys a full shard looks at for one to drop.
const evictSample = 8

// logPerKey is how many entries of a sliding_log key's log array weigh as
// much as one more key: 8 entries of 24 bytes, about what a key costs the
// store (some 450 bytes with its map entry and state, measured).
const logPerKey = 8

// weight is what st counts against SetMaxKeys: 1, and for a sliding_log
// key 1 more for every logPerKey entries of the array behind its log
// (state.a: the entries it dropped from the front included; a full log of
// 10,000 entries, the most a rule takes, about 1,500).
func weight(st *state) int64 {
	if st.log == nil {
		return 1
	}
	return 1 + st.a/logPerKey
}

type memShard struct {
	mu sync.Mutex
	m  map[string]*state
	// units is what the keys of m weigh together (weight): what SetMaxKeys
	// bounds.
	units int64
	// kept are the keys of the operation holding mu, which making room
	// for another of its keys must not drop (keep); it empties them
	// before it unlocks.
	kept []string
}

// New returns an in-memory store whose janitor sweeps expired
// keys every second until Close.
func New() *Store {
	return NewSweeping(time.Second)
}

func NewSweeping(sweep time.Duration) *Store {
	s := &Store{
		seed: maphash.MakeSeed(),
		now:  func() int64 { return time.Now().UnixMicro() },
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*state)
	}
	s.SetMaxKeys(DefaultMaxKeys)
	go s.janitor(sweep)
	return s
}

// SetMaxKeys bounds the keys the store keeps to about n (at least one per
// shard; a reload may change it), a sliding_log key counting once more for
// every logPerKey entries of its log's array (weight). A new key in a
// full shard, or a log that grows past it, takes the place of the key that
// expires first among a few (an expired one if the janitor has not swept it
// yet), as NGINX's limit_req zone drops its oldest state: that identity's
// counter starts again, so set n above the identities a period sees
// (Evictions counts the live keys dropped). One key alone may weigh more
// than its shard's share: it is then the only key its shard keeps.
func (s *Store) SetMaxKeys(n int) {
	s.perShard.Store(max(int64(n+memShards-1)/memShards, 1))
}

// Evictions returns how many unexpired keys were dropped to make room.
func (s *Store) Evictions() uint64 { return s.evicted.Load() }

// Name implements Store.
func (s *Store) Name() string { return "memory" }

// Ping implements Store; the memory store always answers.
func (s *Store) Ping(context.Context) error { return nil }

// Close stops the janitor.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.stop); <-s.done })
	return nil
}

// Len returns the number of stored keys, expired ones not yet swept included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// TTL returns how long key has left to live, and false when it is absent.
// It exists for tests and the admin API.
func (s *Store) TTL(key string) (time.Duration, bool) {
	sh := &s.shards[s.shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st, ok := sh.m[key]
	now := s.now()
	if !ok || st.expireUS <= now {
		return 0, false
	}
	return time.Duration(st.expireUS-now) * time.Microsecond, true
}

// HoldsAt reports whether key is stored and unexpired at nowUS on the
// store's clock: TTL for a timeline on a test's own clock. Tests only.
func (s *Store) HoldsAt(key string, nowUS int64) bool {
	sh := &s.shards[s.shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := sh.m[key]
	return st != nil && st.expireUS > nowUS
}

func (s *Store) shardOf(key string) int {
	return int(maphash.String(s.seed, key) % memShards)
}

func (s *Store) janitor(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep(s.now())
		}
	}
}

// sweep removes expired keys, one shard at a time so no lock is held long.
func (s *Store) sweep(now int64) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, st := range sh.m {
			if st.expireUS <= now {
				sh.drop(k, st)
			}
		}
		sh.mu.Unlock()
	}
}

// Decide implements Store.
func (s *Store) Decide(_ context.Context, b *limits.Batch, results []limits.Result) (bool, error) {
	n := len(b.Checks)
	if len(results) < n {
		return false, limits.ErrShortResults
	}
	for i := range b.Checks {
		if algos[b.Checks[i].Algorithm] == nil {
			return false, fmt.Errorf("memory store: algorithm %q not implemented", b.Checks[i].Algorithm)
		}
	}
	var atBuf, idx [8]int
	at := atBuf[:0] // each check's shard
	for i := range b.Checks {
		at = append(at, s.shardOf(b.Checks[i].Key))
	}
	shards := append(idx[:0], at...)
	sort.Ints(shards)
	for i, sh := range shards {
		if i == 0 || sh != shards[i-1] {
			s.shards[sh].mu.Lock()
		}
	}
	for i, sh := range at {
		s.shards[sh].keep(b.Checks[i].Key)
	}
	defer func() {
		for i, sh := range shards {
			if i == 0 || sh != shards[i-1] {
				s.shards[sh].kept = s.shards[sh].kept[:0]
				s.shards[sh].mu.Unlock()
			}
		}
	}()

	now := b.NowUS
	if now == 0 {
		now = s.now()
	}
	// What each check would write if admitted, and the records it rewrote
	// while deciding (written whatever the verdict, as the scripts do).
	var nextBuf, normBuf [8]state
	var commitBuf, normedBuf [8]bool
	next, norm := nextBuf[:0], normBuf[:0]
	commit, normed := commitBuf[:0], normedBuf[:0]
	admitted := true
	solo := n == 1
	for i := range b.Checks {
		c := &b.Checks[i]
		st := s.load(c.Key, now)
		out := algos[c.Algorithm](&st, now, c, solo)
		results[i] = out.r
		next = append(next, out.next)
		commit = append(commit, out.commit && out.r.Allowed && c.Cost > 0)
		norm = append(norm, st)
		normed = append(normed, out.normalized)
		if !out.r.Allowed && !c.Shadow {
			admitted = false
		}
	}
	for i := range b.Checks {
		switch {
		case admitted && commit[i]:
			s.put(b.Checks[i].Key, next[i])
		case normed[i]:
			s.put(b.Checks[i].Key, norm[i])
		}
	}
	if !admitted {
		// Nothing is consumed: report every rule's quota as it stands.
		for i := range b.Checks {
			if results[i].Allowed {
				results[i] = s.peekLocked(&b.Checks[i], now)
			}
		}
		return false, nil
	}
	return true, nil
}

// load returns a copy of key's state, or the zero state when absent or expired.
func (s *Store) load(key string, now int64) state {
	st := s.shards[s.shardOf(key)].m[key]
	if st == nil || st.expireUS <= now {
		return state{}
	}
	return *st
}

// put stores st under key; a zero state deletes the key. Where the shard
// would then weigh more than SetMaxKeys allows, other keys make room.
func (s *Store) put(key string, st state) {
	sh := &s.shards[s.shardOf(key)]
	p := sh.m[key]
	if st.expireUS == 0 {
		if p != nil {
			sh.drop(key, p)
		}
		return
	}
	w := weight(&st)
	if p != nil {
		w -= weight(p)
	}
	limit := s.perShard.Load()
	for w > 0 && sh.units+w > limit {
		if !s.makeRoom(sh, key) {
			break // nothing else may go: the shard grows
		}
	}
	sh.units += w
	if p != nil {
		*p = st
		return
	}
	sh.m[key] = &st
}

// drop deletes key, whose state is st, from sh (its lock held).
func (sh *memShard) drop(key string, st *state) {
	delete(sh.m, key)
	sh.units -= weight(st)
}

// keep marks key, in sh whose lock the caller holds, as not to be dropped
// by makeRoom until the caller empties kept and unlocks: an operation
// writing several keys must not lose one it has written to make room for
// the next.
func (sh *memShard) keep(key string) { sh.kept = append(sh.kept, key) }

// makeRoom drops one key of the full shard sh (its lock held) other than
// except, and reports whether it found one: of a few keys it looks at (map
// order is random), the one that expires first, an expired one if there is
// one. A lease record is never dropped while it lives (it accounts for
// slices instances hold; without it more would be handed out): a sample of
// lease records only lets the shard grow.
func (s *Store) makeRoom(sh *memShard, except string) bool {
	now := s.now()
	var victim string
	var vs *state
	seen := 0
	for k, st := range sh.m {
		if (st.lease == nil || st.expireUS <= now) && (vs == nil || st.expireUS < vs.expireUS) && k != except &&
			!slices.Contains(sh.kept, k) {
			victim, vs = k, st
		}
		if seen++; seen == evictSample {
			break
		}
	}
	if vs == nil {
		return false
	}
	sh.drop(victim, vs)
	if vs.expireUS > now {
		s.evicted.Add(1)
	}
	return true
}

func (s *Store) peekLocked(c *limits.Check, now int64) limits.Result {
	st := s.load(c.Key, now)
	pc := *c
	pc.Cost = 0
	return algos[c.Algorithm](&st, now, &pc, true).r
}

// Peek implements Store.
func (s *Store) Peek(_ context.Context, c limits.Check) (limits.Result, error) {
	return s.PeekAt(c, 0)
}

// PeekAt is Peek with the clock replaced by nowUS when non-zero. Tests only.
func (s *Store) PeekAt(c limits.Check, nowUS int64) (limits.Result, error) {
	if algos[c.Algorithm] == nil {
		return limits.Result{}, fmt.Errorf("memory store: algorithm %q not implemented", c.Algorithm)
	}
	sh := &s.shards[s.shardOf(c.Key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if nowUS == 0 {
		nowUS = s.now()
	}
	return s.peekLocked(&c, nowUS), nil
}

// Reset implements Store.
func (s *Store) Reset(_ context.Context, c limits.Check) error {
	sh := &s.shards[s.shardOf(c.Key)]
	sh.mu.Lock()
	if st := sh.m[c.Key]; st != nil {
		sh.drop(c.Key, st)
	}
	sh.mu.Unlock()
	return nil
}
