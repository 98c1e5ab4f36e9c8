package limits

import (
	"hash/maphash"
	"net/netip"
)

// Test hooks for the external tests of this package (package limits_test),
// which run the limiter over real stores.

// DriftShift is driftShift.
const DriftShift = driftShift

// EntrySpan returns how long before the store's retry time the cached
// denial of key stops holding (retryAt - until), and false when key is not
// cached.
func (c *DenyCache) EntrySpan(key string) (int64, bool) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		e, ok := sh.m[key]
		sh.mu.Unlock()
		if ok {
			return e.retryAtUS - e.untilUS, true
		}
	}
	return 0, false
}

// Hdrs is a request's headers as a map, for tests.
type Hdrs = hdrs

// IdentityOfKey is keyIdentity.
func IdentityOfKey(key []byte, prefix string, r *Rule) []byte { return keyIdentity(key, prefix, r) }

// NopStore is nopStore.
type NopStore = nopStore

// Resolve is resolve: the limiter's lookup of one identity.
func (t *IdentityTable) Resolve(id, ident []byte, addr netip.Addr, clock *int64) (IdentityEntry, bool) {
	return t.resolve(id, ident, addr, clock)
}

// FloorDiv is floorDiv.
func FloorDiv(x, y int64) int64 { return floorDiv(x, y) }

// Capacity is capacity.
func Capacity(r *Rule) int64 { return capacity(r) }

// NoDenyCache takes the deny cache out of l, so that every denial reaches
// the store (or the lease).
func (l *Limiter) NoDenyCache() { l.deny = nil }

// LeaseSlices returns the windows of the slices l holds for key under r,
// and the units they make available.
func (l *Limiter) LeaseSlices(key string, r *Rule, now int64) (windows []int64, avail int64) {
	e := l.leases.entry(key, r, now)
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.slices {
		windows = append(windows, s.window)
	}
	return windows, e.avail.Load()
}

// Holds reports whether the cache holds a denial of key for r and cost at
// nowUS.
func (c *DenyCache) Holds(key string, r *Rule, cost, nowUS int64) bool {
	_, hit, _ := c.lookup([]byte(key), r, cost, nowUS)
	return hit
}

// LeaseEntry is a handle on one key's lease entry.
type LeaseEntry struct{ e *leaseEntry }

// LeaseEntry returns key's lease entry under r (created if need be).
func (l *Limiter) LeaseEntry(key string, r *Rule, now int64) LeaseEntry {
	return LeaseEntry{l.leases.entry(key, r, now)}
}

// SweepLeaseTable runs the lease table's sweep at now, without the store.
func (l *Limiter) SweepLeaseTable(now int64) { l.leases.sweep(now) }

// TrySpend is trySpend.
func (h LeaseEntry) TrySpend(cost, now int64) (uint64, bool) { return h.e.trySpend(cost, now) }

// GiveBack is giveBack.
func (h LeaseEntry) GiveBack(cost int64, ep uint64, now int64) { h.e.giveBack(cost, ep, now) }

// Avail is the units the entry may spend.
func (h LeaseEntry) Avail() int64 { return h.e.avail.Load() }

// RetryLater is retryLater.
var RetryLater = retryLater

// Scanned returns how many entries the cache's sweeps have read.
func (c *DenyCache) Scanned() int64 {
	var n int64
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n += sh.scanned
		sh.mu.Unlock()
	}
	return n
}

// SameShard reports whether keys a and b are in one shard of c.
func (c *DenyCache) SameShard(a, b string) bool {
	return c.shard(maphash.String(c.seed, a)) == c.shard(maphash.String(c.seed, b))
}
