package limits

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"unsafe"
)

// keyIntern hands out one string per store key, so that building the key
// of a known identity allocates nothing: the limiter builds keys into a
// reused buffer and looks the bytes up here. The strings are never
// modified or reused, so a Verdict's Key stays valid for whoever keeps it
// (the top-denied sketch, the deny cache, background refunds).
//
// Memory is bounded: a shard that reaches keyInternShardMax entries is
// emptied and starts over. Identities that come back are interned again
// (one allocation, as without the table); a flood of new identities costs
// one allocation each, as it would anyway.
//
// The look-up of a known key runs on every decision, over as many keys as
// there are identities, so it is built to touch little memory and write
// none: a shard's table is an open-addressed array of pointers to
// immutable entries, read without a lock (a reader sees a slot either
// empty or filled with a complete entry), and a short key's bytes live in
// its entry, so a hit reads one slot and one entry. Writers (a new key, a
// table that grows or starts over) hold the shard's mutex and publish a
// new table whole; a reader still probing the old one finds what it held,
// or nothing and then asks under the lock.
type keyIntern struct {
	// shards first: 64 bytes each from the struct's start, so where the
	// struct starts a cache line (its size class puts it on a multiple of
	// 4864 bytes) each shard has a line of its own; behind an 8-byte seed
	// every shard straddled two
	shards [keyInternShards]internShard
	seed   maphash.Seed
}

const (
	keyInternShards   = 64
	keyInternShardMax = 2048 // 131,072 keys in all: about 30 MB with 200-byte keys (a long identity is hashed)
	// A shard's table has at least twice as many slots as entries (linear
	// probing stays short), from internMinSlots up to
	// 2*keyInternShardMax.
	internMinSlots = 16
	// internInline is the longest key kept in its entry's own memory (the
	// entry is then 64 bytes: one cache line).
	internInline = 40
)

type internShard struct {
	tab atomic.Pointer[internTable]
	mu  sync.Mutex // held by writers
	// n is the number of entries in tab (written under mu).
	n int
	_ [64 - 8 - 8 - 8]byte // a shard per cache line: readers share it, clean
}

// internTable is one shard's open-addressed table; len(slots) is a power
// of two. Slots go from nil to an entry once and never change again: a
// table that must change otherwise is replaced.
type internTable struct {
	slots []atomic.Pointer[internEntry]
}

// internEntry is one interned key; s is never modified.
type internEntry struct {
	hash uint64
	s    string
}

// internShort is the entry of a key of at most internInline bytes, held
// in the entry's own memory (s points into buf).
type internShort struct {
	internEntry
	buf [internInline]byte
}

func newKeyIntern() *keyIntern {
	t := &keyIntern{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].tab.Store(&internTable{slots: make([]atomic.Pointer[internEntry], internMinSlots)})
	}
	return t
}

// get returns the interned string equal to b.
func (t *keyIntern) get(b []byte) string {
	h := maphash.Bytes(t.seed, b)
	sh := &t.shards[h%keyInternShards]
	if s, ok := sh.tab.Load().find(h, b); ok {
		return s
	}
	return sh.add(h, b)
}

// find looks b (of hash h) up without a lock.
func (tab *internTable) find(h uint64, b []byte) (string, bool) {
	mask := uint64(len(tab.slots) - 1)
	for i := (h / keyInternShards) & mask; ; i = (i + 1) & mask {
		e := tab.slots[i].Load()
		if e == nil {
			return "", false
		}
		if e.hash == h && e.s == string(b) {
			return e.s, true
		}
	}
}

// add interns b (of hash h), unless a writer did in the meantime.
func (sh *internShard) add(h uint64, b []byte) string {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	tab := sh.tab.Load()
	if s, ok := tab.find(h, b); ok {
		return s
	}
	if 2*(sh.n+1) > len(tab.slots) {
		if len(tab.slots) >= 2*keyInternShardMax {
			// Full: start over.
			tab = &internTable{slots: make([]atomic.Pointer[internEntry], len(tab.slots))}
			sh.n = 0
		} else {
			tab = tab.grown()
		}
		// Published after the new entry is in: until then readers use the
		// old table, which holds everything the new one does.
		defer sh.tab.Store(tab)
	}
	e := newInternEntry(h, b)
	tab.insert(e)
	sh.n++
	return e.s
}

// grown returns a table of twice as many slots holding tab's entries.
func (tab *internTable) grown() *internTable {
	next := &internTable{slots: make([]atomic.Pointer[internEntry], 2*len(tab.slots))}
	for i := range tab.slots {
		if e := tab.slots[i].Load(); e != nil {
			next.insert(e)
		}
	}
	return next
}

// insert puts e, known to be absent, in the first free slot of its probe
// sequence. The caller holds the shard's mutex.
func (tab *internTable) insert(e *internEntry) {
	mask := uint64(len(tab.slots) - 1)
	for i := (e.hash / keyInternShards) & mask; ; i = (i + 1) & mask {
		if tab.slots[i].Load() == nil {
			tab.slots[i].Store(e)
			return
		}
	}
}

// newInternEntry makes the entry of b: its own copy of the bytes, in the
// entry itself when they fit.
func newInternEntry(h uint64, b []byte) *internEntry {
	if len(b) == 0 || len(b) > internInline {
		return &internEntry{hash: h, s: string(b)}
	}
	e := &internShort{internEntry: internEntry{hash: h}}
	n := copy(e.buf[:], b)
	e.s = unsafe.String(&e.buf[0], n)
	return &e.internEntry
}
