package app

import (
	"context"
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/internal/testredis"
)

// hygieneYAML is a policy using every algorithm, costs, leases, an
// adaptive rule, several rules per request; longest period 2s (overrides
// below lengthen one to 3s).
func hygieneYAML(addr, prefix, signal string, gcPeriod string, slLimit int, extra string) string {
	return fmt.Sprintf(`redis:
  url: redis://%s/0
  key_prefix: %s
  timeout: 2s
identity:
  cost_header: X-Cost
  max_cost: 6
rules:
  - name: fw
    key: [user]
    algorithm: fixed_window
    limit: 12
    period: 2s
  - name: sw
    key: [user, route]
    algorithm: sliding_window
    limit: 8
    period: 1s
  - name: sl
    match: {path: /sl}
    key: [user]
    algorithm: sliding_log
    limit: %d
    period: 2s
  - name: gc
    key: [ip]
    algorithm: gcra
    limit: 10
    period: %s
    burst: 6
  - name: tb
    key: ["header:X-Plan"]
    algorithm: token_bucket
    limit: 20
    period: 2s
    burst: 6
  - name: lfw
    key: []
    algorithm: fixed_window
    limit: 300
    period: 1s
    lease: true
  - name: ltb
    match: {path: /tb}
    key: []
    algorithm: token_bucket
    limit: 40
    period: 1s
    burst: 20
    lease: true
  - name: lgc
    key: [route]
    algorithm: gcra
    limit: 30
    period: 1s
    burst: 12
    lease: true
  - name: lsw
    key: [host]
    algorithm: sliding_window
    limit: 60
    period: 2s
    lease: true
  - name: ad
    key: [user]
    algorithm: gcra
    limit: 10
    period: 1s
    burst: 8
    adaptive:
      http: {url: %s}
      steps: [{below: 50, factor: 1.5}, {factor: 0.5}]
      interval: 1s
      timeout: 500ms
      cooldown: 1s
      lease_ttl: 2s
%s`, addr, prefix, slLimit, gcPeriod, signal, extra)
}

type keyTTL struct {
	key string
	typ string
	ttl time.Duration // -1: none
}

func scanKeys(t *testing.T, srv *testredis.Server, prefix string) []keyTTL {
	t.Helper()
	c := srv.Client(t)
	ctx := context.Background()
	var out []keyTTL
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for n := 0; iter.Next(ctx) && n < 100000; n++ {
		k := iter.Val()
		ttl := c.PTTL(ctx, k).Val()
		if ttl == -2*time.Nanosecond || ttl == -2*time.Millisecond {
			continue
		}
		out = append(out, keyTTL{k, c.Type(ctx, k).Val(), ttl})
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

// TestRedisHygiene drives a randomized workload through a real
// App on a real Redis (every algorithm, costs, multi-rule requests denied
// by a later rule, leases, an adaptive rule, rule and identity overrides
// with TTLs, admin resets, reloads that change numbers and remove a rule)
// and then checks every key it left: none without a TTL but the few
// documented as such, none with a TTL beyond its record's end, and none
// left once the workload has stopped for longer than its longest period.
func TestRedisHygiene(t *testing.T) {
	srv := testredis.Start(t)
	prefix := fmt.Sprintf("hy%d", time.Now().UnixNano()%1_000_000_000)
	var load atomic.Int64
	load.Store(20)
	sig := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%d\n", load.Load())
	}))
	defer sig.Close()

	extra := `  - name: gone
    key: [user]
    algorithm: sliding_window
    limit: 5
    period: 2s
`
	path := filepath.Join(t.TempDir(), "rategate.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(hygieneYAML(srv.Addr, prefix, sig.URL, "1s", 6, extra))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, Options{Log: zerolog.Nop(), ConfigPath: path})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(cfg, Options{Log: zerolog.Nop(), ConfigPath: path})
	if err != nil {
		t.Fatal(err)
	}
	var closeOnce sync.Once
	closeApp := func() { closeOnce.Do(func() { a.Close(); b.Close() }) }
	t.Cleanup(closeApp)
	resetsReady(t, a)
	resetsReady(t, b)
	s := &stack{t: t, app: a, auth: serveOn(t, a.Handler()), admin: serveOn(t, a.AdminHandler())}
	s2 := &stack{t: t, app: b, auth: serveOn(t, b.Handler()), admin: serveOn(t, b.AdminHandler())}

	users := []string{"u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8", "u9", "u10", "u11", "u12", "a{b}", "x:y", "s p", "*", strings.Repeat("L", 300), "é\u0301", "\u00a0pad"}
	routes := []string{"/a", "/sl", "/tb", "/sl/x", "/b"}
	plans := []string{"free", "pro", "{team}", ""}
	hosts := []string{"h1.example", "h2.example", "h3.example", "h4.example", "h5.example", "h6.example"}
	rng := rand.New(rand.NewSource(7))
	codes := map[int]int{}
	var mu sync.Mutex
	ask := func() {
		kv := []string{
			"X-Original-URI", routes[rng.Intn(len(routes))],
			"X-Real-IP", fmt.Sprintf("192.0.2.%d", rng.Intn(250)+1),
			"X-Original-Host", hosts[rng.Intn(len(hosts))],
		}
		if u := users[rng.Intn(len(users))]; u != "" {
			kv = append(kv, "X-User-Id", u)
		}
		if p := plans[rng.Intn(len(plans))]; p != "" {
			p += fmt.Sprint(rng.Intn(40))
			kv = append(kv, "X-Plan", p)
		}
		if rng.Intn(3) == 0 {
			kv = append(kv, "X-Cost", fmt.Sprint(rng.Intn(6)+1))
		}
		var code int
		if rng.Intn(2) == 0 {
			code = s.ask(kv...)
		} else {
			code = s2.ask(kv...)
		}
		mu.Lock()
		codes[code]++
		mu.Unlock()
	}
	start := time.Now()
	step := 0
	phase := 0
	for time.Since(start) < 6*time.Second && step < 20000 {
		ask()
		step++
		if step%4 == 0 {
			time.Sleep(time.Millisecond)
		}
		el := time.Since(start)
		next := phase
		switch {
		case el > 4*time.Second:
			next = 4
		case el > 3*time.Second:
			next = 3
		case el > 2*time.Second:
			next = 2
		case el > time.Second:
			next = 1
		}
		if next == phase {
			continue
		}
		phase = next
		switch phase {
		case 1:
			s.api("PUT", "/v1/rules/sw/override", `{"period":"3s","limit":5,"ttl":"1500ms"}`, 200, nil)
			s.api("PUT", "/v1/rules/fw/identities?user=u1", `{"limit":40,"ttl":"1s"}`, 200, nil)
			s.api("PUT", "/v1/rules/gc/identities?ip=192.0.2.2", `{"block":true,"ttl":"1s"}`, 200, nil)
			load.Store(90)
		case 2:
			s.api("DELETE", "/v1/keys/fw?user=u2", "", 200, nil)
			s.api("DELETE", "/v1/keys/lfw", "", 200, nil)
			s.api("DELETE", "/v1/keys/ltb", "", 200, nil)
			s.api("DELETE", "/v1/keys/sl?user=u3", "", 200, nil)
			s.api("PUT", "/v1/rules/tb/override", `{"burst":3,"limit":10,"ttl":"1s"}`, 200, nil)
			s.api("PUT", "/v1/rules/lgc/override", `{"burst":4,"ttl":"800ms"}`, 200, nil)
		case 3:
			// reload: gc's period 1s -> 2s, sl's limit 6 -> 3, rule "gone" removed
			write(hygieneYAML(srv.Addr, prefix, sig.URL, "2s", 3, ""))
			if _, err := a.Reload("test"); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Reload("test"); err != nil {
				t.Fatal(err)
			}
			s.api("PUT", "/v1/rules/sw/identities?user=u2&route=/a", `{"exempt":true,"ttl":"700ms"}`, 200, nil)
		case 4:
			write(hygieneYAML(srv.Addr, prefix, sig.URL, "1s", 6, extra))
			if _, err := a.Reload("test"); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Reload("test"); err != nil {
				t.Fatal(err)
			}
			load.Store(10)
		}
	}
	t.Logf("%d requests in %v: %v", step, time.Since(start).Round(time.Millisecond), codes)
	if codes[500] > 0 || codes[503] > 0 {
		t.Errorf("the store failed: %v", codes)
	}

	persistent := func(k string) bool {
		rest := strings.TrimPrefix(k, prefix+":")
		return rest == "overrides" || rest == "{identities}" || rest == "{identities}:version" ||
			strings.HasPrefix(rest, "epoch") || rest == "{adaptive}"
	}
	// 1. While it runs: every key has a TTL, none beyond 2 x the
	// longest period (3s) and a little, except the top summaries (6 min,
	// docs/operations.md).
	var problems []string
	for _, k := range scanKeys(t, srv, prefix) {
		switch {
		case persistent(k.key):
		case strings.Contains(k.key, ":top:"):
			if k.ttl < 0 || k.ttl > 6*time.Minute+time.Second {
				problems = append(problems, fmt.Sprintf("%s (%s) PTTL %v", k.key, k.typ, k.ttl))
			}
		case k.ttl < 0:
			problems = append(problems, fmt.Sprintf("%s (%s) has no TTL", k.key, k.typ))
		case strings.HasSuffix(k.key, ":reset"):
			// a reset's stamp: the record's life at the reset and a second
			if k.ttl > 7500*time.Millisecond {
				problems = append(problems, fmt.Sprintf("%s (%s) PTTL %v, beyond 2 x the longest period and a second", k.key, k.typ, k.ttl))
			}
		case k.ttl > 6500*time.Millisecond:
			problems = append(problems, fmt.Sprintf("%s (%s) PTTL %v, beyond 2 x the longest period", k.key, k.typ, k.ttl))
		}
	}
	// 2. Stop; after 8 s nothing of the workload is left but the
	// documented persistent keys.
	closeApp()
	time.Sleep(8 * time.Second)
	var left []string
	for _, k := range scanKeys(t, srv, prefix) {
		if persistent(k.key) || strings.Contains(k.key, ":top:") {
			t.Logf("kept (documented): %s (%s) PTTL %v", k.key, k.typ, k.ttl)
			continue
		}
		left = append(left, fmt.Sprintf("%s (%s) PTTL %v", k.key, k.typ, k.ttl))
	}
	c := srv.Client(t)
	for _, h := range []string{prefix + ":overrides", prefix + ":{identities}", prefix + ":{adaptive}"} {
		t.Logf("%s: %v", h, c.HGetAll(context.Background(), h).Val())
	}
	if len(problems) > 0 {
		t.Errorf("while running, keys with no TTL or one beyond their record's end:\n  %s", strings.Join(problems, "\n  "))
	}
	if len(left) > 0 {
		t.Errorf("8 s after the workload stopped (longest period 3s), still stored:\n  %s", strings.Join(left, "\n  "))
	}
}
