package policy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"
)

// TestParseIdentityOverride: every problem is named by its field; exempt
// and block stand alone.
func TestParseIdentityOverride(t *testing.T) {
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		body string
		want []string // problems, or nil for a valid body
	}{
		{`{"limit":1000,"reason":"plan","ttl":"30d"}`, nil},
		{`{"exempt":true}`, nil},
		{`{"block":true,"ttl":"1h"}`, nil},
		{`{"factor":2,"period":"1m","burst":5}`, nil},
		{`{"exempt":true,"block":true}`, []string{"exempt, block: give one of them, not both"}},
		{`{"exempt":true,"limit":5}`, []string{"limit: cannot go with exempt"}},
		{`{"block":true,"factor":2,"period":"1m"}`, []string{"factor: cannot go with block", "period: cannot go with block"}},
		{`{"exempt":false}`, []string{`body: give limit, period, burst or factor, or "exempt": true, or "block": true`}},
		{`{}`, []string{"body: give limit"}},
		{`{"ttl":"1h"}`, []string{"body: give limit"}},
		{`{"limit":0}`, []string{"limit: must be >= 1, got 0"}},
		{`{"limit":1.5}`, []string{"limit: must be a whole number, got 1.5"}},
		{`{"exempt":"yes"}`, []string{`exempt: must be true or false, got "yes"`}},
		{`{"ttl":"401d","block":true}`, []string{"ttl: must be >= 1ms and <= 400d, got 401d"}},
		{`{"ttl":"-1h","block":true}`, []string{"ttl: must be >= 1ms"}},
		{`{"block":true,"reason":"` + strings.Repeat("x", 201) + `"}`, []string{"reason: must be at most 200 bytes, got 201"}},
		{`{"lmit":5}`, []string{"lmit: unknown field; use limit, period, burst, factor, exempt, block, reason or ttl"}},
		{`[1]`, []string{"body: must be a JSON object"}},
		{`null`, []string{"body: must be a JSON object"}},
		{`{"block":true}{"exempt":true}`, []string{"body: must hold exactly one JSON object"}},
		{`{"block":true} x`, []string{"body: must hold exactly one JSON object"}},
		{`{"block":true}}`, []string{"body: must hold exactly one JSON object"}},
		{`{"block":true}]]`, []string{"body: must hold exactly one JSON object"}},
		{"{\"block\":true} \n\t", nil},
		{`"limit"`, []string{"body: must be a JSON object such as"}},
		{`{"limit":5`, []string{"body: must be a JSON object such as"}},
		// a map would keep the last copy in silence
		{`{"limit":5,"limit":1000000}`, []string{"limit: given twice"}},
		{`{"block":false,"limit":5,"block":true}`, []string{"block: given twice"}},
	} {
		o, err := ParseIdentityOverride([]byte(c.body), now)
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: %v", c.body, err)
			} else if !o.SetAt.Equal(now) {
				t.Errorf("%s: set_at %v", c.body, o.SetAt)
			}
			continue
		}
		var fe FieldErrors
		if !errors.As(err, &fe) {
			t.Errorf("%s: error %v, want FieldErrors", c.body, err)
			continue
		}
		if len(fe) != len(c.want) {
			t.Errorf("%s: %d problems %q, want %d", c.body, len(fe), fe, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.HasPrefix(fe[i], w) {
				t.Errorf("%s: problem %q, want it to start with %q", c.body, fe[i], w)
			}
		}
	}
	o, _ := ParseIdentityOverride([]byte(`{"block":true,"ttl":"1h"}`), now)
	if o.ExpiresAt == nil || !o.ExpiresAt.Equal(now.Add(time.Hour)) || o.action() != limits.IdentityBlock {
		t.Fatalf("block with ttl: %+v", o)
	}
}

const identitiesConfig = `
rules:
  - name: api
    key: [user]
    algorithm: sliding_log
    limit: 3
    period: 1h
    exceptions:
      - match: {user: bigco}
        limit: 6
        reason: plan
      - match: {user: monitor}
        exempt: true
  - name: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 100
    period: 1h
    exceptions:
      - match: {ip: 10.0.0.0/8}
        exempt: true
`

// idInstance is one rategate's policy part: a limiter over its own memory
// store (the counting is not what these tests check) and a manager.
type idInstance struct {
	t       *testing.T
	limiter *limits.Limiter
	m       *Manager
	ids     *Identities
}

func newIDInstance(t *testing.T, yaml string, store IdentityStore, rules OverrideStore, max int) *idInstance {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	mem := memstore.New()
	t.Cleanup(func() { mem.Close() })
	l := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: cfg.Rules, DenyCache: limits.NewDenyCache(1000)})
	m := NewManager(ManagerOptions{Config: cfg, Limiter: l, Overrides: rules, Identities: store, MaxIdentities: max,
		Log: zerolog.Nop(), SyncEvery: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { m.Run(ctx); done <- struct{}{} }()
	go func() { m.Identities().Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	return &idInstance{t: t, limiter: l, m: m, ids: m.Identities()}
}

func user(u string) *limits.Request { return &limits.Request{User: []byte(u)} }

func netipAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// admits sends n requests of u and counts the admitted ones.
func (in *idInstance) admits(u string, n int) int {
	in.t.Helper()
	got := 0
	for i := 0; i < n; i++ {
		var d limits.Decision
		if err := in.limiter.Decide(context.Background(), user(u), &d); err != nil {
			in.t.Fatal(err)
		}
		if d.Admitted {
			got++
		}
	}
	return got
}

// applied returns the action and limit the limiter applies to u under api.
func (in *idInstance) applied(u string) (limits.IdentityAction, int64) {
	e, ok := in.limiter.Identity(in.limiter.Rule("api"), user(u))
	if !ok {
		return limits.IdentityNone, in.limiter.Rule("api").Limit
	}
	return e.Rule.Identity, e.Rule.Limit
}

func (in *idInstance) set(u, body string) (IdentityView, error) {
	return in.ids.Set(context.Background(), "api", map[string]string{"user": u}, user(u), []byte(body), "test")
}

// TestIdentitiesInProcess: with the memory stores, runtime overrides win
// over the file's exceptions and reveal them when deleted, follow rule
// overrides, are listed with their source, and are capped.
func TestIdentitiesInProcess(t *testing.T) {
	in := newIDInstance(t, identitiesConfig, nil, nil, 3)
	if a, l := in.applied("bigco"); a != limits.IdentityLimit || l != 6 {
		t.Fatalf("bigco from the file: %v %d", a, l)
	}
	if got := in.admits("monitor", 10); got != 10 {
		t.Fatalf("monitor: %d of 10, want exempt", got)
	}
	// A runtime override hides the exception, and shows it when deleted.
	v, err := in.set("bigco", `{"block":true,"reason":"abuse"}`)
	if err != nil || v.Action != "block" || v.Source != "runtime" || v.Hides == nil || v.Hides.Source != "config" || v.SetBy != "test" {
		t.Fatalf("set: %+v %v", v, err)
	}
	if got := in.admits("bigco", 2); got != 0 {
		t.Fatalf("blocked bigco: %d admitted", got)
	}
	now, err := in.ids.Delete(context.Background(), "api", user("bigco"))
	if err != nil || now == nil || now.Source != "config" || now.Limit != 6 {
		t.Fatalf("delete: %+v %v", now, err)
	}
	if got := in.admits("bigco", 10); got != 6 {
		t.Fatalf("bigco after the delete: %d admitted, want the exception's 6", got)
	}
	if _, err := in.ids.Delete(context.Background(), "api", user("bigco")); !errors.Is(err, ErrNoIdentityOverride) {
		t.Fatalf("second delete: %v", err)
	}
	// Own numbers follow the rule in force: a factor scales the rule's
	// override, a limit stays what it says.
	if _, err := in.set("double", `{"factor":2}`); err != nil {
		t.Fatal(err)
	}
	if _, err := in.set("fixed", `{"limit":5}`); err != nil {
		t.Fatal(err)
	}
	if _, err := in.m.SetOverride(context.Background(), "api", []byte(`{"limit":10}`)); err != nil {
		t.Fatal(err)
	}
	if _, l := in.applied("double"); l != 20 {
		t.Fatalf("factor 2 over a rule override of 10: %d", l)
	}
	if _, l := in.applied("fixed"); l != 5 {
		t.Fatalf("limit 5 over a rule override of 10: %d", l)
	}
	// An override that no longer fits the rule is kept, listed with why,
	// and not applied.
	if _, err := in.set("big", `{"factor":1000}`); err != nil {
		t.Fatal(err)
	}
	if _, l := in.applied("big"); l != 10000 {
		t.Fatalf("factor 1000 of 10: %d", l)
	}
	if _, err := in.m.SetOverride(context.Background(), "api", []byte(`{"limit":11}`)); err != nil {
		t.Fatal(err)
	}
	if act, l := in.applied("big"); act != limits.IdentityNone || l != 11 {
		t.Fatalf("factor 1000 of 11 is over sliding_log's cap, want the rule's 11: %v %d", act, l)
	}
	// The cap: 3 stored (double, fixed, big); a fourth is refused, a change is not.
	var capErr *limits.IdentityCapError
	if _, err := in.set("fourth", `{"limit":2}`); !errors.As(err, &capErr) {
		t.Fatalf("over the cap: %v", err)
	}
	if _, err := in.set("fixed", `{"limit":4}`); err != nil {
		t.Fatalf("change at the cap: %v", err)
	}
	l, err := in.ids.List("api", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, v := range l.Identities {
		ids = append(ids, v.ID+"/"+v.Source)
	}
	if got := strings.Join(ids, " "); got != "big/runtime bigco/config double/runtime fixed/runtime monitor/config" || l.Runtime != 3 || l.Config != 2 || l.Max != 3 {
		t.Fatalf("list: %s (runtime %d config %d max %d)", got, l.Runtime, l.Config, l.Max)
	}
	if e := l.Identities[0].Error; !strings.Contains(e, "does not fit the rule as it now stands: limit: must be <= 10000 for sliding_log, got 11000") {
		t.Fatalf("big's error %q", e)
	}
	if l.Identities[3].Effective == nil || l.Identities[3].Effective.Limit != 4 || l.Identities[3].Error != "" {
		t.Fatalf("fixed: %+v", l.Identities[3])
	}
	page, _ := in.ids.List("api", "bigco", 2)
	if len(page.Identities) != 2 || page.Identities[0].ID != "double" || page.Next != "fixed" {
		t.Fatalf("page after bigco: %+v next %q", page.Identities, page.Next)
	}
	// Ranges: listed, and found for an address inside.
	if v, ok := in.ids.Lookup("per-ip", &limits.Request{IP: []byte("10.1.2.3"), Addr: netipAddr("10.1.2.3")}); !ok || v.Action != "exempt" || v.ID != "10.0.0.0/8" {
		t.Fatalf("range lookup: %+v %v", v, ok)
	}
	if _, ok := in.ids.Lookup("per-ip", &limits.Request{IP: []byte("192.0.2.1"), Addr: netipAddr("192.0.2.1")}); ok {
		t.Fatal("an address outside the range found an exception")
	}
}

// TestIdentitiesAcrossInstances: two instances share one real Redis. A
// change through one applies on the other within a second; a change the
// announcement of which is lost is found by the counter check; Redis
// losing its data is noticed; an override ends at its TTL on both and is
// deleted from the store.
func TestIdentitiesAcrossInstances(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)
	prefix := fmt.Sprintf("tp%d", time.Now().UnixNano()%1e9)
	store := func() IdentityStore { return redisstore.NewIdentities(client, prefix) }
	a := newIDInstance(t, identitiesConfig, store(), redisstore.NewOverrides(client, prefix), 100)
	b := newIDInstance(t, identitiesConfig, store(), redisstore.NewOverrides(client, prefix), 100)
	waitFor := func(what string, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > 2*time.Second {
				t.Fatalf("%s: not within 2s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(start)
	}
	if _, err := a.set("acme", `{"limit":50}`); err != nil {
		t.Fatal(err)
	}
	if act, l := a.applied("acme"); act != limits.IdentityLimit || l != 50 {
		t.Fatalf("a applies its own change at once: %v %d", act, l)
	}
	took := waitFor("b applies a's override", func() bool { _, l := b.applied("acme"); return l == 50 })
	t.Logf("b applied the override %v after a's PUT returned", took)
	if _, err := b.ids.Delete(context.Background(), "api", user("acme")); err != nil {
		t.Fatal(err)
	}
	waitFor("a applies b's delete", func() bool { act, _ := a.applied("acme"); return act == limits.IdentityNone })

	// A change whose announcement is lost: written and counted, not published.
	hash, counter, _ := redisstore.NewIdentities(client, prefix).Keys()
	ctx := context.Background()
	raw := `{"identity":{"user":"quiet"},"key":["user"],"exempt":true,"set_at":"2026-01-01T00:00:00Z"}`
	if err := client.HSet(ctx, hash, "api quiet", raw).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.Incr(ctx, counter).Err(); err != nil {
		t.Fatal(err)
	}
	took = waitFor("the counter check finds the silent change", func() bool {
		x, _ := a.applied("quiet")
		y, _ := b.applied("quiet")
		return x == limits.IdentityExempt && y == limits.IdentityExempt
	})
	t.Logf("a change without announcement applied on both after %v", took)

	// A TTL ends the override on both, and it leaves the store.
	if _, err := a.set("brief", `{"block":true,"ttl":"300ms"}`); err != nil {
		t.Fatal(err)
	}
	waitFor("b blocks brief", func() bool { x, _ := b.applied("brief"); return x == limits.IdentityBlock })
	if got := b.admits("brief", 1); got != 0 {
		t.Fatal("b admits a blocked identity")
	}
	time.Sleep(320 * time.Millisecond)
	if got := a.admits("brief", 1) + b.admits("brief", 1); got != 2 {
		t.Fatalf("after the TTL: %d of 2 admitted", got)
	}
	waitFor("the expired override leaves the store", func() bool {
		n, _ := client.HExists(ctx, hash, "api brief").Result()
		return !n
	})

	// Many overrides expiring at once keep neither instance from hearing
	// the next change.
	for i := 0; i < 50; i++ {
		if _, err := a.set(fmt.Sprintf("short-%d", i), `{"exempt":true,"ttl":"200ms"}`); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(400 * time.Millisecond) // expired; a retirement tick has begun
	if _, err := a.set("next", `{"limit":9}`); err != nil {
		t.Fatal(err)
	}
	if took := waitFor("b hears a change while retiring", func() bool { _, l := b.applied("next"); return l == 9 }); took > time.Second {
		t.Fatalf("b applied the change %v later", took)
	}
	waitFor("the expired ones leave the store", func() bool {
		n, _ := client.HLen(ctx, hash).Result()
		return n == 2 // quiet, next
	})

	// Redis loses its data: both notice and drop what was stored there.
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor("both drop the lost overrides", func() bool {
		x, _ := a.applied("quiet")
		y, _ := b.applied("quiet")
		return x == limits.IdentityNone && y == limits.IdentityNone
	})
	// And the file's exceptions stay.
	if act, l := b.applied("bigco"); act != limits.IdentityLimit || l != 6 {
		t.Fatalf("exception after the loss: %v %d", act, l)
	}
	// A new change after the loss starts the counter again; both apply it.
	if _, err := b.set("again", `{"limit":7}`); err != nil {
		t.Fatal(err)
	}
	waitFor("a applies a change after the loss", func() bool { _, l := a.applied("again"); return l == 7 })
}

// TestIdentitiesGap: an announcement whose version skips one makes the
// listener read everything, so the change it missed applies too.
func TestIdentitiesGap(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)
	prefix := fmt.Sprintf("tg%d", time.Now().UnixNano()%1e9)
	a := newIDInstance(t, identitiesConfig, redisstore.NewIdentities(client, prefix), nil, 100)
	hash, counter, channel := redisstore.NewIdentities(client, prefix).Keys()
	ctx := context.Background()
	// Version 1 stored but never announced; version 2 announced.
	one := `{"identity":{"user":"one"},"key":["user"],"block":true,"set_at":"2026-01-01T00:00:00Z"}`
	two := `{"identity":{"user":"two"},"key":["user"],"exempt":true,"set_at":"2026-01-01T00:00:00Z"}`
	client.HSet(ctx, hash, "api one", one, "api two", two)
	client.Set(ctx, counter, 2, 0)
	if err := client.Publish(ctx, channel, "2\napi two\n"+two).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		x, _ := a.applied("one")
		y, _ := a.applied("two")
		if x == limits.IdentityBlock && y == limits.IdentityExempt {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a gap: one %v two %v", x, y)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if a.ids.Version() != 2 {
		t.Fatalf("version %d, want 2", a.ids.Version())
	}
}

// TestParseOverrideFieldTwice: a rule override's field given twice is a
// problem, not the last copy winning (encoding/json's map would keep it).
func TestParseOverrideFieldTwice(t *testing.T) {
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	_, err := ParseOverride([]byte(`{"limit":5,"period":"1m","limit":1000000}`), now)
	var fe FieldErrors
	if !errors.As(err, &fe) || len(fe) != 1 || fe[0] != "limit: given twice" {
		t.Fatalf("limit twice: %v, want the one problem %q", err, "limit: given twice")
	}
	for _, body := range []string{`{"limit":5} {}`, `{"limit":5}}`, `{"limit":5}]`} {
		if _, err := ParseOverride([]byte(body), now); err == nil || !strings.Contains(err.Error(), "exactly one JSON object") {
			t.Fatalf("%s: %v, want a body of more than one object refused", body, err)
		}
	}
	if o, err := ParseOverride([]byte(` {"limit":5,"period":"1m"} `), now); err != nil || o.Limit != 5 {
		t.Fatalf("a valid body: %+v, %v", o, err)
	}
}
