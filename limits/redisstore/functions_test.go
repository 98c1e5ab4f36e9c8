package redisstore

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
	"github.com/rategate/rategate/lua"
)

// commandCalls returns the calls= of each INFO commandstats entry.
func commandCalls(t *testing.T, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// syncBuffer is a log destination the store's goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), sub)
}

// decideN runs n one-rule decisions on key (fixed_window, limit) and
// returns how many were admitted; every decision must succeed.
func decideN(t *testing.T, s *Store, key string, limit int64, n int) int {
	t.Helper()
	c := limits.Check{Key: key, Algorithm: limits.FixedWindow, Limit: limit, PeriodUS: storetest.SteadyPeriod(), Burst: limit, Cost: 1}
	admitted := 0
	for range n {
		var r [1]limits.Result
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ok, err := s.Decide(ctx, &limits.Batch{Checks: []limits.Check{c}}, r[:])
		cancel()
		if err != nil {
			t.Fatalf("decide %s: %v", key, err)
		}
		if ok {
			admitted++
		}
	}
	return admitted
}

// TestFunctionsDecideWithFCALL: a store on Redis 7 decides with FCALL of
// the library Warm loaded, and never with EVALSHA.
func TestFunctionsDecideWithFCALL(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)
	s, err := Open(Options{URL: "redis://" + srv.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Warm(testredis.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	libs, err := client.FunctionList(context.Background(), redis.FunctionListQuery{LibraryNamePattern: lua.Library().Name}).Result()
	if err != nil || len(libs) != 1 {
		t.Fatalf("FUNCTION LIST after Warm: %v %v, want the library %s", libs, err, lua.Library().Name)
	}
	if got := decideN(t, s, "rg:{fn:a}:fw", 5, 8); got != 5 {
		t.Fatalf("admitted %d of 8 with limit 5", got)
	}
	calls := commandCalls(t, client)
	if calls["fcall"] != 8 || calls["evalsha"] != 0 || calls["eval"] != 0 {
		t.Fatalf("commandstats fcall=%d evalsha=%d eval=%d, want 8 decisions by FCALL only", calls["fcall"], calls["evalsha"], calls["eval"])
	}
	if f, e := s.Functions(); f != 1 || e != 0 {
		t.Fatalf("Functions() = %d, %d, want 1 server on FCALL", f, e)
	}
}

// TestFunctionsReloadedAfterFlush: FUNCTION FLUSH (and a restart without
// data) takes the library away; the next decisions load it again and each
// decision counts exactly once.
func TestFunctionsReloadedAfterFlush(t *testing.T) {
	rs := testredis.StartControlled(t)
	s, err := Open(Options{URL: "redis://" + rs.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := decideN(t, s, "rg:{fn:b}:fw", 10, 3); got != 3 {
		t.Fatalf("admitted %d of 3", got)
	}
	admin := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer admin.Close()
	if n := commandCalls(t, admin)["function|load"]; n != 1 {
		t.Fatalf("FUNCTION LOAD ran %d times for the first decisions (no Warm), want once", n)
	}
	if err := admin.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.FunctionFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	// 3 used before the flush (the data stays): 7 left of 10.
	if got := decideN(t, s, "rg:{fn:b}:fw", 10, 9); got != 7 {
		t.Fatalf("after FUNCTION FLUSH: admitted %d of 9, want 7 (each decision once)", got)
	}
	if n := commandCalls(t, admin)["function|load"]; n != 1 {
		t.Fatalf("FUNCTION LOAD ran %d times after the flush, want once", n)
	}
	rs.RestartEmpty(t)
	admin2 := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer admin2.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c := limits.Check{Key: "rg:{fn:b}:fw", Algorithm: limits.FixedWindow, Limit: 10, PeriodUS: storetest.SteadyPeriod(), Burst: 10}
		var r [1]limits.Result
		if _, err := s.Decide(context.Background(), &limits.Batch{Checks: []limits.Check{c}}, r[:]); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no decision within 5s of the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := decideN(t, s, "rg:{fn:b}:fw", 10, 12); got != 10 {
		t.Fatalf("after a restart without data: admitted %d of 12, want the whole 10", got)
	}
	if calls := commandCalls(t, admin2); calls["function|load"] != 1 || calls["evalsha"] != 0 {
		t.Fatalf("after the restart: function|load=%d evalsha=%d, want the library loaded once and no EVALSHA", calls["function|load"], calls["evalsha"])
	}
}

// TestFunctionsFallBackToEvalsha: where the ACL forbids FCALL, or FUNCTION
// LOAD, the store decides with EVALSHA, exactly, and says so in one log
// line however many decisions follow.
func TestFunctionsFallBackToEvalsha(t *testing.T) {
	for _, tc := range []struct{ name, rules string }{
		{"no FCALL", "-fcall"},
		{"no FUNCTION LOAD", "-function"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testredis.Start(t)
			admin := srv.Client(t)
			if err := admin.Do(context.Background(), "ACL", "SETUSER", "rg", "on", ">pw", "~*", "&*", "+@all", tc.rules).Err(); err != nil {
				t.Fatal(err)
			}
			s, err := Open(Options{URL: "redis://" + srv.Addr, Username: "rg", Password: "pw"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var logs syncBuffer
			s.SetLogger(zerolog.New(&logs))
			if tc.rules == "-function" {
				// Warm finds out at once.
				if err := s.Warm(testredis.Ctx(t)); err != nil {
					t.Fatal(err)
				}
			}
			if got := decideN(t, s, "rg:{fn:c}:fw", 20, 30); got != 20 {
				t.Fatalf("admitted %d of 30 with limit 20", got)
			}
			calls := commandCalls(t, admin)
			if calls["evalsha"] < 30 || calls["fcall"] > 1 {
				t.Fatalf("commandstats evalsha=%d fcall=%d, want every decision by EVALSHA (at most the first FCALL refused)", calls["evalsha"], calls["fcall"])
			}
			if n := logs.count("Redis Functions are not available"); n != 1 {
				t.Fatalf("%d log lines about the fallback, want exactly 1:\n%s", n, logs.b.String())
			}
			if f, e := s.Functions(); f != 0 || e != 1 {
				t.Fatalf("Functions() = %d, %d, want 1 server on EVALSHA", f, e)
			}
		})
	}
}

// TestFunctionsOnEveryClusterPrimary: Warm loads the library on every
// primary; a primary that loses it (FUNCTION FLUSH) gets it back at its
// next decision, and decisions on every primary go by FCALL.
func TestFunctionsOnEveryClusterPrimary(t *testing.T) {
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	s := openClusterStore(t, c)
	if err := s.Warm(testredis.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	primaries, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range primaries {
		nc := testredis.NodeClient(t, p.Addr)
		libs, err := nc.FunctionList(context.Background(), redis.FunctionListQuery{LibraryNamePattern: lua.Library().Name}).Result()
		if err != nil || len(libs) != 1 {
			t.Fatalf("primary %s after Warm: %v %v, want the library", p.Addr, libs, err)
		}
		if err := nc.FunctionFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		if err := nc.ConfigResetStat(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	keys := keysOnEveryPrimary(t, c, "fnc", "fw")
	for _, k := range keys {
		if got := decideN(t, s, k, 4, 6); got != 4 {
			t.Fatalf("%s: admitted %d of 6 with limit 4", k, got)
		}
	}
	for _, p := range primaries {
		calls := commandCalls(t, testredis.NodeClient(t, p.Addr))
		if calls["function|load"] != 1 || calls["fcall"] < 6 || calls["evalsha"] != 0 {
			t.Fatalf("primary %s: function|load=%d fcall=%d evalsha=%d, want the library loaded again once and FCALL only",
				p.Addr, calls["function|load"], calls["fcall"], calls["evalsha"])
		}
	}
	if f, e := s.Functions(); f != len(primaries) || e != 0 {
		t.Fatalf("Functions() = %d, %d, want %d primaries on FCALL", f, e, len(primaries))
	}
}
