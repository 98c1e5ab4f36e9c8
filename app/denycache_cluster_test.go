package app

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

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

// clusterPair is two rategate instances, A and B (Apps wired by New: the
// deny cache on), over one Redis Cluster under one key prefix, and what
// the cluster deny-cache tests do with them: decide a user's request to a
// path, read a key's remaining quota through A's admin API, and hold one
// of B's requests to /g between its commit in the user's slots and global's
// verdict (global's primary frozen), so that A meets the held units.
type clusterPair struct {
	t      *testing.T
	c      *testredis.Cluster
	a, b   *App
	aCache *limits.DenyCache
	aAdmin *fasthttp.HostClient
}

func newClusterPair(t *testing.T, c *testredis.Cluster, yaml, prefix string) *clusterPair {
	t.Helper()
	instance := func() *App {
		a := redisApp(t, yaml, func(cfg *config.Config) {
			cfg.Redis.ClusterAddrs = c.Addrs()
			cfg.Redis.KeyPrefix = prefix
			cfg.Redis.Timeout = 5 * time.Second
		})
		if a.Limiter().DenyCache() == nil {
			t.Fatal("no deny cache over Redis Cluster")
		}
		return a
	}
	p := &clusterPair{t: t, c: c, a: instance(), b: instance()}
	p.aCache, p.aAdmin = p.a.Limiter().DenyCache(), serveOn(t, p.a.AdminHandler())
	return p
}

// owner returns the address of the primary that holds key's slot.
func (p *clusterPair) owner(key string) string {
	p.t.Helper()
	return slotOwner(p.t, p.c, key)
}

// slotOwner returns the address of the primary of c that holds key's slot.
func slotOwner(t *testing.T, c *testredis.Cluster, key string) string {
	t.Helper()
	addr, err := c.PrimaryForSlot(redisstore.KeySlot(key))
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func (p *clusterPair) decide(ctx context.Context, in *App, user, path string) (limits.Decision, error) {
	var d limits.Decision
	err := in.Limiter().Decide(ctx, &limits.Request{Route: []byte(path), User: []byte(user), IP: []byte("192.0.2.1")}, &d)
	return d, err
}

// must decides and fails the test unless Redis decided as admitted says.
func (p *clusterPair) must(in *App, user, path string, admitted bool, what string) limits.Decision {
	p.t.Helper()
	d, err := p.decide(context.Background(), in, user, path)
	if err != nil || d.Undecided || d.Local || d.Admitted != admitted {
		p.t.Fatalf("%s: admitted=%v (want %v), err %v, undecided %v, local %v: %+v", what, d.Admitted, admitted, err, d.Undecided, d.Local, d.Verdicts)
	}
	return d
}

// remaining is user's quota left under rule, as Redis has it.
func (p *clusterPair) remaining(rule, user string) int64 {
	p.t.Helper()
	code, body := call(p.t, p.aAdmin, "GET", "/v1/keys/"+rule+"?user="+user, "")
	var st struct{ Remaining int64 }
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
		p.t.Fatalf("key state: %d %s", code, body)
	}
	return st.Remaining
}

// freeze stops the primary at addr until thaw (or the test's end).
func (p *clusterPair) freeze(addr string) (thaw func()) {
	p.t.Helper()
	if err := p.c.Node(addr).Freeze(); err != nil {
		p.t.Fatal(err)
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			if err := p.c.Node(addr).Thaw(); err != nil {
				p.t.Error(err)
			}
		})
	}
	p.t.Cleanup(thaw)
	return thaw
}

// decided is what B's held request got.
type decided struct {
	d   limits.Decision
	err error
}

// holdAtGlobal spends global (three fillers at A), freezes global's
// primary, and sends user's request to /g through B: it commits in the
// user's rules (each must be left at 0: rules) and waits on global. It
// returns B's answer to come, and global's thaw.
func (p *clusterPair) holdAtGlobal(user, globalNode string, rules ...string) (<-chan decided, func()) {
	p.t.Helper()
	for i := range 3 {
		p.must(p.a, fmt.Sprintf("filler%d", i), "/g", true, "a filler spending global")
	}
	p.must(p.a, user, "/other", true, "the user's first request")
	thaw := p.freeze(globalNode)
	done := make(chan decided, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		d, err := p.decide(ctx, p.b, user, "/g")
		done <- decided{d, err}
	}()
	deadline := time.Now().Add(3 * time.Second)
	for _, r := range rules {
		for p.remaining(r, user) != 0 {
			if time.Now().After(deadline) {
				p.t.Fatalf("instance B's request did not commit the user's unit in %s within 3 s", r)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return done, thaw
}

// deniedByGlobal fails the test unless B's held request was denied.
func (p *clusterPair) deniedByGlobal(o decided) {
	p.t.Helper()
	if o.err != nil || o.d.Admitted || o.d.Undecided {
		p.t.Fatalf("instance B's request to /g: admitted=%v undecided=%v err %v, want denied by global", o.d.Admitted, o.d.Undecided, o.err)
	}
}

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
	p := newClusterPair(t, c, clusterDenyYAML, prefix)
	globalNode := p.owner(prefix + ":{global:}:fw")
	user := ""
	for i := range 100 {
		if u := fmt.Sprintf("carol%d", i); p.owner(prefix+":{per-user:"+u+"}:fw") != globalNode {
			user = u
			break
		}
	}
	if user == "" {
		t.Fatal("no user whose per-user key is on another primary than global's")
	}
	done, thaw := p.holdAtGlobal(user, globalNode, "per-user")
	p.must(p.a, user, "/other", false, "carol at A while B's unit is held")
	if d := p.must(p.a, user, "/other", false, "carol at A again"); !d.Cached {
		t.Fatal("instance A did not cache carol's denial")
	}
	thaw()
	p.deniedByGlobal(<-done)
	waitEmpty(t, p.aCache, "instance A after B's refund of carol's unit")
	if d := p.must(p.a, user, "/other", true, "carol at A after B's refund"); d.Cached {
		t.Fatal("answered from the cache")
	}
}
