package limits_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"
	"github.com/rategate/rategate/limits/storetest"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/redis/go-redis/v9"
)

func TestRuleMatches(t *testing.T) {
	base := limits.Request{Method: []byte("POST"), Route: []byte("/login"), Host: limits.AppendHost(nil, []byte("API.example.com")), Headers: limits.Hdrs{"X-Plan": "free"}}
	tests := []struct {
		name  string
		match limits.Match
		req   func(r *limits.Request)
		want  bool
	}{
		{"empty matches all", limits.Match{}, nil, true},
		{"prefix", limits.Match{PathPrefix: "/log"}, nil, true},
		{"prefix miss", limits.Match{PathPrefix: "/api"}, nil, false},
		{"regex", limits.Match{PathRegex: regexp.MustCompile(`^/users/[0-9]+$`)}, func(r *limits.Request) { r.Route = []byte("/users/42") }, true},
		{"regex miss", limits.Match{PathRegex: regexp.MustCompile(`^/users/[0-9]+$`)}, func(r *limits.Request) { r.Route = []byte("/users/x") }, false},
		{"method", limits.Match{Methods: []string{"GET", "POST"}}, nil, true},
		{"method miss", limits.Match{Methods: []string{"GET"}}, nil, false},
		{"host case-insensitive", limits.Match{Host: "api.example.com"}, nil, true},
		{"host miss", limits.Match{Host: "www.example.com"}, nil, false},
		{"header", limits.Match{Headers: []limits.HeaderMatch{{"X-Plan", []byte("free")}}}, nil, true},
		{"header miss", limits.Match{Headers: []limits.HeaderMatch{{"X-Plan", []byte("pro")}}}, nil, false},
		{"header absent", limits.Match{Headers: []limits.HeaderMatch{{"X-Other", []byte("")}}}, func(r *limits.Request) { r.Headers = nil }, false},
		{"all conditions", limits.Match{PathPrefix: "/login", Methods: []string{"POST"}, Host: "api.example.com"}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := base
			if tt.req != nil {
				tt.req(&req)
			}
			r := &limits.Rule{Match: tt.match}
			if got := r.Matches(&req); got != tt.want {
				t.Fatalf("Matches = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestLimiterDecide(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	login := &limits.Rule{Name: "login", Match: limits.Match{PathPrefix: "/login"}, Key: []limits.KeyPart{{Kind: limits.KeyIP}},
		Algorithm: limits.FixedWindow, Limit: 2, Period: time.Hour, Burst: 2, Cost: 1}
	user := &limits.Rule{Name: "user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Anonymous: limits.AnonymousSkip,
		Algorithm: limits.FixedWindow, Limit: 5, Period: time.Hour, Burst: 5, Cost: 1}
	l := limits.NewLimiter(store, "rg", []*limits.Rule{login, user})
	ctx := context.Background()
	now := storetest.WindowStart(time.Hour) + 1
	var d limits.Decision

	// No rule matches an anonymous request outside /login.
	if err := l.DecideAt(ctx, &limits.Request{Route: []byte("/"), IP: []byte("1.1.1.1")}, &d, now); err != nil {
		t.Fatal(err)
	}
	if !d.Admitted || len(d.Verdicts) != 0 {
		t.Fatalf("unmatched request: %+v", d)
	}
	// /login with a user: both rules.
	req := &limits.Request{Route: []byte("/login"), IP: []byte("1.1.1.1"), User: []byte("bob")}
	for i := 0; i < 2; i++ {
		if err := l.DecideAt(ctx, req, &d, now); err != nil {
			t.Fatal(err)
		}
		if !d.Admitted || len(d.Verdicts) != 2 {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	if err := l.DecideAt(ctx, req, &d, now); err != nil {
		t.Fatal(err)
	}
	if d.Admitted || d.Denier != 0 || d.Verdicts[d.Denier].Rule != login {
		t.Fatalf("third login not denied by login: %+v", d)
	}
	if v := d.Verdicts[1]; !v.Result.Allowed || v.Result.Remaining != 3 {
		t.Fatalf("user verdict on denial %+v, want allowed with 3 left (nothing consumed)", v.Result)
	}
	// Request cost overrides the rule's default.
	if err := l.DecideAt(ctx, &limits.Request{Route: []byte("/x"), User: []byte("bob"), Cost: 3}, &d, now); err != nil {
		t.Fatal(err)
	}
	if !d.Admitted || d.Verdicts[0].Cost != 3 || d.Verdicts[0].Result.Remaining != 0 {
		t.Fatalf("cost 3: %+v", d.Verdicts)
	}
	// SetRules swaps atomically; the new rule set applies to the next request.
	l.SetRules(nil)
	if err := l.DecideAt(ctx, req, &d, now); err != nil {
		t.Fatal(err)
	}
	if !d.Admitted || len(d.Verdicts) != 0 {
		t.Fatalf("after SetRules(nil): %+v", d)
	}
}

func TestDenierIsTheLatestRetry(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	short := &limits.Rule{Name: "short", Algorithm: limits.FixedWindow, Limit: 1, Period: time.Minute, Burst: 1, Cost: 1}
	long := &limits.Rule{Name: "long", Algorithm: limits.FixedWindow, Limit: 1, Period: time.Hour, Burst: 1, Cost: 1}
	l := limits.NewLimiter(store, "rg", []*limits.Rule{short, long})
	now := storetest.WindowStart(time.Hour) + 1
	var d limits.Decision
	for i := 0; i < 2; i++ {
		if err := l.DecideAt(context.Background(), &limits.Request{}, &d, now); err != nil {
			t.Fatal(err)
		}
	}
	if d.Admitted || d.Verdicts[d.Denier].Rule != long {
		t.Fatalf("denier %d, want the hourly rule (its quota returns last)", d.Denier)
	}
}

func TestLocalFallbackWhenRedisIsDown(t *testing.T) {
	// A real client aimed at a port where nothing listens: every call fails.
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(testredis.FreePort(t)),
		ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	rs, err := redisstore.New(dead, "dead")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	rule := &limits.Rule{Name: "r", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.FixedWindow, Limit: 10, Period: time.Hour, Burst: 10, Cost: 1}
	l := limits.NewLimiter(rs, "rg", []*limits.Rule{rule})
	var d limits.Decision
	req := &limits.Request{IP: []byte("192.0.2.9")}
	if err := l.Decide(context.Background(), req, &d); err == nil {
		t.Fatal("no error from a store that cannot connect")
	}

	if !d.Undecided || !d.Admitted {
		t.Fatalf("without a fallback the failure mode (allow) answers: %+v", d)
	}

	local := memstore.New()
	defer local.Close()
	l = limits.New(limits.Options{Store: rs, Prefix: "rg", Rules: []*limits.Rule{rule}, Fallback: local, LocalShare: 2, FailureMode: limits.FailLocal})
	// the next hour's window: the memory store expires records on the
	// real clock, and this one's count must outlive the test (it once
	// crossed the hour, and all 10 were admitted)
	now := storetest.WindowStart(time.Hour) + limits.PeriodUS(time.Hour) + 1
	admitted := 0
	for i := 0; i < 10; i++ {
		if err := l.DecideAt(context.Background(), req, &d, now); err == nil || d.Undecided {
			t.Fatalf("err %v, undecided %v: want the store error and a local decision", err, d.Undecided)
		}
		if !d.Local {
			t.Fatal("decision not marked local")
		}
		if d.Admitted {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("local fallback with share 2 admitted %d of 10, want 5 (limit 10 / 2)", admitted)
	}
}
