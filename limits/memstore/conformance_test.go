package memstore

import (
	"testing"
	"time"

	"github.com/rategate/rategate/limits/storetest"
)

// TestConformance runs the store conformance suite on the memory store.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Store {
		m := NewSweeping(50 * time.Millisecond)
		t.Cleanup(func() { m.Close() })
		return storetest.Store{Name: "memory", Store: m, PeekAt: m.PeekAt, TTL: m.TTL, Raw: m.Raw}
	})
}
