package redisstore

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/rategate/rategate/internal/race"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
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
		c := limits.Check{Key: key, Algorithm: limits.FixedWindow, Limit: limit, PeriodUS: storetest.SteadyPeriod(), Burst: limit, Cost: 1}
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
	s.co.send(s.co.client.Pipeline(), calls, nil, &manyScratch{})
	for _, call := range calls {
		reply, err, owned := call.wait()
		if !owned {
			t.Fatal("a call was abandoned")
		}
		if err == nil {
			r := make([]limits.Result, len(call.keys))
			var adm int64
			if adm, _, err = callResults(call, reply, r); adm == 1 && err == nil {
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

// TestReadMany: readMany takes DecideMany's flat reply as the call's
// instant, then decision after decision one error, or per check two values
// when it allowed and three when it denied, and gives each call its
// decision in decide.lua's order: admitted when no check that is not a
// shadow denied, at the batch's instant or its own. It refuses a reply
// without its instant, with a value too many or too few for its calls, or
// with a value that is not a number.
func TestReadMany(t *testing.T) {
	ctx := context.Background()
	one, two := fwCall(t, ctx, "a", 5), fwCall(t, ctx, "b", 5, "c", 5)
	shadow := fwCall(t, ctx, "s", 5, "t", 5)
	shadow.args[len(shadow.args)-1] = 1 // its second check is a shadow
	own := fwCall(t, ctx, "d", 5)
	own.args[0] = int64(1_000_000) // its own instant
	live := []*scriptCall{one, two, shadow, own}
	const clock = int64(1_796_000_000_000_000)
	allowed := []any{int64(4), int64(9)}           // remaining 4, reset 9
	denied := []any{int64(-1), int64(9), int64(7)} // remaining 0, reset 9, retry 7
	var fail error = fmt.Errorf("WRONGTYPE x")     // go-redis gives an error value (a redis.Error)
	cat := func(parts ...[]any) []any {
		out := []any{clock}
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	full := cat(allowed, allowed, denied, allowed, denied, allowed)
	if err := readMany(full, live); err != nil {
		t.Fatal(err)
	}
	for i, want := range [][]int64{
		{1, clock, 1, 4, 9, 0},
		{0, clock, 1, 4, 9, 0, 0, 0, 9, 7},
		{1, clock, 1, 4, 9, 0, 0, 0, 9, 7}, // the denial is a shadow's
		{1, 1_000_000, 1, 4, 9, 0},
	} {
		if !slices.Equal(live[i].vals, want) || live[i].err != nil {
			t.Errorf("call %d: %v (%v), want %v", i, live[i].vals, live[i].err, want)
		}
	}
	if err := readMany(cat(allowed, []any{fail}, []any{fail}, allowed), live); err != nil || two.err == nil || shadow.err == nil ||
		one.err != nil || own.err != nil {
		t.Errorf("errors of the middle two: %v; errors %v %v %v %v", err, one.err, two.err, shadow.err, own.err)
	}
	for what, flat := range map[string][]any{
		"no instant":              full[1:],
		"an instant not a number": append([]any{"x"}, full[1:]...),
		"a value short":           full[:len(full)-1],
		"a value too many":        append(slices.Clone(full), int64(0)),
		"a decision missing":      cat(allowed, allowed, denied, allowed, denied),
		"a value not a number":    cat(allowed, allowed, denied, []any{"4", int64(9)}, denied, allowed),
		"the instant alone":       {clock},
		"nothing":                 nil,
	} {
		if err := readMany(flat, live); err == nil {
			t.Errorf("%s: readMany took it", what)
		}
	}
}

// TestBatchReplies: a batch's decisions come back from DecideMany compact
// (per check two or three values), and each caller gets decide.lua's whole
// decision: admitted when allowed or when the denying check is a shadow, at
// the batch's instant or its own. Shadow and enforced checks past their
// limit, a decision at its own instant and one of two checks share the
// batch.
func TestBatchReplies(t *testing.T) {
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
	own.args[0] = time.Now().UnixMicro() // its own instant
	calls = append(calls, own, fwCall(t, ctx, "bb:{m}:fw", 2, "bb:{m2}:fw", 2))
	wants = append(wants, want{1, 1, 1}, want{1, 1, 1})
	client := srv.Client(t)
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixMicro()
	s.co.send(s.co.client.Pipeline(), calls, nil, &manyScratch{})
	if n := commandCalls(t, client)["fcall"]; n != 1 {
		t.Fatalf("%d FCALLs for one batch, want one of DecideMany", n)
	}
	var clock int64
	for i, call := range calls {
		reply, err, owned := call.wait()
		if !owned || err != nil {
			t.Fatalf("call %d: owned %v, error %v", i, owned, err)
		}
		r := make([]limits.Result, len(call.keys))
		adm, at, err := callResults(call, reply, r)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		w := wants[i]
		if adm != w.admitted || b2i(r[0].Allowed) != w.allowed || r[0].Remaining != w.remaining {
			t.Errorf("call %d (%v %v): admitted %d, %+v, want admitted %d, allowed %d, remaining %d", i, call.keys, call.args, adm, r[0],
				w.admitted, w.allowed, w.remaining)
		}
		switch {
		case i == 6:
			if at != own.args[0] {
				t.Errorf("the call at its own instant %v was decided at %v", own.args[0], at)
			}
		case clock == 0:
			clock = at
			if clock < before-time.Minute.Microseconds() {
				t.Errorf("call %d decided at %v, not the Redis clock", i, clock)
			}
		case at != clock:
			t.Errorf("call %d decided at %v, the batch's first at %v", i, at, clock)
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
// Redis as "1" (decide.lua's only shadow) is a shadow to readMany too, and
// nothing else is: a denied check must not admit by one reading and deny
// by the other.
func TestShadowedSpellings(t *testing.T) {
	ctx := context.Background()
	client := testredis.Start(t).Client(t)
	for _, c := range []struct {
		v    any
		want bool
	}{{1, true}, {int64(1), true}, {true, true}, {"1", true},
		{0, false}, {int64(0), false}, {false, false}, {"0", false}, {2, false}, {"true", false}} {
		if got := isOne(c.v); got != c.want {
			t.Errorf("shadow argument %#v: isOne %v, want %v", c.v, got, c.want)
		}
		// what Redis receives
		got, err := client.Do(ctx, "ECHO", c.v).Text()
		if err != nil || (got == "1") != c.want {
			t.Errorf("shadow argument %#v reaches Redis as %q (%v)", c.v, got, err)
		}
	}
}

// TestManyArgsAllocs: a runner's scratch builds a batch's DecideMany
// arguments without allocating once warm: keys and arguments reuse its
// slices, and a decision's number, with its held checks' bits, is boxed
// once (go-redis copies both into its command).
func TestManyArgsAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts differ under the race detector")
	}
	ctx := context.Background()
	var live []*scriptCall
	for i := range 16 {
		live = append(live, fwCall(t, ctx, fmt.Sprintf("u%d", i), 5, fmt.Sprintf("r%d", i%3), 50, "g", 500))
	}
	var m manyScratch
	if _, args, ok := m.args(live); !ok || len(args) == 0 {
		t.Fatal("not taken as decide calls")
	}
	if n := testing.AllocsPerRun(100, func() { _, _, _ = m.args(live) }); n != 0 {
		t.Fatalf("building a warm batch's arguments allocates %v times, want 0", n)
	}
	// A limit per identity: each decision its own combination, more than
	// a scan takes (the combinations are then found through a map).
	var own []*scriptCall
	for i := range 16 {
		own = append(own, fwCall(t, ctx, fmt.Sprintf("o%d", i), 5+i, fmt.Sprintf("r%d", i%3), 50, "g", 500))
	}
	if n := testing.AllocsPerRun(100, func() { _, _, _ = m.args(own) }); n != 0 {
		t.Fatalf("a warm batch of 16 combinations allocates %v times, want 0", n)
	}
}

// TestManyArgsHolds: a batch names each shape and each combination of
// shapes once, and marks a check's key as held in every decision on the
// Redis clock that names a key another decision names too; never a
// sliding_log key, none past maxHeldChecks, and none at all when a
// decision of the batch is at its own instant (DecideMany would not hold
// its keys, and the two must not see different records).
func TestManyArgsHolds(t *testing.T) {
	ctx := context.Background()
	sl := func(call *scriptCall, i int) *scriptCall {
		call.args[1+6*i] = limits.SlidingLog.Code()
		return call
	}
	live := []*scriptCall{
		fwCall(t, ctx, "u1", 5, "r1", 50, "g", 500),
		fwCall(t, ctx, "u2", 5, "r2", 50, "g", 500),
		fwCall(t, ctx, "u3", 5, "r1", 50, "g", 500),
		fwCall(t, ctx, "g", 500),
		sl(fwCall(t, ctx, "s", 5), 0),
		sl(fwCall(t, ctx, "s", 5), 0),
	}
	var m manyScratch
	keys, args, ok := m.args(live)
	if !ok {
		t.Fatal("not taken as decide calls")
	}
	if want := []string{"u1", "r1", "g", "u2", "r2", "g", "u3", "r1", "g", "g", "s", "s"}; !slices.Equal(keys, want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	// m, r, c; shapes: fw 5, fw 50, fw 500, sl 5; combinations: (1 2 3), (3), (4)
	if head := args[:3]; !slices.Equal(head, []any{6, 4, 3}) {
		t.Fatalf("m, r, c = %v, want 6, 4, 3", head)
	}
	combos := args[3+6*4 : 3+6*4+4+2+2]
	if want := []any{3, 1, 2, 3, 1, 3, 1, 4}; !slices.Equal(combos, want) {
		t.Fatalf("combinations %v, want %v", combos, want)
	}
	const c1, c2, c3 = 1, 2, 3
	bits := func(combo int64, held ...int) int64 {
		for _, i := range held {
			combo |= 1 << (16 + i)
		}
		return combo
	}
	want := []any{bits(c1, 1, 2), bits(c1, 2), bits(c1, 1, 2), bits(c2, 0), bits(c3), bits(c3)}
	if got := args[len(args)-6:]; !slices.Equal(got, want) {
		t.Fatalf("decisions %v, want %v (route r1 and the global key held, not the sliding_log key)", got, want)
	}

	// One decision at its own instant: nothing held.
	live[1].args[0] = int64(1_000_000)
	_, args, _ = m.args(live)
	want = []any{bits(c1), int64(-c1), int64(1_000_000), bits(c1), bits(c2), bits(c3), bits(c3)}
	if got := args[len(args)-7:]; !slices.Equal(got, want) {
		t.Fatalf("with a decision at its own instant: %v, want %v", got, want)
	}

	// A decision of more checks than can be marked: the rest are not held.
	var wide []any
	for i := range maxHeldChecks + 2 {
		wide = append(wide, fmt.Sprintf("w%d", i), 5)
	}
	_, args, _ = m.args([]*scriptCall{fwCall(t, ctx, wide...), fwCall(t, ctx, wide...)})
	x := args[len(args)-1].(int64)
	if x>>16 != 1<<maxHeldChecks-1 {
		t.Fatalf("a decision of %d checks on held keys holds %b, want the first %d", maxHeldChecks+2, x>>16, maxHeldChecks)
	}

	// A key some decision names past the markable checks, or as a
	// sliding_log key, is held for none: "g" here.
	past := append(slices.Clone(wide[:2*maxHeldChecks]), "g", 5)
	_, args, _ = m.args([]*scriptCall{fwCall(t, ctx, "g", 5), fwCall(t, ctx, past...), fwCall(t, ctx, "g", 5)})
	if got := args[len(args)-3:]; got[0] != int64(c1) || got[2] != int64(c1) {
		t.Fatalf("decisions %v: the key named at check %d is held", got, maxHeldChecks+1)
	}
	_, args, _ = m.args([]*scriptCall{fwCall(t, ctx, "g", 5), sl(fwCall(t, ctx, "g", 5), 0), fwCall(t, ctx, "g", 5)})
	if got := args[len(args)-3:]; got[0] != int64(c1) || got[2] != int64(c1) {
		t.Fatalf("decisions %v: a key named as a sliding_log key is held", got)
	}

	// More combinations than a decision's number holds: not a batch.
	calls := make([]*scriptCall, maxCombinations+1)
	for i := range calls {
		calls[i] = fwCall(t, ctx, "c", 1+i) // a limit each: a shape, a combination each
	}
	if _, _, ok := m.args(calls); ok {
		t.Fatalf("%d combinations taken as one DecideMany call", len(calls))
	}
	if _, _, ok := m.args(calls[:maxCombinations]); !ok {
		t.Fatalf("%d combinations refused", maxCombinations)
	}

	// Past a few combinations they are found through a map that outlives
	// the batch: a batch laid out after others is laid out as it would be
	// alone (its own numbers, none left from before).
	// (b's first decision, of two checks, shifts its combinations by one
	// against a's)
	a, b := []*scriptCall{}, []*scriptCall{fwCall(t, ctx, "x", 100, "y", 200)}
	for i := range 20 {
		a = append(a, fwCall(t, ctx, fmt.Sprintf("a%d", i), 1+i))
		b = append(b, fwCall(t, ctx, fmt.Sprintf("b%d", i), 1+i))
	}
	b = append(b, a[3], a[17])
	_, _, _ = m.args(a)
	bk, bargs, _ := m.args(b)
	var fresh manyScratch
	fk, fargs, _ := fresh.args(b)
	if !slices.Equal(bk, fk) || !reflect.DeepEqual(bargs, fargs) {
		t.Fatalf("after another batch:\n%v\nalone:\n%v", bargs, fargs)
	}
}

// TestBatchHeldKeyPast30Checks: a key that one decision names past the
// checks a decision's number can mark (or as a sliding_log key) is held
// for no decision of the batch: held for the others, that decision would
// read Redis without their counts, and the call's write at its end would
// undo its own (three admitted on a limit of 2, the count left at 2).
func TestBatchHeldKeyPast30Checks(t *testing.T) {
	srv := testredis.Start(t)
	client := srv.Client(t)
	s := warmStore(t, &redis.Options{Addr: srv.Addr}, nil)
	ctx := testredis.Ctx(t)
	g := "hp:{g}:fw2"
	var many []any
	for i := range maxHeldChecks {
		many = append(many, fmt.Sprintf("hp:{a%d}:fw2", i), 100)
	}
	many = append(many, g, 2) // g is check 31
	calls := []*scriptCall{fwCall(t, ctx, g, 2), fwCall(t, ctx, many...), fwCall(t, ctx, g, 2)}
	if admitted, errs := sendBatch(t, s, calls); admitted != 2 || len(errs) != 0 {
		t.Fatalf("admitted %d of 3 on a key of limit 2 (errors %v), want 2", admitted, errs)
	}
	if n := fwCountText(client, g); n != "2" {
		t.Fatalf("%s counts %q, want 2", g, n)
	}
}
