package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

// TestProbeTopDeadInstanceOutlivesTTL: top.Shared's contract is that
// Publish stores one instance's summaries "kept for ttl"
// (docs/operations.md: each instance's sketch "expiring after 6 minutes").
// The store keeps every instance's summary as a field of one hash per
// rule and refreshes the whole hash's EXPIRE on every publication, so
// the field of an instance that stopped (a restarted pod: the instance
// name has the pid and start time in it) lives as long as any other
// instance keeps publishing: one field per instance that ever ran, never
// removed. Here the ttl is 300 ms (6 min in production); a second
// instance publishing every 100 ms keeps the dead one's field for 3 s,
// ten times its ttl, and every restart adds a field.
func TestProbeTopDeadInstanceOutlivesTTL(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("probetop%d", time.Now().UnixNano())
	s := NewTop(c, prefix)
	const ttl = 300 * time.Millisecond
	summary := []byte(`{"at":1,"minutes":[{"m":1,"e":[]}]}`)
	// 20 instances that each ran once and stopped (rolling restarts), then
	// one that lives on and publishes every 100 ms for 3 s.
	for i := 0; i < 20; i++ {
		if err := s.Publish(ctx, "api", fmt.Sprintf("host:%d:dead", i), summary, ttl); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if err := s.Publish(ctx, "api", "host:live", summary, ttl); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	m, err := s.Load(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	dead := 0
	for inst := range m {
		if inst != "host:live" {
			dead++
		}
	}
	if dead > 0 {
		t.Fatalf("%d stopped instances' summaries still stored 3 s after their last publication, with ttl %v (key %s:top:api holds %d fields, PTTL %v)",
			dead, ttl, prefix, len(m), c.PTTL(ctx, prefix+":top:api").Val())
	}
}
