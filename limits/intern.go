package limits

import (
	"hash/maphash"
	"sync"
)

// keyIntern hands out one string per store key, so that building the key
// of a known identity allocates nothing: the limiter builds keys into a
// reused buffer and looks the bytes up here (a map index by string(b) does
// not allocate). The strings are never modified or reused, so a Verdict's
// Key stays valid for whoever keeps it (the top-denied sketch, the deny
// cache, background refunds).
//
// Memory is bounded: a shard that reaches keyInternShardMax entries is
// emptied and starts over. Identities that come back are interned again
// (one allocation, as without the table); a flood of new identities costs
// one allocation each, as it would anyway.
type keyIntern struct {
	seed   maphash.Seed
	shards [keyInternShards]internShard
}

const (
	keyInternShards   = 64
	keyInternShardMax = 2048 // 131,072 keys in all, roughly 15 MB at most
)

type internShard struct {
	mu sync.RWMutex
	m  map[string]string
}

func newKeyIntern() *keyIntern {
	t := &keyIntern{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].m = make(map[string]string)
	}
	return t
}

// get returns the interned string equal to b.
func (t *keyIntern) get(b []byte) string {
	sh := &t.shards[maphash.Bytes(t.seed, b)%keyInternShards]
	sh.mu.RLock()
	s, ok := sh.m[string(b)]
	sh.mu.RUnlock()
	if ok {
		return s
	}
	s = string(b)
	sh.mu.Lock()
	if len(sh.m) >= keyInternShardMax {
		clear(sh.m)
	}
	sh.m[s] = s
	sh.mu.Unlock()
	return s
}
