package lua

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
)

// manyDecision is one decision of a DecideMany call: its keys and
// decide.lua's ARGV for it.
type manyDecision struct {
	keys []string
	argv []any
}

// manyArgs is DecideMany's KEYS and ARGV for ds (decide_many.lua's
// header), each key given as keyOf(key): the distinct check shapes (with
// their costs) once, the distinct combinations of shapes once, then each
// decision's combination: on the Redis clock with the bits of its checks
// whose key another decision of the call names (when every decision of the
// call is on the Redis clock; never a sliding_log key), at its own instant
// negated and followed by its now.
func manyArgs(keyOf func(string) string, ds []manyDecision) ([]string, []any) {
	var keys []string
	var shapes [][6]any
	var combos [][]any
	clock := true
	named := map[string]int{}
	for _, d := range ds {
		if d.argv[0] != int64(0) {
			clock = false
		}
		for i, k := range d.keys {
			if d.argv[1+6*i] != int64(2) {
				named[k]++
			}
		}
	}
	var body []any
	for _, d := range ds {
		var combo []any
		for i, k := range d.keys {
			keys = append(keys, keyOf(k))
			c := d.argv[1+6*i:]
			sh := [6]any{c[0], c[1], c[2], c[3], c[5], c[4]}
			at := slices.Index(shapes, sh)
			if at < 0 {
				at, shapes = len(shapes), append(shapes, sh)
			}
			combo = append(combo, at+1)
		}
		at := slices.IndexFunc(combos, func(c []any) bool { return slices.Equal(c, combo) })
		if at < 0 {
			at, combos = len(combos), append(combos, combo)
		}
		x := int64(at + 1)
		if d.argv[0] != int64(0) {
			body = append(body, -x, d.argv[0])
			continue
		}
		for i, k := range d.keys {
			if clock && named[k] > 1 && d.argv[1+6*i] != int64(2) {
				x |= 1 << (16 + i)
			}
		}
		body = append(body, x)
	}
	args := []any{len(ds), len(shapes), len(combos)}
	for _, sh := range shapes {
		args = append(args, sh[:]...)
	}
	for _, c := range combos {
		args = append(append(args, len(c)), c...)
	}
	return keys, append(args, body...)
}

// heldChecks counts the checks of a DecideMany call (manyArgs) whose key
// the call holds.
func heldChecks(args []any) int {
	r, c := args[1].(int), args[2].(int)
	a := 3 + 6*r
	for range c {
		a += 1 + args[a].(int)
	}
	n := 0
	for ; a < len(args); a++ {
		x, _ := args[a].(int64)
		if x < 0 {
			a++ // its instant follows
			continue
		}
		for x >>= 16; x > 0; x >>= 1 {
			n += int(x & 1)
		}
	}
	return n
}

// entry is how a decision's part of DecideMany's reply is read: its
// instant (0: the call's), and for each check whether it is a shadow.
type entry struct {
	now     int64
	shadows []bool
}

// decideMany sends a DecideMany call and splits its flat reply into one
// entry per decision: decide.lua's reply for it, rebuilt from its checks'
// compact values (admitted, its instant, then four values per check), or
// its error (redis.Error). A reply that does not start with the call's
// instant or does not split into len(entries) decisions fails t.
func decideMany(t *testing.T, client *redis.Client, lib FunctionLibrary, keys []string, args []any, entries []entry) []any {
	t.Helper()
	return splitMany(t, client.FCall(context.Background(), lib.DecideMany, keys, args...), entries)
}

// splitMany is decideMany's split of a DecideMany reply, however sent.
func splitMany(t *testing.T, cmd *redis.Cmd, entries []entry) []any {
	t.Helper()
	flat, err := cmd.Slice()
	if err != nil {
		t.Fatalf("DecideMany: %v", err)
	}
	clock, ok := flat[0].(int64)
	if !ok || clock <= 0 {
		t.Fatalf("DecideMany answered %v: no instant first", flat)
	}
	num := func(p int) int64 {
		if p >= len(flat) {
			t.Fatalf("DecideMany answered %v: short of %d decisions", flat, len(entries))
		}
		v, ok := flat[p].(int64)
		if !ok {
			t.Fatalf("DecideMany answered %v: value %d is %v", flat, p, flat[p])
		}
		return v
	}
	var got []any
	p := 1
	for _, e := range entries {
		if p < len(flat) {
			if err, ok := flat[p].(redis.Error); ok {
				got, p = append(got, err), p+1
				continue
			}
		}
		now := e.now
		if now == 0 {
			now = clock
		}
		r := []any{int64(1), now}
		for _, shadow := range e.shadows {
			v, reset := num(p), num(p+1)
			if v >= 0 {
				r, p = append(r, int64(1), v, reset, int64(0)), p+2
				continue
			}
			r, p = append(r, int64(0), -v-1, reset, num(p+2)), p+3
			if !shadow {
				r[0] = int64(0)
			}
		}
		got = append(got, r)
	}
	if p != len(flat) {
		t.Fatalf("DecideMany answered %v: more than %d decisions", flat, len(entries))
	}
	return got
}

// entriesOf is how each decision of ds is answered.
func entriesOf(ds []manyDecision) []entry {
	es := make([]entry, len(ds))
	for i, d := range ds {
		es[i].now, _ = d.argv[0].(int64)
		for c := range d.keys {
			es[i].shadows = append(es[i].shadows, d.argv[1+6*c+5] == 1 || d.argv[1+6*c+5] == int64(1))
		}
	}
	return es
}

// withLibrary starts a redis-server with the function library loaded.
func withLibrary(t *testing.T) (*redis.Client, FunctionLibrary) {
	t.Helper()
	client := testredis.Start(t).Client(t)
	lib := Library()
	if err := client.FunctionLoadReplace(context.Background(), lib.Source).Err(); err != nil {
		t.Fatal(err)
	}
	return client, lib
}

// inSpace names keys rg:{space}:<key>.
func inSpace(space string) func(string) string {
	return func(k string) string { return "rg:{" + space + "}:" + k }
}

// TestDecideManyMatchesOneByOne: one FCALL of DecideMany answers, decision
// for decision, exactly what one FCALL of Decide each answers when sent in
// the same order, and leaves the same state: every algorithm alone and all
// five together, cost-0 looks, shadow checks, two limits per algorithm
// (so several shapes per call, and rule changes under live keys), several
// decisions on one key in one call (each sees the ones before it), and
// decisions at different instants in one call, given or the Redis clock's
// (each of decide_many.lua's three forms of a decision).
func TestDecideManyMatchesOneByOne(t *testing.T) {
	client, lib := withLibrary(t)
	for _, way := range manyWays(client, lib) {
		t.Run(way.name, func(t *testing.T) { matchOneByOne(t, client, lib, way, everyAlgorithm) })
	}
}

// TestDecideManyHotKeysMatchOneByOne is the same comparison for calls
// where a few keys take most decisions (a route's or the whole API's rule,
// with many users'), which records.lua's shortcut admits after a call's
// first decision on them: fixed_window and sliding_window held keys, alone
// and last after unheld checks, limits that a call runs through, two limits
// and two periods on one key, costs of 0 to 3, and shadows.
func TestDecideManyHotKeysMatchOneByOne(t *testing.T) {
	client, lib := withLibrary(t)
	for _, way := range manyWays(client, lib) {
		t.Run(way.name, func(t *testing.T) { matchOneByOne(t, client, lib, way, hotKeys) })
	}
}

// manyWay is one way of sending a DecideMany call: FCALL of the library's
// function, or EVALSHA of DecideManyScript (servers without functions).
type manyWay struct {
	name string
	call func(keys []string, args []any) *redis.Cmd
}

func manyWays(client *redis.Client, lib FunctionLibrary) []manyWay {
	ctx := context.Background()
	return []manyWay{
		{"fcall", func(keys []string, args []any) *redis.Cmd { return client.FCall(ctx, lib.DecideMany, keys, args...) }},
		{"evalsha", func(keys []string, args []any) *redis.Cmd { return DecideManyScript.Run(ctx, client, keys, args...) }},
	}
}

// A decisionMix makes the decisions matchOneByOne compares: decision
// returns one at instant at (0: the Redis clock), keys names every key they
// may use (their state is compared at the end), and a call holds 1 to
// size decisions.
type decisionMix struct {
	decision func(rng *rand.Rand, at int64) manyDecision
	keys     []string
	size     int
}

const mixPeriod = int64(10_000_000)

// everyAlgorithm: a third of the decisions check all five algorithms
// (keys all0..all4), the rest one algorithm on one of two keys of its own;
// limits of 5 or 7, costs of 0 to 2, a quarter with the last check a
// shadow.
var everyAlgorithm = decisionMix{
	decision: func(rng *rand.Rand, at int64) manyDecision {
		var checks [][5]int64
		var keys []string
		if rng.IntN(3) == 0 {
			for i := range algorithmFiles {
				checks = append(checks, [5]int64{int64(i + 1), 5 + 2*int64(rng.IntN(2)), mixPeriod, 3, int64(rng.IntN(3))})
				keys = append(keys, fmt.Sprintf("all%d", i))
			}
		} else {
			i := rng.IntN(len(algorithmFiles))
			checks = append(checks, [5]int64{int64(i + 1), 5 + 2*int64(rng.IntN(2)), mixPeriod, 3, int64(rng.IntN(3))})
			keys = append(keys, fmt.Sprintf("%s%d", algorithmFiles[i].fn, rng.IntN(2)))
		}
		argv := decideArgv(at, checks...)
		if rng.IntN(4) == 0 {
			argv[len(argv)-1] = 1 // the last check is a shadow
		}
		return manyDecision{keys, argv}
	},
	keys: func() []string {
		var names []string
		for i, a := range algorithmFiles {
			names = append(names, fmt.Sprintf("all%d", i), a.fn+"0", a.fn+"1")
		}
		return names
	}(),
	size: 12,
}

// hotKeys: each decision checks one of two hot keys (hot0, hot1: both
// fixed_window or both sliding_window) alone, or after a user's key
// (user0..user9, the same algorithm or gcra); a hot key's limit is 40 or
// 44 and its period mostly mixPeriod, now and then twice it (a rule
// changed under the live key); costs of 0 to 3, a tenth with the hot check
// a shadow.
var hotKeys = decisionMix{
	decision: func(rng *rand.Rand, at int64) manyDecision {
		code := int64(Code("fixed_window"))
		if rng.IntN(2) == 0 {
			code = int64(Code("sliding_window"))
		}
		period := mixPeriod
		if rng.IntN(4) == 0 {
			period *= 2
		}
		hot := [5]int64{code, 100 + 10*int64(rng.IntN(2)), period, 0, int64(rng.IntN(4))}
		var checks [][5]int64
		var keys []string
		if rng.IntN(3) > 0 {
			user := [5]int64{code, 6, mixPeriod, 3, int64(1 + rng.IntN(2))}
			if rng.IntN(4) == 0 {
				user[0] = int64(Code("gcra"))
			}
			checks = append(checks, user)
			keys = append(keys, fmt.Sprintf("user%d-%d", rng.IntN(10), user[0]))
		}
		checks = append(checks, hot)
		keys = append(keys, fmt.Sprintf("hot%d-%d", rng.IntN(2), code))
		argv := decideArgv(at, checks...)
		if rng.IntN(10) == 0 {
			argv[len(argv)-1] = 1
		}
		return manyDecision{keys, argv}
	},
	keys: func() []string {
		var names []string
		for _, a := range []string{"fixed_window", "sliding_window", "gcra"} {
			c := Code(a)
			names = append(names, fmt.Sprintf("hot0-%d", c), fmt.Sprintf("hot1-%d", c))
			for u := range 10 {
				names = append(names, fmt.Sprintf("user%d-%d", u, c))
			}
		}
		return names
	}(),
	size: 30,
}

// matchOneByOne is the comparison of TestDecideManyMatchesOneByOne, with
// mix's decisions sent way's way (in key spaces of its own).
func matchOneByOne(t *testing.T, client *redis.Client, lib FunctionLibrary, way manyWay, mix decisionMix) {
	rng := rand.New(rand.NewPCG(1, 2))
	ms, os := "m"+way.name, "o"+way.name
	now := time.Now().UnixMicro()
	decided, held := 0, 0
	for call := 0; call < 80; call++ {
		var ds []manyDecision
		for range 1 + rng.IntN(mix.size) {
			at := now + int64(call)*400_000 + int64(rng.IntN(1000))
			if call%2 == 1 || rng.IntN(3) == 0 {
				// the Redis clock; a call whose decisions are all on it
				// holds the keys several of them name
				at = 0
			}
			ds = append(ds, mix.decision(rng, at))
		}
		held += compareCall(t, client, lib, way, ms, os, ds)
		decided += len(ds)
	}
	if decided < 200 || held < 100 {
		t.Fatalf("only %d decisions compared, %d checks on held keys", decided, held)
	}
	t.Logf("%d decisions compared, %d checks on held keys", decided, held)
	compareKeys(t, client, ms, os, mix.keys)
}

// compareCall sends ds as one DecideMany call way's way, with keys in
// space ms, then each as one FCALL of Decide in the same order, with keys
// in space os (a decision on the Redis clock at the instant DecideMany
// reports), and fails unless they answer the same. It returns the number
// of checks on keys the call held.
func compareCall(t *testing.T, client *redis.Client, lib FunctionLibrary, way manyWay, ms, os string, ds []manyDecision) int {
	t.Helper()
	ctx := context.Background()
	keys, args := manyArgs(inSpace(ms), ds)
	okeys, _ := manyArgs(inSpace(os), ds)
	waitOutExpiries(t, client, append(okeys, keys...))
	got := splitMany(t, way.call(keys, args), entriesOf(ds))
	for i, d := range ds {
		k, _ := manyArgs(inSpace(os), []manyDecision{d})
		argv := d.argv
		if argv[0] == int64(0) {
			// decided on the Redis clock: replayed at the instant it
			// reports
			r, ok := got[i].([]any)
			if !ok {
				t.Fatalf("decision %d: DecideMany answered %v", i, got[i])
			}
			argv = append([]any{r[1]}, argv[1:]...)
		}
		want, err := client.FCall(ctx, lib.Decide, k, argv...).Result()
		if err != nil || !reflect.DeepEqual(got[i], want) {
			t.Fatalf("decision %d (%v %v): DecideMany %v, Decide %v (%v)", i, d.keys, d.argv, got[i], want, err)
		}
	}
	return heldChecks(args)
}

// waitOutExpiries waits until none of keys expires within the next
// 300ms. Redis expires keys on its own clock, which the decisions' instants
// do not follow: a key whose expiry fell between a DecideMany call and its
// replay one by one (a few milliseconds later) would be there for one and
// gone for the other. (Under load, the test's instants run behind the
// Redis clock, and records written at them expire early in Redis's time.)
func waitOutExpiries(t *testing.T, client *redis.Client, keys []string) {
	t.Helper()
	ctx := context.Background()
	var wait time.Duration
	for _, k := range keys {
		if d := client.PTTL(ctx, k).Val(); d > 0 && d <= 300*time.Millisecond {
			wait = max(wait, d)
		}
	}
	if wait > 0 {
		time.Sleep(wait + 20*time.Millisecond)
	}
}

// compareKeys fails unless each of names holds the same record and about
// the same expiry in key spaces ms and os.
func compareKeys(t *testing.T, client *redis.Client, ms, os string, names []string) {
	t.Helper()
	ctx := context.Background()
	var all []string
	for _, n := range names {
		all = append(all, inSpace(ms)(n), inSpace(os)(n))
	}
	waitOutExpiries(t, client, all)
	for _, n := range names {
		km, ko := inSpace(ms)(n), inSpace(os)(n)
		if m, o := testredis.KeyState(t, client, km), testredis.KeyState(t, client, ko); m != o {
			t.Fatalf("key %s: DecideMany left %s, Decide %s", n, m, o)
		}
		// The same expiry, up to the few milliseconds between the calls
		// (-1: none, -2: no key).
		tm := client.PTTL(ctx, km).Val()
		to := client.PTTL(ctx, ko).Val()
		if (tm < 0 || to < 0) && tm != to || (tm-to).Abs() > 200*time.Millisecond {
			t.Fatalf("key %s: DecideMany left a TTL of %v, Decide %v", n, tm, to)
		}
	}
}

// TestDecideManyIsolatesErrors: a decision that fails (a key of the wrong
// type, an unknown algorithm code) is an error entry of its own; the
// decisions before and after it are decided and answered as usual.
func TestDecideManyIsolatesErrors(t *testing.T) {
	client, lib := withLibrary(t)
	ctx := context.Background()
	if err := client.RPush(ctx, "rg:{e}:list", "x").Err(); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMicro()
	fw := [5]int64{1, 2, steadyUS, 2, 1}
	ds := []manyDecision{
		{[]string{"a"}, decideArgv(now, fw)},
		{[]string{"list"}, decideArgv(now, fw)},
		{[]string{"b", "list"}, decideArgv(now, fw, fw)},
		{[]string{"c"}, decideArgv(now, [5]int64{9, 1, 1, 1, 1})},
		{[]string{"a"}, decideArgv(now, fw)},
		{[]string{"a"}, decideArgv(now, fw)},
		// bare decisions (one check on the Redis clock), failing and not
		{[]string{"list"}, decideArgv(0, fw)},
		{[]string{"f"}, decideArgv(0, fw)},
	}
	keys, args := manyArgs(inSpace("e"), ds)
	got := decideMany(t, client, lib, keys, args, entriesOf(ds))
	if r, ok := got[7].([]any); !ok || r[0] != int64(1) || r[2] != int64(1) || r[3] != int64(1) {
		t.Errorf("the bare decision after a failing one answered %v, want admitted with 1 left", got[7])
	}
	for i, want := range []string{"", "WRONGTYPE", "WRONGTYPE", "unknown algorithm code 9", "", "", "WRONGTYPE", ""} {
		e, isErr := got[i].(redis.Error)
		switch {
		case want == "" && isErr:
			t.Errorf("decision %d: error %v, want a decision", i, e)
		case want != "" && (!isErr || !strings.Contains(e.Error(), want)):
			t.Errorf("decision %d: %v, want an error with %q", i, got[i], want)
		}
	}
	// a, limit 2: admitted, admitted, denied; the errors took nothing from it
	for i, admitted := range map[int]int64{0: 1, 4: 1, 5: 0} {
		if r, ok := got[i].([]any); !ok || r[0] != admitted {
			t.Errorf("decision %d on a: %v, want admitted = %d", i, got[i], admitted)
		}
	}
	if n := fwCount(t, client, "rg:{e}:a"); n != "2" {
		t.Errorf("a counts %q, want 2", n)
	}
	// A decision of several checks that fails last in its call, after its
	// first check ran: the reply ends with its error (decideMany fails on
	// anything after it).
	last := []manyDecision{{[]string{"d"}, decideArgv(now, fw)}, {[]string{"d", "list"}, decideArgv(now, fw, fw)}}
	keys, args = manyArgs(inSpace("e"), last)
	got = decideMany(t, client, lib, keys, args, entriesOf(last))
	if e, ok := got[1].(redis.Error); !ok || !strings.Contains(e.Error(), "WRONGTYPE") {
		t.Errorf("the last decision answered %v, want WRONGTYPE", got[1])
	}
	// A call whose layout does not add up (an argument short, a key too
	// many) fails whole before it decides anything.
	good := []manyDecision{{[]string{"w"}, decideArgv(0, fw)}, {[]string{"w"}, decideArgv(0, fw)}}
	keys, args = manyArgs(inSpace("e"), good)
	// args: m=2, r=1, c=1, the shape (6), the combination (2), two decisions
	last2 := args[len(args)-2:]
	for what, call := range map[string]struct {
		keys []string
		args []any
	}{
		"an argument short": {keys, args[:len(args)-1]},
		"a key too many":    {append(keys[:len(keys):len(keys)], "rg:{e}:extra"), args},
		"no combination":    {keys, append(slices.Clone(args[:len(args)-2]), last2[0], 2)},
		"combination 0":     {keys, append(slices.Clone(args[:len(args)-2]), last2[0], 0)},
		"no check count":    {keys, append(slices.Clone(args[:9]), 0, 1, last2[0], last2[1])},
		"a value not whole": {keys, append(slices.Clone(args[:len(args)-2]), last2[0], "1.5")},
		// fractional counts: the loops and the layout check would
		// disagree (m = 2.5 used to fail only after deciding the first)
		"m = 2.5": {keys, append([]any{"2.5"}, args[1:]...)},
		"r = 1.5": {keys, append([]any{args[0], "1.5"}, args[2:]...)},
		"c = 0.5": {keys, append([]any{args[0], args[1], "0.5"}, args[3:]...)},
	} {
		err := client.FCall(ctx, lib.DecideMany, call.keys, call.args...).Err()
		if err == nil || !strings.Contains(err.Error(), "rategate: decide_many") {
			t.Errorf("%s: %v, want decide_many's error for the whole call", what, err)
		}
	}
	if n := client.Exists(ctx, "rg:{e}:w").Val(); n != 0 {
		t.Errorf("a malformed call wrote its first decision's key")
	}
}

// TestDecideManyLongReply: decide_many sizes its reply once when it has at
// most 4000 values, and grows it as it goes beyond; both ways every
// decision gets its own values and nothing is left over, failing
// decisions (one value each) among them. rategate sends at most 128
// decisions a call; the function takes any number.
func TestDecideManyLongReply(t *testing.T) {
	client, lib := withLibrary(t)
	ctx := context.Background()
	now := time.Now().UnixMicro()
	fw := [5]int64{1, 2, steadyUS, 2, 1}
	sized := map[bool]bool{}
	for _, way := range manyWays(client, lib) {
		for _, m := range []int{950, 1300, 1500} {
			space := inSpace(fmt.Sprintf("l%d%s", m, way.name))
			if err := client.RPush(ctx, space("list"), "x").Err(); err != nil {
				t.Fatal(err)
			}
			var ds []manyDecision
			values := 1 // the reply's length bound: 3 values a check
			for i := range m {
				switch {
				case i%97 == 5:
					ds = append(ds, manyDecision{[]string{"list"}, decideArgv(0, fw)})
					values += 3
				case i%101 == 7 || i == m-1:
					// last: a failing decision that wrote values before its error
					ds = append(ds, manyDecision{[]string{fmt.Sprint(i), "list"}, decideArgv(now, fw, fw)})
					values += 6
				default:
					ds = append(ds, manyDecision{[]string{fmt.Sprint(i % 500)}, decideArgv(0, fw)})
					values += 3
				}
			}
			sized[values <= 4000] = true
			keys, args := manyArgs(space, ds)
			got := splitMany(t, way.call(keys, args), entriesOf(ds)) // fails on a value too many or short
			seen := map[string]int64{}
			for i, d := range ds {
				e, isErr := got[i].(redis.Error)
				if d.keys[len(d.keys)-1] == "list" {
					if !isErr || !strings.Contains(e.Error(), "WRONGTYPE") {
						t.Fatalf("%s, m=%d, decision %d: %v, want WRONGTYPE", way.name, m, i, got[i])
					}
					continue
				}
				// limit 2 per key: the first two decisions on a key admitted
				want := int64(0)
				if seen[d.keys[0]]++; seen[d.keys[0]] <= 2 {
					want = 1
				}
				if r, ok := got[i].([]any); !ok || r[0] != want {
					t.Fatalf("%s, m=%d, decision %d on %s: %v, want admitted = %d", way.name, m, i, d.keys[0], got[i], want)
				}
			}
		}
	}
	if !sized[true] || !sized[false] {
		t.Fatalf("the calls cover replies sized up front %v and grown %v; want both", sized[true], sized[false])
	}
}

// TestDecideManyBadCheckWritesNothing: a multi-rule decision whose later
// check names no shape fails alone, before its earlier checks ran: a live
// sliding_window record its first check would rewrite under a changed
// period is left as it was, and the decision after it is decided as usual.
// A shape that is not all numbers (a cost "x") fails the whole call before
// any decision ran.
func TestDecideManyBadCheckWritesNothing(t *testing.T) {
	client, lib := withLibrary(t)
	ctx := context.Background()
	now := time.Now().UnixMicro()
	key := "rg:{b}:k"
	if err := client.FCall(ctx, lib.Decide, []string{key}, decideArgv(now, [5]int64{3, 5, steadyUS, 5, 2})...).Err(); err != nil {
		t.Fatal(err)
	}
	before := testredis.KeyState(t, client, key)
	if !strings.HasPrefix(before, "string ") {
		t.Fatalf("%s holds %s, want a sliding_window record", key, before)
	}
	keys := []string{key, "rg:{b}:o", "rg:{b}:next"}
	for what, bad := range map[string]any{"shape 7": 7, "shape 0": 0, "shape x": "x", "shape missing": ""} {
		// m=2, r=1, c=2; shape {sliding_window, 5, 90 s, 5, not shadow,
		// cost 1}; combination 1: two checks, the second bad; combination
		// 2: one good check; decision 1 of combination 1, decision 2 of
		// combination 2, both at their own instant.
		got := decideMany(t, client, lib, keys, []any{2, 1, 2, 3, 5, 90_000_000, 5, 0, 1,
			2, 1, bad, 1, 1,
			-1, now + 1000, -2, now + 1000}, []entry{{now + 1000, []bool{false, false}}, {now + 1000, []bool{false}}})
		if e, ok := got[0].(redis.Error); !ok || !strings.Contains(e.Error(), "rategate: decide_many check 2") {
			t.Errorf("%s: decision 1 answered %v, want decide_many's error for its check 2", what, got[0])
		}
		if r, ok := got[1].([]any); !ok || r[0] != int64(1) {
			t.Errorf("%s: decision 2 answered %v, want admitted", what, got[1])
		}
		if after := testredis.KeyState(t, client, key); before != after {
			t.Errorf("%s: the failed decision rewrote %v to %v", what, before, after)
		}
	}
	next := testredis.KeyState(t, client, "rg:{b}:next")
	for what, cost := range map[string]any{"cost x": "x", "cost missing": ""} {
		err := client.FCall(ctx, lib.DecideMany, keys,
			2, 1, 2, 3, 5, 90_000_000, 5, 0, cost,
			2, 1, 1, 1, 1,
			-1, now+1000, -2, now+1000).Err()
		if err == nil || !strings.Contains(err.Error(), "rategate: decide_many shape 1") {
			t.Errorf("%s: %v, want decide_many's error for the whole call", what, err)
		}
		if after := testredis.KeyState(t, client, key); before != after {
			t.Errorf("%s: the failed call rewrote %v to %v", what, before, after)
		}
		if after := testredis.KeyState(t, client, "rg:{b}:next"); next != after {
			t.Errorf("%s: the failed call decided its second decision (%v to %v)", what, next, after)
		}
	}
}

// TestDecideManyOneTime: the decisions of one call on the Redis clock read
// TIME once and are decided at that instant; one that names its own
// instant keeps it. (A decision's reply carries no instant of its own, so
// each of its token_bucket records says when it was decided.)
func TestDecideManyOneTime(t *testing.T) {
	client, lib := withLibrary(t)
	ctx := context.Background()
	sw := [5]int64{3, 100, steadyUS, 100, 1}
	tb := [5]int64{5, 100, steadyUS, 100, 1}
	var ds []manyDecision
	for i := range 10 {
		ds = append(ds, manyDecision{[]string{fmt.Sprintf("k%d", i)}, decideArgv(0, tb)})
	}
	ds = append(ds, manyDecision{[]string{"x", "y"}, decideArgv(0, sw, sw)}, manyDecision{[]string{"z"}, decideArgv(12345, sw)})
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	keys, args := manyArgs(inSpace("t"), ds)
	got := decideMany(t, client, lib, keys, args, entriesOf(ds))
	m := regexp.MustCompile(`cmdstat_time:calls=(\d+)`).FindStringSubmatch(client.Info(ctx, "commandstats").Val())
	if m == nil || m[1] != "1" {
		t.Fatalf("TIME calls %v for one DecideMany, want 1", m)
	}
	first := got[0].([]any)[1]
	for i := range ds[:11] {
		if at := got[i].([]any)[1]; at != first {
			t.Errorf("decision %d decided at %v, the first at %v", i, at, first)
		}
	}
	if at := got[11].([]any)[1]; at != int64(12345) {
		t.Errorf("the decision at 12345 was decided at %v", at)
	}
	if v, _ := strconv.ParseInt(fmt.Sprint(first), 10, 64); v < time.Now().Add(-time.Minute).UnixMicro() {
		t.Errorf("decided at %v, not the Redis clock", first)
	}
	for i := range 10 {
		v, _ := client.Get(ctx, fmt.Sprintf("rg:{t}:k%d", i)).Bytes()
		info, _ := limits.TokenBucket.Info()
		rec, _ := info.DecodeRecord(v)
		if ts := rec["ts"]; ts != fmt.Sprint(first) {
			t.Errorf("decision %d recorded its bucket at %q, the call's instant is %v", i, ts, first)
		}
	}
}

// TestDecideManyHeldKeyReadInOrder: a held key is read when its check is
// reached, not before the decision's first check: here the first check
// converts a gcra record written under another limit (a write that stays
// when the decision then fails, as it would alone), and the second's held
// key holds a hash (WRONGTYPE). Read up front, the error came first and
// the conversion never happened.
func TestDecideManyHeldKeyReadInOrder(t *testing.T) {
	client, lib := withLibrary(t)
	ctx := context.Background()
	period := steadyUS
	// both records written at one instant: a conversion keeps the part of
	// a unit already drained, so records written apart convert apart
	at := time.Now().UnixMicro()
	for _, sp := range []string{"m", "o"} {
		k := inSpace(sp)
		// a gcra record written under limit 10
		if err := client.FCall(ctx, lib.Decide, []string{k("g")}, decideArgv(at, [5]int64{4, 10, period, 10, 5})...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := client.HSet(ctx, k("h"), "x", "1").Err(); err != nil {
			t.Fatal(err)
		}
	}
	before := testredis.KeyState(t, client, inSpace("m")("g"))
	// limit 5 now: the record is converted by the first check that costs something
	gc := [5]int64{4, 5, period, 10, 1}
	fw := [5]int64{1, 5, period, 5, 1}
	ds := []manyDecision{{[]string{"g", "h"}, decideArgv(0, gc, fw)}, {[]string{"h"}, decideArgv(0, fw)}}
	keys, args := manyArgs(inSpace("m"), ds)
	if heldChecks(args) != 2 {
		t.Fatalf("want h held in both decisions: %v", args)
	}
	flat, err := client.FCall(ctx, lib.DecideMany, keys, args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range ds {
		if e, ok := flat[1+i].(redis.Error); !ok || !strings.Contains(e.Error(), "WRONGTYPE") {
			t.Errorf("decision %d: %v, want WRONGTYPE", i, flat[1+i])
		}
		k, _ := manyArgs(inSpace("o"), []manyDecision{d})
		argv := append([]any{flat[0]}, d.argv[1:]...) // alone, at the batch's instant
		if err := client.FCall(ctx, lib.Decide, k, argv...).Err(); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("decision %d alone: %v, want WRONGTYPE", i, err)
		}
	}
	m, o := testredis.KeyState(t, client, inSpace("m")("g")), testredis.KeyState(t, client, inSpace("o")("g"))
	if m != o || m == before {
		t.Errorf("gcra record: before %s, after the batch %s, alone %s; want the conversion in both", before, m, o)
	}
}

// steadyUS is these tests' period: an hour or a little more, its window
// at least half an hour from its end (storetest.SteadyPeriod). A check
// decided at time.Now() in a minute-long window lost its record when the
// real minute ended in the test's middle (Redis expires it on its clock).
var steadyUS = storetest.SteadyPeriod()

// steadyRule is a check of algo at limit per steadyUS (burst = limit), cost
// 1, in decideArgv's order.
func steadyRule(algo string, limit int64) [5]int64 {
	return [5]int64{int64(Code(algo)), limit, steadyUS, limit, 1}
}

// TestDeniedRequestLeavesRecords: a check before the one that denies a
// request may have written its admission at once (rg_chain's count-only
// writes) and takes it off again when the later check denies. The denied
// request leaves each record byte for byte as it was, with its expiry, and
// each of its allowed checks reports what a zero-cost look at the same
// instant reports. Through decide (FCALL and EVALSHA) and decide_many, each
// on a fresh server, with the denying check last and between the others, on
// records in their current window (the count-only case) and on new keys
// (handed back). In the function library the first warm request takes the
// write off again and the next one hands its writes back (rg_careful): both
// ways are checked; a script starts afresh on every call.
func TestDeniedRequestLeavesRecords(t *testing.T) {
	ctx := context.Background()
	fw := steadyRule("fixed_window", 10)
	sw := steadyRule("sliding_window", 10)
	gate := steadyRule("fixed_window", 1)
	for _, way := range []string{"FCALL decide", "EVALSHA decide", "decide_many"} {
		client, lib := withLibrary(t)
		// decide.lua's reply, asked the way named
		call := func(keys []string, argv []any) []any {
			t.Helper()
			var r []any
			var err error
			switch way {
			case "FCALL decide":
				r, err = client.FCall(ctx, lib.Decide, keys, argv...).Slice()
			case "EVALSHA decide":
				r, err = DecideScript.Run(ctx, client, keys, argv...).Slice()
			default:
				d := manyDecision{keys, argv}
				ks, args := manyArgs(func(k string) string { return k }, []manyDecision{d})
				got := decideMany(t, client, lib, ks, args, entriesOf([]manyDecision{d}))
				var ok bool
				if r, ok = got[0].([]any); !ok {
					err = fmt.Errorf("decide_many answered %v", got[0])
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		for _, warm := range []bool{true, false} {
			for _, order := range [][3]int{{0, 1, 2}, {0, 2, 1}} {
				name := fmt.Sprintf("%s, order %v, warm %v", way, order, warm)
				k := inSpace(strings.ReplaceAll(name, " ", "_"))
				now := time.Now().UnixMicro()
				if warm {
					for range 2 {
						call([]string{k("fw"), k("sw")}, decideArgv(now, fw, sw))
					}
				}
				call([]string{k("gate")}, decideArgv(now, gate))
				before := map[string]string{}
				ttl := map[string]time.Duration{}
				for _, key := range []string{k("fw"), k("sw")} {
					before[key] = testredis.KeyState(t, client, key)
					ttl[key] = client.PTTL(ctx, key).Val()
				}
				all := [3][5]int64{fw, sw, gate}
				names := [3]string{k("fw"), k("sw"), k("gate")}
				var checks [][5]int64
				var keys []string
				for _, i := range order {
					checks, keys = append(checks, all[i]), append(keys, names[i])
				}
				at := now + 1000
				got := call(keys, decideArgv(at, checks...))
				if got[0] != int64(0) {
					t.Fatalf("%s: %v, want the request denied", name, got)
				}
				for c, key := range keys {
					if key == k("gate") {
						if got[2+4*c] != int64(0) {
							t.Errorf("%s: the gate answered %v, want denied", name, got[2+4*c:6+4*c])
						}
						continue
					}
					if after := testredis.KeyState(t, client, key); after != before[key] {
						t.Errorf("%s: %s went from %s to %s", name, key, before[key], after)
					}
					if after := client.PTTL(ctx, key).Val(); after > ttl[key] {
						t.Errorf("%s: %s expires later: %v, was %v", name, key, after, ttl[key])
					}
					look := checks[c]
					look[4] = 0
					want := call([]string{key}, decideArgv(at, look))
					if !reflect.DeepEqual(got[2+4*c:6+4*c], want[2:6]) {
						t.Errorf("%s: check %s answered %v, a look %v", name, key, got[2+4*c:6+4*c], want[2:6])
					}
				}
			}
		}
	}
}

// TestCarefulAfterUndo: in the function library, once a request's writes
// were taken off again, the next 32 requests of several checks hand their
// writes back (rg_careful), so a flood that a later rule denies costs Redis
// no write and undoing per request; then writing at once resumes. Counted
// by Redis's own SETRANGE calls (a count-only write, its undoing).
func TestCarefulAfterUndo(t *testing.T) {
	client, lib := withLibrary(t)
	ctx := context.Background()
	fw := steadyRule("fixed_window", 1000)
	gate := steadyRule("fixed_window", 1)
	k := inSpace("careful")
	now := time.Now().UnixMicro()
	decide := func(keys []string, checks ...[5]int64) {
		t.Helper()
		if err := client.FCall(ctx, lib.Decide, keys, decideArgv(now, checks...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	setranges := func(fn func()) int64 {
		t.Helper()
		if err := client.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		fn()
		info := client.Info(ctx, "commandstats").Val()
		m := regexp.MustCompile(`cmdstat_setrange:calls=(\d+)`).FindStringSubmatch(info)
		if m == nil {
			return 0
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		return n
	}
	decide([]string{k("fw"), k("other")}, fw, fw) // both records now in their window
	decide([]string{k("gate")}, gate)             // the gate is shut
	denied := func() { decide([]string{k("fw"), k("gate")}, fw, gate) }
	if n := setranges(denied); n != 2 {
		t.Fatalf("the first denied request made %d SETRANGE calls, want 2 (the write and its undoing)", n)
	}
	if n := setranges(denied); n != 0 {
		t.Fatalf("the next denied request made %d SETRANGE calls, want 0 (handed back)", n)
	}
	// 30 more requests of two checks, admitted: handed back, one write each
	allowed := func() { decide([]string{k("fw"), k("other")}, fw, fw) }
	if n := setranges(func() {
		for range 30 {
			allowed()
		}
	}); n != 60 {
		t.Fatalf("30 admitted requests made %d SETRANGE calls, want 60", n)
	}
	// the 32 requests after the undoing are spent: writing at once again
	if n := setranges(denied); n != 2 {
		t.Fatalf("a denied request after 32 made %d SETRANGE calls, want 2", n)
	}
}

// TestUnknownCodeWritesNothing: a request whose later check names no
// algorithm fails before any check runs, so an earlier check that would
// write at once (rg_chain) writes nothing. Through FCALL and EVALSHA of
// decide and decide_many.
func TestUnknownCodeWritesNothing(t *testing.T) {
	client, lib := withLibrary(t)
	ctx := context.Background()
	fw := steadyRule("fixed_window", 5)
	bad := fw
	bad[0] = 9
	now := time.Now().UnixMicro()
	for _, way := range []string{"FCALL decide", "EVALSHA decide", "FCALL decide_many", "EVALSHA decide_many"} {
		k := inSpace(strings.ReplaceAll(way, " ", "_"))
		if err := client.FCall(ctx, lib.Decide, []string{k("a")}, decideArgv(now, fw)...).Err(); err != nil {
			t.Fatal(err)
		}
		before := testredis.KeyState(t, client, k("a"))
		keys, argv := []string{k("a"), k("b")}, decideArgv(now, fw, bad)
		var err error
		switch way {
		case "FCALL decide":
			err = client.FCall(ctx, lib.Decide, keys, argv...).Err()
		case "EVALSHA decide":
			err = DecideScript.Run(ctx, client, keys, argv...).Err()
		default:
			ks, args := manyArgs(func(k string) string { return k }, []manyDecision{{keys, argv}})
			var flat []any
			if way == "FCALL decide_many" {
				flat, err = client.FCall(ctx, lib.DecideMany, ks, args...).Slice()
			} else {
				flat, err = DecideManyScript.Run(ctx, client, ks, args...).Slice()
			}
			if err == nil {
				err, _ = flat[1].(error)
			}
		}
		if err == nil || !strings.Contains(err.Error(), "unknown algorithm code 9") {
			t.Errorf("%s: %v, want the unknown code's error", way, err)
		}
		if after := testredis.KeyState(t, client, k("a")); after != before {
			t.Errorf("%s: the first check's record went from %s to %s", way, before, after)
		}
	}
}

// TestScriptsHandBack: the scripts (EVALSHA) never write a check at once
// (decide.lua's rg_careful): a request a later rule denies makes no write,
// so it costs no undoing and still answers when Redis refuses writes
// (maxmemory reached).
func TestScriptsHandBack(t *testing.T) {
	client, _ := withLibrary(t)
	ctx := context.Background()
	fw := steadyRule("fixed_window", 1000)
	sw := steadyRule("sliding_window", 1000)
	gate := steadyRule("fixed_window", 1)
	k := inSpace("scripts")
	now := time.Now().UnixMicro()
	run := func(keys []string, checks ...[5]int64) ([]any, error) {
		return DecideScript.Run(ctx, client, keys, decideArgv(now, checks...)...).Slice()
	}
	if _, err := run([]string{k("fw"), k("sw")}, fw, sw); err != nil {
		t.Fatal(err)
	}
	if _, err := run([]string{k("gate")}, gate); err != nil {
		t.Fatal(err)
	}
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if got, err := run([]string{k("fw"), k("sw"), k("gate")}, fw, sw, gate); err != nil || got[0] != int64(0) {
			t.Fatalf("denied request: %v, %v", got, err)
		}
	}
	if strings.Contains(client.Info(ctx, "commandstats").Val(), "cmdstat_setrange") {
		t.Fatalf("denied requests through EVALSHA wrote: %s", client.Info(ctx, "commandstats").Val())
	}
	if err := client.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer client.ConfigSet(ctx, "maxmemory", "0")
	if got, err := run([]string{k("fw"), k("sw"), k("gate")}, fw, sw, gate); err != nil || got[0] != int64(0) {
		t.Fatalf("denied request out of memory: %v, %v, want denied", got, err)
	}
}

// TestShapeCache: decide keeps the shapes it parsed by their arguments'
// text (decide.lua's rg_shapes): a check is decided under its own numbers
// whatever was cached before, past the cache's bound (4096) too, and the
// shadow flag is part of a shape.
func TestShapeCache(t *testing.T) {
	client, lib := withLibrary(t)
	ctx := context.Background()
	now := time.Now().UnixMicro()
	fw := int64(Code("fixed_window"))
	for round := range 2 {
		pipe := client.Pipeline()
		var cmds []*redis.Cmd
		for i := range int64(4500) {
			key := fmt.Sprintf("rg:{cache%d:%d}:fw", round, i)
			cmds = append(cmds, pipe.FCall(ctx, lib.Decide, []string{key}, decideArgv(now, [5]int64{fw, 10 + i, steadyUS, 10 + i, 1})...))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		for i, c := range cmds {
			r, err := c.Int64Slice()
			if err != nil || r[0] != 1 || r[3] != int64(10+i-1) {
				t.Fatalf("round %d, limit %d: %v, %v; want admitted with %d left", round, 10+i, r, err, 10+i-1)
			}
		}
	}
	// the same numbers as a shadow: a shadow of a spent limit admits
	key := "rg:{cache:shadow}:fw"
	argv := decideArgv(now, [5]int64{fw, 1, steadyUS, 1, 1})
	for i, want := range []int64{1, 0} {
		if r, err := client.FCall(ctx, lib.Decide, []string{key}, argv...).Int64Slice(); err != nil || r[0] != want {
			t.Fatalf("call %d: %v, %v; want admitted %d", i, r, err, want)
		}
	}
	argv[len(argv)-1] = 1
	if r, err := client.FCall(ctx, lib.Decide, []string{key}, argv...).Int64Slice(); err != nil || r[0] != 1 || r[2] != 0 {
		t.Fatalf("as a shadow: %v, %v; want admitted, its check denied", r, err)
	}
}
