package app

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/redisstore"
)

// clusterDenyYAML: every request of a user counts against per-user (2 an
// hour), requests to /g also against global (3 an hour). On a cluster the
// two keys are in different slots: per-user, the smaller limit, is decided
// first, global second, and a request global denies is refunded in
// per-user's slot.
const clusterDenyYAML = `rules:
  - name: per-user
    key: [user]
    algorithm: fixed_window
    limit: 2
    period: 1h
  - name: global
    match: {path: /g}
    key: []
    algorithm: fixed_window
    limit: 3
    period: 1h
`

// TestDenyCacheOnClusterForgetsARefund: the deny cache is on over a Redis
// Cluster too (without it, a flood of denials costs a Redis round trip
// each, and a flood that makes rategate slower than NGINX's timeout passes
// under $rategate_on_failure open). A cluster decision that a later slot
// denies is refunded in the slots that admitted it; a denial another
// instance saw in between counted the refunded unit, and cached it would
// last until its retry (the hour's end here) while Redis admits. The
// refund is announced as a key reset: every instance forgets the key.
//
// The steps: global is spent; instance B's request to /g for carol
// commits carol's second unit in per-user's slot, then waits on global's
// node (frozen); instance A's request for carol elsewhere meets both units
// spent and caches the denial; the node thaws, global denies B's request,
// B refunds carol's unit, and A must forget its denial and admit.
func TestDenyCacheOnClusterForgetsARefund(t *testing.T) {
	c := testredis.StartCluster(t)
	prefix := uniquePrefix(t)
	instance := func() (*App, *limits.DenyCache) {
		a := redisApp(t, clusterDenyYAML, func(cfg *config.Config) {
			cfg.Redis.ClusterAddrs = c.Addrs()
			cfg.Redis.KeyPrefix = prefix
			cfg.Redis.Timeout = 5 * time.Second
		})
		dc := a.Limiter().DenyCache()
		if dc == nil {
			t.Fatal("no deny cache over Redis Cluster")
		}
		return a, dc
	}
	a, aCache := instance()
	b, _ := instance()
	aAdmin := serveOn(t, a.AdminHandler())

	owner := func(tag string) string {
		addr, err := c.PrimaryForSlot(redisstore.KeySlot(prefix + ":{" + tag + "}:fw"))
		if err != nil {
			t.Fatal(err)
		}
		return addr
	}
	globalNode := owner("global:")
	user := ""
	for i := range 100 {
		if u := fmt.Sprintf("carol%d", i); owner("per-user:"+u) != globalNode {
			user = u
			break
		}
	}
	if user == "" {
		t.Fatal("no user whose per-user key is on another primary than global's")
	}
	decide := func(ctx context.Context, l *limits.Limiter, u, path string) (limits.Decision, error) {
		var d limits.Decision
		err := l.Decide(ctx, &limits.Request{Route: []byte(path), User: []byte(u), IP: []byte("192.0.2.1")}, &d)
		return d, err
	}
	must := func(l *limits.Limiter, u, path string, admitted bool, what string) limits.Decision {
		t.Helper()
		d, err := decide(context.Background(), l, u, path)
		if err != nil || d.Undecided || d.Local || d.Admitted != admitted {
			t.Fatalf("%s: admitted=%v (want %v), err %v, undecided %v, local %v: %+v", what, d.Admitted, admitted, err, d.Undecided, d.Local, d.Verdicts)
		}
		return d
	}
	for i := range 3 {
		must(a.Limiter(), fmt.Sprintf("filler%d", i), "/g", true, "a filler spending global")
	}
	must(a.Limiter(), user, "/other", true, "carol's first request")

	if err := c.Node(globalNode).Freeze(); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := c.Node(globalNode).Thaw(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(thaw)
	type outcome struct {
		d   limits.Decision
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		d, err := decide(ctx, b.Limiter(), user, "/g")
		done <- outcome{d, err}
	}()
	// Wait for B's commit in per-user's slot (not frozen).
	deadline := time.Now().Add(3 * time.Second)
	for {
		code, body := call(t, aAdmin, "GET", "/v1/keys/per-user?user="+user, "")
		var st struct{ Remaining int64 }
		if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
			t.Fatalf("key state: %d %s", code, body)
		}
		if st.Remaining == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance B's request did not commit carol's second unit within 3 s: %s", body)
		}
		time.Sleep(5 * time.Millisecond)
	}
	must(a.Limiter(), user, "/other", false, "carol at A while B's unit is held")
	if d := must(a.Limiter(), user, "/other", false, "carol at A again"); !d.Cached {
		t.Fatal("instance A did not cache carol's denial")
	}

	thaw()
	o := <-done
	if o.err != nil || o.d.Admitted || o.d.Undecided {
		t.Fatalf("instance B's request to /g: admitted=%v undecided=%v err %v, want denied by global", o.d.Admitted, o.d.Undecided, o.err)
	}
	waitEmpty(t, aCache, "instance A after B's refund of carol's unit")
	if d := must(a.Limiter(), user, "/other", true, "carol at A after B's refund"); d.Cached {
		t.Fatal("answered from the cache")
	}
}
