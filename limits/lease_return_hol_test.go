package limits_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
)

// keyFailLeaser fails every return while all is set, and the returns of
// keys holding bad always (one Redis Cluster master down: the other
// masters answer).
type keyFailLeaser struct {
	limits.Leaser
	all atomic.Bool
	bad string
}

func (k *keyFailLeaser) ReturnLease(ctx context.Context, r *limits.LeaseReturn) (int64, error) {
	if k.all.Load() || strings.Contains(r.Check.Key, k.bad) {
		return 0, errors.New("this key's master is down (test)")
	}
	return k.Leaser.ReturnLease(ctx, r)
}

// TestReturnLeasesOneFailingKeyDoesNotHoldBackTheRest: at shutdown one
// key's return keeps failing (its Redis Cluster master is down) while the
// others' would succeed. ReturnLeases must still give the others back, as
// the sweeper does ("a return that fails alone does not hold the others
// back"): retrying the failing one until the grace ends, and only then
// looking at the next, wastes every return queued behind it.
func TestReturnLeasesOneFailingKeyDoesNotHoldBackTheRest(t *testing.T) {
	r := leasedRule("per-user", limits.FixedWindow, 100, time.Hour, limits.KeyPart{Kind: limits.KeyUser})
	mem := memstore.NewSweeping(time.Hour)
	t.Cleanup(func() { mem.Close() })
	kf := &keyFailLeaser{Leaser: mem, bad: "{per-user:bad}"}
	l := limits.New(limits.Options{Store: mem, Prefix: "lt", Rules: []*limits.Rule{r}, Leaser: kf,
		Lease: limits.LeaseOptions{SyncPrefetch: true, Instance: "a"}, Fallback: memstore.NewSweeping(time.Hour), FailureMode: limits.FailAllow})
	now := (time.Now().UnixMicro()/3_600_000_000 + 1) * 3_600_000_000
	decide := func(user string) {
		t.Helper()
		var d limits.Decision
		if err := l.DecideAt(context.Background(), &limits.Request{User: []byte(user)}, &d, now); err != nil || !d.Admitted {
			t.Fatalf("%s: admitted %v, err %v", user, d.Admitted, err)
		}
	}
	const goods, used = 10, 3
	for i := range goods {
		for range used {
			now += 10
			decide(fmt.Sprintf("good%d", i))
		}
	}
	// The good keys go idle while every return fails: their returns wait
	// in the queue. bad is still held.
	now += 1_000_000
	decide("bad")
	kf.all.Store(true)
	l.SweepLeasesAt(context.Background(), now)
	if keys, _ := l.LeasesHeld(); keys != 1 {
		t.Fatalf("%d keys held after the sweep, want 1 (bad)", keys)
	}
	kf.all.Store(false)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	back := l.ReturnLeases(ctx, now)
	took := time.Since(start)

	short := 0
	for i := range goods {
		res, err := mem.PeekAt(r.Check(fmt.Sprintf("lt:{per-user:good%d}:fw2", i), 0), now)
		if err != nil {
			t.Fatal(err)
		}
		if res.Remaining != 100-used {
			short++
		}
	}
	if short > 0 {
		t.Errorf("%d of %d good keys were not given back (ReturnLeases returned %d units in %v): one key's failing return held back the others",
			short, goods, back, took.Round(time.Millisecond))
	}
}
