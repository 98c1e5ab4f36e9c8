package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// This file tests batches sent as one FCALL of DecideMany (sendMany).

// fwCall is a decide call of fixed_window checks, one per key, each of its
// limit per hour (keys and limits alternate: key, limit, key, limit...).
func fwCall(t *testing.T, ctx context.Context, checks ...any) *scriptCall {
	t.Helper()
	call := newCall(ctx)
	call.args = append(call.args, int64(0))
	for i := 0; i < len(checks); i += 2 {
		key, limit := checks[i].(string), int64(checks[i+1].(int))
		c := limits.Check{Key: key, Algorithm: limits.FixedWindow, Limit: limit, PeriodUS: limits.PeriodUS(time.Hour), Burst: limit, Cost: 1}
		var err error
		if call.args, err = appendCheckArgs(call.args, &c); err != nil {
			t.Fatal(err)
		}
		call.keys = append(call.keys, key)
	}
	return call
}

// warmStore is a store over opt's server, its library loaded, logging to
// log when set; cleanup closes it.
func warmStore(t *testing.T, opt *redis.Options, log *syncBuffer) *Store {
	t.Helper()
	s, err := New(redis.NewClient(opt), "redis")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if log != nil {
		s.SetLogger(zerolog.New(log))
	}
	if err := s.Warm(testredis.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	return s
}

// sameCalls is n decide calls of one fixed_window check on key.
func sameCalls(t *testing.T, ctx context.Context, n int, key string, limit int) []*scriptCall {
	t.Helper()
	var calls []*scriptCall
	for range n {
		calls = append(calls, fwCall(t, ctx, key, limit))
	}
	return calls
}

// firstErr is errs[0], or nil.
func firstErr(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return errs[0]
}

// sendBatch sends calls as one batch through the store's coalescer, as a
// runner does, and returns how many were admitted and the errors.
func sendBatch(t *testing.T, s *Store, calls []*scriptCall) (admitted int, errs []error) {
	t.Helper()
	s.co.send(s.co.client.Pipeline(), calls, nil)
	for _, call := range calls {
		reply, err, owned := call.wait()
		if !owned {
			t.Fatal("a call was abandoned")
		}
		if err == nil {
			r := make([]limits.Result, len(call.keys))
			var ok bool
			if ok, err = parseDecideReply(reply, r); ok && err == nil {
				admitted++
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
		call.release()
	}
	return admitted, errs
}

// TestBatchErrorIsOneCallers: a decision that fails inside a batch (its key
// holds a list) fails alone: its caller gets the error, the others their
// decisions.
func TestBatchErrorIsOneCallers(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)
	s := warmStore(t, &redis.Options{Addr: srv.Addr}, nil)
	if err := client.RPush(context.Background(), "bm:{x}:fw", "not a counter").Err(); err != nil {
		t.Fatal(err)
	}
	ctx := testredis.Ctx(t)
	var calls []*scriptCall
	for i := range 9 {
		key := "bm:{y}:fw"
		if i == 4 {
			key = "bm:{x}:fw"
		}
		calls = append(calls, fwCall(t, ctx, key, 5))
	}
	admitted, errs := sendBatch(t, s, calls)
	if admitted != 5 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "WRONGTYPE") {
		t.Fatalf("admitted %d, errors %v; want 5 of the 8 on the counter, and the list's WRONGTYPE alone", admitted, errs)
	}
}

// TestBatchAfterFlush: a batch that finds the library gone (FUNCTION FLUSH)
// loads it and is sent again; nothing ran the first time, so every
// decision counts once.
func TestBatchAfterFlush(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)
	s := warmStore(t, &redis.Options{Addr: srv.Addr}, nil)
	ctx := testredis.Ctx(t)
	if err := client.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if admitted, errs := sendBatch(t, s, sameCalls(t, ctx, 8, "bm:{f}:fw", 5)); admitted != 5 || len(errs) != 0 {
		t.Fatalf("admitted %d of 8 with limit 5, errors %v", admitted, errs)
	}
	if n := fwCountText(client, "bm:{f}:fw"); n != "5" {
		t.Fatalf("the counter holds %q, want 5", n)
	}
	if calls := commandCalls(t, client); calls["function|load"] != 1 {
		t.Fatalf("FUNCTION LOAD ran %d times, want once", calls["function|load"])
	}
}

// TestBatchWithoutFCALL: where the ACL forbids FCALL, a batch is sent
// again as one EVALSHA per decision, exactly, with the one log line.
func TestBatchWithoutFCALL(t *testing.T) {
	srv := testredis.Start(t)
	admin := srv.Client(t)
	ctx := testredis.Ctx(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "rg", "on", ">pw", "~*", "&*", "+@all", "-fcall").Err(); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	s := warmStore(t, &redis.Options{Addr: srv.Addr, Username: "rg", Password: "pw"}, &logs)
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if admitted, errs := sendBatch(t, s, sameCalls(t, ctx, 8, "bm:{e}:fw", 5)); admitted != 5 || len(errs) != 0 {
		t.Fatalf("admitted %d of 8 with limit 5, errors %v", admitted, errs)
	}
	if c := commandCalls(t, admin); c["evalsha"]+c["eval"] != 8 {
		t.Fatalf("commandstats evalsha=%d eval=%d, want the 8 decisions by script", c["evalsha"], c["eval"])
	}
	if n := logs.count("Redis Functions are not available"); n != 1 {
		t.Fatalf("%d log lines about the fallback, want 1", n)
	}
	// From then on a batch is one call of DecideManyScript: one EVALSHA
	// (Warm loaded the script); after a SCRIPT FLUSH, NOSCRIPT then EVAL,
	// which caches it again, and EVALSHA after that; each decided as one
	// by one.
	for i, want := range []map[string]int64{{"evalsha": 1, "eval": 0}, {"evalsha": 1, "eval": 1}, {"evalsha": 1, "eval": 0}} {
		if i == 1 {
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("bm:{e%d}:fw", i)
		if admitted, errs := sendBatch(t, s, sameCalls(t, ctx, 8, key, 5)); admitted != 5 || len(errs) != 0 {
			t.Fatalf("batch %d: admitted %d of 8 with limit 5, errors %v", i+2, admitted, errs)
		}
		if c := commandCalls(t, admin); c["evalsha"] != want["evalsha"] || c["eval"] != want["eval"] || c["fcall"] != 0 {
			t.Fatalf("batch %d: commandstats evalsha=%d eval=%d fcall=%d, want %v: the 8 decisions in one script call", i+2, c["evalsha"], c["eval"], c["fcall"], want)
		}
	}
}

// TestBatchOfManyShapes: one batch whose checks use several rules (limits
// 3, 5 and 7, and two-check requests) is decided as the same calls one by
// one would be: each counter admits exactly its limit, and a two-check
// request is admitted only while both of its counters allow it.
func TestBatchOfManyShapes(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)
	s := warmStore(t, &redis.Options{Addr: srv.Addr}, nil)
	ctx := testredis.Ctx(t)
	var calls []*scriptCall
	for range 8 {
		calls = append(calls, fwCall(t, ctx, "bm:{s3}:fw", 3), fwCall(t, ctx, "bm:{s5}:fw", 5), fwCall(t, ctx, "bm:{s7}:fw", 7),
			fwCall(t, ctx, "bm:{p}:a", 4, "bm:{p}:b", 2))
	}
	admitted, errs := sendBatch(t, s, calls)
	if len(errs) != 0 || admitted != 3+5+7+2 {
		t.Fatalf("admitted %d, %d errors (first: %v); want 17 (3 + 5 + 7, and 2 of the two-check requests)", admitted, len(errs), firstErr(errs))
	}
	// More shapes than manyArgs scans: limits 1 to 20 (as identity
	// overrides give), each key asked 21 times, mixed in one batch.
	calls = calls[:0]
	for round := range 21 {
		for limit := 1; limit <= 20; limit++ {
			calls = append(calls, fwCall(t, ctx, fmt.Sprintf("bm:{m%d}:fw", (limit+round)%20+1), (limit+round)%20+1))
		}
	}
	if admitted, errs := sendBatch(t, s, calls); len(errs) != 0 || admitted != 210 {
		t.Fatalf("20 shapes: admitted %d, %d errors (first: %v); want 210 (1 + 2 + ... + 20)", admitted, len(errs), firstErr(errs))
	}
	for key, want := range map[string]string{"bm:{s3}:fw": "3", "bm:{s5}:fw": "5", "bm:{s7}:fw": "7", "bm:{p}:a": "2", "bm:{p}:b": "2"} {
		if n := fwCountText(client, key); n != want {
			t.Errorf("%s counts %q, want %s", key, n, want)
		}
	}
}

// TestBatchOnClusterModeServer: a Redis Cluster node that holds every slot,
// reached as a single server (some managed Redis offers one), refuses a
// call across slots with CROSSSLOT before running it; the batch is then
// sent as one call per decision, and so is every batch after it, exactly.
func TestBatchOnClusterModeServer(t *testing.T) {
	srv := testredis.Start(t, "cluster-enabled yes", "cluster-config-file nodes.conf")
	admin := srv.Client(t)
	ctx := testredis.Ctx(t)
	if err := admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.HasPrefix(admin.ClusterInfo(ctx).Val(), "cluster_state:ok") {
		if time.Now().After(deadline) {
			t.Fatal("the one-node cluster is not ok after 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	s := warmStore(t, &redis.Options{Addr: srv.Addr}, nil)
	for round := range 2 {
		var calls []*scriptCall
		for i := range 6 {
			calls = append(calls, fwCall(t, ctx, fmt.Sprintf("bm:{c%d}:fw", i%3), 3))
		}
		// 3 keys of limit 3, each asked twice a round: 6 admitted, then 3
		want := []int{6, 3}[round]
		if admitted, errs := sendBatch(t, s, calls); admitted != want || len(errs) != 0 {
			t.Fatalf("round %d: admitted %d of 6, want %d; %d errors (first: %v)", round, admitted, want, len(errs), firstErr(errs))
		}
	}
	if s.co.many.Load() {
		t.Fatal("the store still batches across slots on a server that refuses it")
	}
	for i := range 3 {
		if n := fwCountText(admin, fmt.Sprintf("bm:{c%d}:fw", i)); n != "3" {
			t.Errorf("bm:{c%d}:fw counts %q, want 3", i, n)
		}
	}
}

// TestManyReplyFits: sendMany takes DecideMany's flat reply as the call's
// instant, then decision after decision one error, or 4 values for a bare
// decision (one check on the Redis clock), or 2 values and 4 per check,
// and refuses a reply without its instant or with a value too many or too
// few for its calls.
func TestManyReplyFits(t *testing.T) {
	ctx := context.Background()
	one, two := fwCall(t, ctx, "a", 5), fwCall(t, ctx, "b", 5, "c", 5)
	at := fwCall(t, ctx, "d", 5)
	at.args[0] = int64(1_000_000) // its own instant: not bare
	live := []*scriptCall{one, two, at, one}
	clock := []any{int64(1_796_000_000_000_000)}
	bare4 := []any{int64(1), int64(4), int64(9), int64(0)}
	ok6 := []any{int64(1), int64(7), int64(1), int64(4), int64(9), int64(0)}
	ok10 := append(append([]any{}, ok6...), int64(1), int64(3), int64(9), int64(0))
	var fail error = fmt.Errorf("WRONGTYPE x") // go-redis gives an error value (a redis.Error)
	cat := func(parts ...[]any) []any {
		var out []any
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for what, c := range map[string]struct {
		flat []any
		want bool
	}{
		"all decided":             {cat(clock, bare4, ok10, ok6, bare4), true},
		"an error each":           {cat(clock, []any{fail, fail, fail, fail}), true},
		"the middle failed":       {cat(clock, bare4, []any{fail}, ok6, bare4), true},
		"the last failed":         {cat(clock, bare4, ok10, ok6, []any{fail}), true},
		"no instant":              {cat(bare4, ok10, ok6, bare4), false},
		"an instant not a number": {cat([]any{"x"}, bare4, ok10, ok6, bare4), false},
		"a bare reply in full":    {cat(clock, ok6, ok10, ok6, bare4), false},
		"a full reply bare":       {cat(clock, bare4, ok10, bare4, bare4), false},
		"a value short":           {cat(clock, bare4, ok10, ok6, bare4[:3]), false},
		"a value too many":        {cat(clock, bare4, ok10, ok6, bare4, []any{int64(0)}), false},
		"a decision missing":      {cat(clock, bare4, ok10, ok6), false},
		"the instant alone":       {clock, false},
		"nothing":                 {nil, false},
	} {
		if got := manyReplyFits(c.flat, live); got != c.want {
			t.Errorf("%s: manyReplyFits %v, want %v", what, got, c.want)
		}
	}
}

// TestBatchBareReplies: a decision of one check on the Redis clock comes
// back from DecideMany as its check's four values alone, and sendMany
// hands its caller decide.lua's whole reply: admitted when allowed or when
// the check is a shadow, at the batch's instant. Shadow and enforced
// checks past their limit, a decision at its own instant and one of two
// checks share the batch.
func TestBatchBareReplies(t *testing.T) {
	srv := testredis.Start(t)
	s := warmStore(t, &redis.Options{Addr: srv.Addr}, nil)
	ctx := testredis.Ctx(t)
	type want struct{ admitted, allowed, remaining int64 }
	var calls []*scriptCall
	var wants []want
	for i := range 3 {
		calls = append(calls, fwCall(t, ctx, "bb:{s}:fw", 2))
		calls[len(calls)-1].args[6] = 1 // a shadow
		calls = append(calls, fwCall(t, ctx, "bb:{n}:fw", 2))
		left := int64(max(1-i, 0))
		wants = append(wants, want{1, b2i(i < 2), left}, want{b2i(i < 2), b2i(i < 2), left})
	}
	own := fwCall(t, ctx, "bb:{o}:fw", 2)
	own.args[0] = time.Now().UnixMicro() // its own instant: a full reply
	calls = append(calls, own, fwCall(t, ctx, "bb:{m}:fw", 2, "bb:{m2}:fw", 2))
	wants = append(wants, want{1, 1, 1}, want{1, 1, 1})
	client := srv.Client(t)
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixMicro()
	s.co.send(s.co.client.Pipeline(), calls, nil)
	if n := commandCalls(t, client)["fcall"]; n != 1 {
		t.Fatalf("%d FCALLs for one batch, want one of DecideMany", n)
	}
	var clock any
	for i, call := range calls {
		reply, err, owned := call.wait()
		if !owned || err != nil {
			t.Fatalf("call %d: owned %v, error %v", i, owned, err)
		}
		r, ok := reply.([]any)
		if !ok || len(r) != 2+4*len(call.keys) {
			t.Fatalf("call %d: reply %v, want decide.lua's for %d checks", i, reply, len(call.keys))
		}
		w := wants[i]
		if r[0] != w.admitted || r[2] != w.allowed || r[3] != w.remaining {
			t.Errorf("call %d (%v %v): reply %v, want admitted %d, allowed %d, remaining %d", i, call.keys, call.args, r, w.admitted, w.allowed, w.remaining)
		}
		switch {
		case i == 6:
			if r[1] != own.args[0] {
				t.Errorf("the call at its own instant %v was decided at %v", own.args[0], r[1])
			}
		case clock == nil:
			clock = r[1]
			if at, ok := clock.(int64); !ok || at < before-time.Minute.Microseconds() {
				t.Errorf("call %d decided at %v, not the Redis clock", i, clock)
			}
		case r[1] != clock:
			t.Errorf("call %d decided at %v, the batch's first at %v", i, r[1], clock)
		}
		call.release()
	}
}

// b2i is 1 for true, 0 for false.
func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// TestShadowedSpellings: every spelling of the shadow flag that reaches
// Redis as "1" (decide.lua's only shadow) is a shadow to sendMany too, and
// nothing else is: a bare denied check must not admit by one reading and
// deny by the other.
func TestShadowedSpellings(t *testing.T) {
	ctx := context.Background()
	client := testredis.Start(t).Client(t)
	for _, c := range []struct {
		v    any
		want bool
	}{{1, true}, {int64(1), true}, {true, true}, {"1", true},
		{0, false}, {int64(0), false}, {false, false}, {"0", false}, {2, false}, {"true", false}} {
		call := fwCall(t, ctx, "s", 5)
		call.args[len(call.args)-1] = c.v
		if got := shadowed(call); got != c.want {
			t.Errorf("shadow argument %#v: shadowed %v, want %v", c.v, got, c.want)
		}
		// what Redis receives
		got, err := client.Do(ctx, "ECHO", c.v).Text()
		if err != nil || (got == "1") != c.want {
			t.Errorf("shadow argument %#v reaches Redis as %q (%v)", c.v, got, err)
		}
	}
}
