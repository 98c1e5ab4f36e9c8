package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
)

// deniedCache returns a deny cache and a function that makes it hold one
// cached denial per user given (a limiter over a memory store: a user's
// first request admitted, the next denied and cached). Fill it after the
// cache's Resets subscribed: a subscription clears the cache.
func deniedCache(t *testing.T) (*limits.DenyCache, func(users ...string)) {
	t.Helper()
	m := memstore.New()
	t.Cleanup(func() { m.Close() })
	c := limits.NewDenyCache(1000)
	r := &limits.Rule{Name: "u", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.FixedWindow,
		Limit: 1, Period: time.Hour, Burst: 1, Cost: 1}
	l := limits.New(limits.Options{Store: m, Prefix: "rg", Rules: []*limits.Rule{r}, DenyCache: c})
	return c, func(users ...string) {
		t.Helper()
		for _, u := range users {
			for range 2 {
				var d limits.Decision
				if err := l.Decide(context.Background(), &limits.Request{User: []byte(u)}, &d); err != nil {
					t.Fatal(err)
				}
			}
		}
		if c.Len() != len(users) {
			t.Fatalf("%d cached denials, want %d", c.Len(), len(users))
		}
	}
}

// twoInstances starts a real Redis with another instance on it: its deny
// cache, listening on the reset channel of a fresh prefix, holds a cached
// denial of each user given. It returns that cache and this instance's
// Resets on the same channel, not running yet; with viaProxy this instance
// reaches Redis through the returned fault proxy (nil otherwise).
func twoInstances(t *testing.T, viaProxy bool, users ...string) (other *limits.DenyCache, here *Resets, proxy *testredis.Proxy) {
	t.Helper()
	srv := testredis.Start(t)
	prefix := fmt.Sprintf("resets%d", time.Now().UnixNano())
	other, fill := deniedCache(t)
	runResets(t, NewResets(srv.Client(t), prefix, other, zerolog.Nop()))
	fill(users...)
	client := srv.Client(t)
	if viaProxy {
		proxy = testredis.StartProxy(t, srv.Addr)
		client = testredis.NodeClient(t, proxy.Addr)
	}
	return other, NewResets(client, prefix, limits.NewDenyCache(10), zerolog.Nop()), proxy
}

// runResets runs r until the test ends and waits for its subscription.
func runResets(t *testing.T, r *Resets) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-r.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("no subscription within 10 s")
	}
}

// waitLen waits (bounded) until c holds n entries.
func waitLen(t *testing.T, c *limits.DenyCache, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.Len() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d cached denials after 10 s, want %d", what, c.Len(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestResetsAnnouncedKeyIsForgottenElsewhere: a key Announce queues
// reaches the other instance, which forgets that key only.
func TestResetsAnnouncedKeyIsForgottenElsewhere(t *testing.T) {
	other, here, _ := twoInstances(t, false, "alice", "bob")
	runResets(t, here)
	here.Announce("rg:{u:alice}:fw2")
	waitLen(t, other, 1, "after alice's key was announced")
	deadline := time.Now().Add(5 * time.Second)
	for st := here.Stats(); st.Sent != 1 || st.Failed != 0 || st.Clears != 0; st = here.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("publisher counts %+v, want one key sent", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestResetsOverflowClearsEveryCache: announcements past what the queue
// holds are not dropped (each would leave another instance denying a key
// Redis admits, until its retry time): one clearAll stands for them, and
// every instance clears its cache.
func TestResetsOverflowClearsEveryCache(t *testing.T) {
	other, here, _ := twoInstances(t, false, "alice", "bob", "carol")
	// Queued before the publisher runs: the last ones overflow.
	for i := range maxPendingAnnouncements + 10 {
		here.Announce(fmt.Sprintf("rg:{u:x%d}:fw2", i))
	}
	if other.Len() != 3 {
		t.Fatalf("%d cached denials before anything was published", other.Len())
	}
	runResets(t, here)
	waitLen(t, other, 0, "after the overflow")
	// (the publisher counts a send once its reply is in, which can be
	// after the other instance heard it)
	deadline := time.Now().Add(5 * time.Second)
	for st := here.Stats(); st.Failed != 10 || st.Clears != 1; st = here.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("publisher counts %+v, want the 10 keys past the queue failed and one clear sent", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
