package top

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits/redisstore"
)

// TestSharedForgetsStoppedInstances: every instance publishes its summary
// of a rule as a field of one hash, whose expiry every publication renews,
// so the field of an instance that stopped (every restart is a new name:
// host, pid, start time) lived as long as any other instance published:
// 20 restarted instances' fields were all still there long after the 6
// minutes a summary is kept. A publishing instance now removes summaries
// older than that once a minute, and Query does not count them.
func TestSharedForgetsStoppedInstances(t *testing.T) {
	srv := testredis.Start(t)
	shared := redisstore.NewTop(srv.Client(t), fmt.Sprintf("tp%d", time.Now().UnixNano()%1_000_000))
	ctx := context.Background()
	t0 := time.Now()
	at := func(tp *Top, d time.Duration) { tp.now = func() time.Time { return t0.Add(d) } }
	for i := range 20 {
		tp := New()
		tp.instance = fmt.Sprintf("host:%d:stopped", i)
		tp.SetShared(shared)
		at(tp, 0)
		tp.Record("api", "rg:{api:10.0.0.1}:fw2")
		if err := tp.Publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	live := New()
	live.instance = "host:live"
	live.SetShared(shared)
	live.Record("api", "rg:{api:10.0.0.2}:fw2")
	// it publishes every 2 s; a minute after the others stopped, nothing is stale yet
	at(live, time.Minute)
	if err := live.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if m, _ := shared.Load(ctx, "api"); len(m) != 21 {
		t.Fatalf("a minute on: %d summaries stored, want 21 (none stale)", len(m))
	}
	if v, err := live.Query(ctx, []string{"api"}, TopMinutes, 10); err != nil || v.Instances != 21 {
		t.Fatalf("a minute on: Query counts %d instances (%v), want 21", v.Instances, err)
	}
	// past the 6 minutes a summary is kept, at the next minute's prune
	at(live, topKeep+2*time.Minute)
	live.Record("api", "rg:{api:10.0.0.2}:fw2")
	if err := live.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := shared.Load(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m["host:live"] == "" {
		t.Fatalf("%v after the others stopped: %d summaries stored, want only the live instance's", topKeep+2*time.Minute, len(m))
	}
	if v, err := live.Query(ctx, []string{"api"}, TopMinutes, 10); err != nil || v.Instances != 1 {
		t.Fatalf("Query counts %d instances (%v), want 1", v.Instances, err)
	}
}
