package app

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

const sentinelIdentitiesYAML = `rules:
  - name: api
    key: [user]
    algorithm: fixed_window
    limit: 100
    period: 1h
`

type sentinelInstance struct {
	app   *App
	admin *fasthttp.HostClient
}

func newSentinelInstance(t *testing.T, s *testredis.SentinelSetup, prefix string) *sentinelInstance {
	t.Helper()
	a := redisApp(t, sentinelIdentitiesYAML, func(cfg *config.Config) {
		cfg.Redis.Sentinel = config.Sentinel{Master: s.Master, Addrs: s.Addrs()}
		cfg.Redis.KeyPrefix = prefix
	})
	return &sentinelInstance{app: a, admin: serveOn(t, a.AdminHandler())}
}

func (in *sentinelInstance) admitted(user string) bool {
	var d limits.Decision
	_ = in.app.Limiter().Decide(context.Background(), &limits.Request{User: []byte(user)}, &d)
	return d.Admitted
}

// TestSentinelLaggedFailoverKeepsANewIdentityBlock: a Sentinel failover
// to a replica that lagged loses the last identity override change (the
// documented "a failover can lose the last writes"), so the change counter
// <prefix>:{identities}:version goes back by one on the new primary. The
// next change made after the failover (an operator's block, retried until
// Redis answers again) gets the number the lost change had. Every instance
// had applied that number, so the announcement was taken for "already
// applied", the instance that made the change did not apply it either
// (settle saw its version reached), and the 500 ms counter check found the
// counter equal: the new block never applied anywhere, while the lost one
// kept applying. A change heard under the number of another now makes an
// instance read them all.
func TestSentinelLaggedFailoverKeepsANewIdentityBlock(t *testing.T) {
	s := testredis.StartSentinel(t)
	prefix := uniquePrefix(t)
	a := newSentinelInstance(t, s, prefix)
	b := newSentinelInstance(t, s, prefix)

	put := func(in *sentinelInstance, user string) (int, string) { return in.block(t, user) }
	waitBlocked := func(in *sentinelInstance, user, who string) {
		within(t, 5*time.Second, who+" blocks "+user, func() error {
			if in.admitted(user) {
				return fmt.Errorf("%s admitted", user)
			}
			return nil
		})
	}

	if code, body := put(a, "u1"); code != 200 {
		t.Fatalf("PUT u1: %d %s", code, body)
	}
	waitBlocked(b, "u1", "B")

	// Hold the replica back: frozen, with its socket buffers filled by a
	// large write, so that what the primary confirms next never reaches it.
	primary, replica := s.Servers[0], s.Servers[1]
	pc := primary.Client(t)
	ctx := testredis.Ctx(t)
	if err := replica.Freeze(); err != nil {
		t.Fatal(err)
	}
	junk := strings.Repeat("x", 16<<20)
	for i := 0; i < 3; i++ {
		if err := pc.Set(ctx, fmt.Sprintf("junk%d", i), junk, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if code, body := put(a, "u2"); code != 200 {
		t.Fatalf("PUT u2: %d %s", code, body)
	}
	waitBlocked(b, "u2", "B")
	old := primary.Addr
	primary.Stop()
	if err := replica.Thaw(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()

	// The operator blocks u3, retrying until Redis answers again.
	if code, body := putUntil(killed.Add(30*time.Second), func() (int, string) { return put(a, "u3") }); code != 200 {
		t.Fatalf("PUT u3 never succeeded: %d %s\n%s", code, body, s.Logs())
	}
	t.Logf("PUT u3 answered 200 %v after the primary was killed", time.Since(killed).Round(time.Millisecond))
	promoted, err := s.WaitPrimary(old, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	nc := s.Server(promoted).Client(t)
	hash, counter := prefix+":{identities}", prefix+":{identities}:version"
	if v, _ := nc.HExists(ctx, hash, "api u2").Result(); v {
		t.Fatal("the replica was not held back: u2's change reached it (no write lost), the test tested nothing")
	}
	ver, _ := nc.Get(ctx, counter).Result()
	stored, _ := nc.HKeys(ctx, hash).Result()
	t.Logf("new primary %s: counter %s, stored %v", promoted, ver, stored)

	// Give every instance several counter checks (500 ms each) and a
	// resubscription to notice.
	time.Sleep(3 * time.Second)
	var problems []string
	for _, in := range []struct {
		name string
		in   *sentinelInstance
	}{{"A (made the change)", a}, {"B", b}} {
		if in.in.admitted("u3") {
			problems = append(problems, fmt.Sprintf("instance %s admits u3, blocked in Redis (version %d applied here)", in.name, in.in.app.Rules().Identities().Version()))
		}
		if !in.in.admitted("u2") {
			problems = append(problems, fmt.Sprintf("instance %s still blocks u2, whose block Redis lost", in.name))
		}
	}
	if len(problems) > 0 {
		t.Fatalf("3 s after the change, Redis stores blocks %v (counter %s), but:\n  %s", stored, ver, strings.Join(problems, "\n  "))
	}
}

// TestSentinelPrimaryRestartedEmptyKeepsANewIdentityBlock: the
// Sentinel primary is killed and restarted empty before the sentinels fail
// it over (within down-after-milliseconds); the replica resyncs from it and
// the whole deployment is empty. The epoch marker notices, but the identity
// overrides' change counter restarts from 0, and the first block made after
// the restart gets number 1 again: the number every instance had applied
// already (the block before the restart). It was taken for applied on every
// instance, including the one that made it, and never applied. A data loss
// the epoch marker notices now makes every instance read them all, and so
// does a change heard under the number of another.
func TestSentinelPrimaryRestartedEmptyKeepsANewIdentityBlock(t *testing.T) {
	s := testredis.StartSentinel(t)
	prefix := uniquePrefix(t)
	a := newSentinelInstance(t, s, prefix)
	b := newSentinelInstance(t, s, prefix)
	put := func(in *sentinelInstance, user string) (int, string) { return in.block(t, user) }
	if code, body := put(a, "u1"); code != 200 {
		t.Fatalf("PUT u1: %d %s", code, body)
	}
	within(t, 5*time.Second, "B blocks u1", func() error {
		if b.admitted("u1") {
			return fmt.Errorf("u1 admitted")
		}
		return nil
	})
	time.Sleep(1500 * time.Millisecond) // the epoch marker has been read
	primary := s.Servers[0]
	primary.Stop()
	primary.Restart(t)
	restarted := time.Now()
	if code, body := putUntil(restarted.Add(20*time.Second), func() (int, string) { return put(a, "u2") }); code != 200 {
		t.Fatalf("PUT u2 never succeeded: %d %s", code, body)
	}
	t.Logf("PUT u2 answered 200 %v after the restart", time.Since(restarted).Round(time.Millisecond))
	// Usually the restarted server is the primary still; had the
	// sentinels failed over meanwhile, u2's block is on the new one, and
	// it must apply all the same.
	addr, err := s.PrimaryAddr()
	if err != nil {
		t.Fatal(err)
	}
	pc := s.Server(addr).Client(t)
	ctx := testredis.Ctx(t)
	stored, _ := pc.HKeys(ctx, prefix+":{identities}").Result()
	ver, _ := pc.Get(ctx, prefix+":{identities}:version").Result()
	t.Logf("primary %s after the restart (restarted: %s): counter %s, stored %v", addr, primary.Addr, ver, stored)
	time.Sleep(3 * time.Second) // several counter checks, epoch checks, resubscriptions
	var problems []string
	for _, in := range []struct {
		name string
		in   *sentinelInstance
	}{{"A (made the change)", a}, {"B", b}} {
		if in.in.admitted("u2") {
			problems = append(problems, fmt.Sprintf("instance %s admits u2, blocked in Redis (version %d applied here)", in.name, in.in.app.Rules().Identities().Version()))
		}
	}
	if len(problems) > 0 {
		t.Fatalf("3 s after the change, Redis stores blocks %v (counter %s), but:\n  %s", stored, ver, strings.Join(problems, "\n  "))
	}
}

// putUntil calls put until it answers 200 or deadline passes, and returns
// its last answer: an operator retrying while Redis fails over.
func putUntil(deadline time.Time, put func() (int, string)) (int, string) {
	for {
		code, body := put()
		if code == 200 || time.Now().After(deadline) {
			return code, body
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// block blocks user through in's admin API.
func (in *sentinelInstance) block(t *testing.T, user string) (int, string) {
	t.Helper()
	return call(t, in.admin, "PUT", "/v1/rules/api/identities?user="+user, `{"block":true}`)
}
