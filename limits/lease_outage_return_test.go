package limits_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/redisstore"
	"github.com/rategate/rategate/limits/storetest"
)

// TestLeaseIdleReturnSurvivesARedisRestart: docs/failure.md, "Redis
// restarted with its data (RDB/AOF): normal; counters resume where they
// were (3 of 10 used before, exactly 7 left after)", and docs/scaling.md:
// a slice is "given back when the key is idle for 0.5 s". A leased key
// that goes idle while Redis restarts (here 1.5 s) gets two tries to give
// its slice back, 100 ms apart, both refused; then the slice is wasted and
// its units stay counted until the window ends (an hour here), so the
// identity finds fewer left than it did not use. A return runs at most
// once per slice (the record's field is deleted), so it can be tried again
// once Redis is back.
func TestLeaseIdleReturnSurvivesARedisRestart(t *testing.T) {
	srv := testredis.StartControlled(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	rs, err := redisstore.New(client, "redis "+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	r := leasedRule("per-user", limits.FixedWindow, 100, storetest.SteadyDuration(), limits.KeyPart{Kind: limits.KeyUser})
	prefix := fmt.Sprintf("or%d", time.Now().UnixNano()%1_000_000)
	mk := func(id string) *limits.Limiter {
		return limits.New(limits.Options{Store: rs, Prefix: prefix, Rules: []*limits.Rule{r}, Leaser: rs, FailureMode: limits.FailDeny,
			Lease: limits.LeaseOptions{Instance: id, Timeout: 200 * time.Millisecond}})
	}
	a := mk("a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.RunLeases(ctx)
	var d limits.Decision
	req := func() limits.Request { return limits.Request{User: []byte("acme")} }
	used := 0
	for i := 0; i < 3; i++ {
		q := req()
		if err := a.Decide(ctx, &q, &d); err != nil || !d.Admitted {
			t.Fatalf("request %d: admitted %v, %v", i, d.Admitted, err)
		}
		used++
	}
	_, held := a.LeasesHeld()
	if held == 0 {
		t.Skip("the instance holds nothing: nothing to give back")
	}
	if err := client.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	time.Sleep(1500 * time.Millisecond) // the key goes idle (0.5 s), its return is tried and refused
	srv.Restart(t)
	time.Sleep(500 * time.Millisecond) // sweeps with Redis back
	// a fresh instance spends what is left
	b := mk("b")
	left := 0
	for i := 0; i < 200; i++ {
		q := req()
		if err := b.Decide(ctx, &q, &d); err != nil {
			t.Fatal(err)
		}
		if !d.Admitted {
			break
		}
		left++
	}
	st := a.LeaseStats()[0]
	t.Logf("used %d, held %d at the restart; %d left after it (returned %d, wasted %d, returns failed %d)", used, held, left, st.Returned, st.Wasted, st.ReturnsFailed)
	if left != int(r.Limit)-used {
		t.Errorf("%d left after a restart with the data, want %d (%d used): the %d units the idle key held were never given back", left, int(r.Limit)-used, used, held)
	}
}
