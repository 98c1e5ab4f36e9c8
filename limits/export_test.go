package limits

import "net/netip"

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
