package lua

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// TestBuild: the embedded sources assemble, the exported scripts are what
// the builders return, and the library is named as documented.
func TestBuild(t *testing.T) {
	a, err := build(Source)
	if err != nil {
		t.Fatal(err)
	}
	for name, sc := range map[string]struct {
		script *redis.Script
		src    string
	}{"decide": {DecideScript, a.decide}, "refund": {RefundScript, a.refund}, "lease": {LeaseScript, a.lease}} {
		sum := sha1.Sum([]byte(sc.src))
		if sc.script.Hash() != hex.EncodeToString(sum[:]) {
			t.Errorf("%sScript does not run the %s source", name, name)
		}
	}
	if d, _ := Decide(); d != a.decide {
		t.Error("Decide() is not DecideScript's source")
	}
	if l, _ := Lease(); l != a.lease || !strings.Contains(l, "local function ls_window_take(") {
		t.Error("Lease() is not LeaseScript's source, or lacks lease.lua")
	}
	lib := Library()
	if !regexp.MustCompile(`^rategate_[0-9a-f]{12}$`).MatchString(lib.Name) ||
		lib.Decide != lib.Name+"_decide" || lib.DecideMany != lib.Name+"_decide_many" || lib.Refund != lib.Name+"_refund" {
		t.Fatalf("library names %q, %q, %q, %q", lib.Name, lib.Decide, lib.DecideMany, lib.Refund)
	}
	if !strings.HasPrefix(lib.Source, "#!lua name="+lib.Name+"\n") {
		t.Fatalf("library source starts %q", lib.Source[:40])
	}
	for i, a := range algorithmFiles {
		if Code(a.fn) != i+1 {
			t.Errorf("Code(%q) = %d, want %d", a.fn, Code(a.fn), i+1)
		}
	}
	if Code("leaky_bucket") != 0 {
		t.Error("an unknown algorithm has a code")
	}
}

// TestLibraryVersionFollowsSources: any change to any source, a comment
// included, gives the library another name; the same sources the same one.
func TestLibraryVersionFollowsSources(t *testing.T) {
	base, err := build(Source)
	if err != nil {
		t.Fatal(err)
	}
	again, err := build(Source)
	if err != nil {
		t.Fatal(err)
	}
	if again.lib != base.lib {
		t.Fatal("the same sources built two different libraries")
	}
	names := map[string]string{base.lib.Name: "embedded"}
	files := []string{"decide.lua", "decide_many.lua", "refund.lua"}
	for _, a := range algorithmFiles {
		files = append(files, a.file)
	}
	for _, f := range files {
		for _, edit := range []struct{ what, add string }{{"a comment", "\n-- one more comment\n"}, {"code", "\nlocal rg_unused = 1\n"}} {
			changed, err := build(func(name string) (string, error) {
				src, err := Source(name)
				if name == f {
					if cut := strings.Index(src, standaloneMarker); cut >= 0 {
						src = src[:cut] + edit.add + src[cut:]
					} else {
						src += edit.add
					}
				}
				return src, err
			})
			if err != nil {
				t.Fatalf("%s with %s added: %v", f, edit.what, err)
			}
			what := f + " with " + edit.what + " added"
			if prev, dup := names[changed.lib.Name]; dup {
				t.Fatalf("%s keeps the library name %s of %s", what, changed.lib.Name, prev)
			}
			names[changed.lib.Name] = what
		}
	}
}

// TestBuildRefusesBrokenSources: a missing function or marker is an error,
// never a script that fails in Redis.
func TestBuildRefusesBrokenSources(t *testing.T) {
	for _, tc := range []struct {
		file, from, to, want string
	}{
		{"gcra.lua", "local function gcra_put(", "local function gcra_store(", "defines gcra_put 0 times"},
		{"fixed_window.lua", standaloneMarker, "-- standalone", "has no"},
		{"sliding_log.lua", "local function sl_int(x)", "--[[ x ]] local function sl_int(x)", "block comment"},
	} {
		_, err := build(func(name string) (string, error) {
			src, err := Source(name)
			if name == tc.file {
				src = strings.Replace(src, tc.from, tc.to, 1)
			}
			return src, err
		})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s with %q for %q: error %v, want one with %q", tc.file, tc.to, tc.from, err, tc.want)
		}
	}
}

// decideArgv is decide.lua's ARGV for checks {code, limit, period, burst, cost}.
func decideArgv(now int64, checks ...[5]int64) []any {
	args := []any{now}
	for _, c := range checks {
		args = append(args, c[0], c[1], c[2], c[3], c[4], 0)
	}
	return args
}

// TestLibraryMatchesScript: FCALL of the library's functions answers
// exactly what EVALSHA of the scripts answers, call for call, with the same
// KEYS and ARGV, for every algorithm alone, all five in one call, cost-0
// looks, denials, a shadow check, a refund and an unknown code.
func TestLibraryMatchesScript(t *testing.T) {
	client := testredis.Start(t).Client(t)
	ctx := context.Background()
	lib := Library()
	if got, err := client.FunctionLoadReplace(ctx, lib.Source).Result(); err != nil || got != lib.Name {
		t.Fatalf("FUNCTION LOAD REPLACE: %q, %v", got, err)
	}
	now := time.Now().UnixMicro()
	period := int64(10_000_000)
	var all [][5]int64
	for i := range algorithmFiles {
		all = append(all, [5]int64{int64(i + 1), 5, period, 3, 1})
	}
	// The same calls against two key spaces: "s" through EVALSHA, "f" through FCALL.
	keys := func(space string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("rg:{%s}:k%d", space, i)
		}
		return out
	}
	compare := func(what string, viaScript, viaFunction *redis.Cmd) {
		t.Helper()
		a, aerr := viaScript.Result()
		b, berr := viaFunction.Result()
		if fmt.Sprint(aerr) != fmt.Sprint(berr) || !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: EVALSHA %v (%v), FCALL %v (%v)", what, a, aerr, b, berr)
		}
	}
	for step := int64(0); step < 12; step++ {
		at := now + step*700_000
		for i, c := range all {
			cost := [5]int64{c[0], c[1], c[2], c[3], step % 3}
			compare(fmt.Sprintf("step %d, %s alone", step, algorithmFiles[i].fn),
				DecideScript.Run(ctx, client, keys("s", 5)[i:i+1], decideArgv(at, cost)...),
				client.FCall(ctx, lib.Decide, keys("f", 5)[i:i+1], decideArgv(at, cost)...))
		}
		args := decideArgv(at, all...)
		if step%4 == 3 {
			args[len(args)-1] = 1 // the last check is a shadow
		}
		compare(fmt.Sprintf("step %d, all five", step),
			DecideScript.Run(ctx, client, keys("s", 5), args...),
			client.FCall(ctx, lib.Decide, keys("f", 5), args...))
	}
	// A refund of a commit: two admitted fixed_window requests of cost 2,
	// then the second refunded (ARGV: now, marker TTL ms, then per key code,
	// limit, period, burst, cost, and the commit's at, remaining, reset).
	at := now + 20*700_000
	fw := [5]int64{1, 5, period, 5, 2}
	for _, space := range []string{"s", "f"} {
		key := "rg:{" + space + "}:refund"
		var reply []int64
		for i := 0; i < 2; i++ {
			var err error
			if space == "s" {
				reply, err = DecideScript.Run(ctx, client, []string{key}, decideArgv(at, fw)...).Int64Slice()
			} else {
				reply, err = client.FCall(ctx, lib.Decide, []string{key}, decideArgv(at, fw)...).Int64Slice()
			}
			if err != nil || reply[0] != 1 {
				t.Fatalf("%s: commit %d: %v %v", space, i, reply, err)
			}
		}
		args := []any{at + 1000, 5000, fw[0], fw[1], fw[2], fw[3], fw[4], at, reply[3], reply[4]}
		var got []int64
		var err error
		if space == "s" {
			got, err = RefundScript.Run(ctx, client, []string{key, "rg:{s}:refund:1"}, args...).Int64Slice()
		} else {
			got, err = client.FCall(ctx, lib.Refund, []string{key, "rg:{f}:refund:1"}, args...).Int64Slice()
		}
		// reply: now, then allowed, remaining, reset, retry of a look: 2 of 5 used
		if err != nil || len(got) != 5 || got[1] != 1 || got[2] != 3 {
			t.Fatalf("%s: refund answered %v, %v; want 3 remaining", space, got, err)
		}
	}
	if a, b := testredis.KeyState(t, client, "rg:{s}:refund"), testredis.KeyState(t, client, "rg:{f}:refund"); a != b || fwCount(t, client, "rg:{s}:refund") != "2" {
		t.Fatalf("after the refund: script state %v, function state %v, want n=2 in both", a, b)
	}
	compare("unknown code", DecideScript.Run(ctx, client, []string{"rg:{s}:x"}, decideArgv(now, [5]int64{9, 1, 1, 1, 1})...),
		client.FCall(ctx, lib.Decide, []string{"rg:{f}:x"}, decideArgv(now, [5]int64{9, 1, 1, 1, 1})...))
	// Both key spaces hold the same state.
	for i := 0; i < 5; i++ {
		a := testredis.KeyState(t, client, keys("s", 5)[i])
		b := testredis.KeyState(t, client, keys("f", 5)[i])
		if a != b || a == "none" {
			t.Fatalf("key %d: script state %v, function state %v", i, a, b)
		}
	}
}

// TestLibraryGlobalsAsLocals: the library's code reaches libGlobals only
// through their locals, every registered function sets them before
// anything else, and each of the three functions works as the first call
// after a load (when the locals are still unset).
func TestLibraryGlobalsAsLocals(t *testing.T) {
	lib := Library()
	for _, g := range libGlobals {
		if regexp.MustCompile(`(?:^|[^\w.])` + regexp.QuoteMeta(g[0]+"(")).MatchString(lib.Source) {
			t.Errorf("the library still calls %s", g[0])
		}
	}
	drivers := regexp.MustCompile(`(?m)^local function (rg_\w+)\(KEYS, ARGV\)\n(.*)\n`).FindAllStringSubmatch(lib.Source, -1)
	if len(drivers) != 3 {
		t.Fatalf("%d registered functions found, want 3", len(drivers))
	}
	for _, d := range drivers {
		if d[2]+"\n" != libEntry {
			t.Errorf("%s starts with %q, want %q", d[1], d[2], libEntry)
		}
	}

	client := testredis.Start(t).Client(t)
	ctx := context.Background()
	now := time.Now().UnixMicro()
	fw := [5]int64{1, 5, 10_000_000, 5, 1}
	for _, first := range []struct {
		name string
		call func() error
	}{
		{"decide", func() error {
			return client.FCall(ctx, lib.Decide, []string{"rg:{g}:d"}, decideArgv(now, fw)...).Err()
		}},
		{"decide_many", func() error {
			keys, args := manyArgs(inSpace("g"), []manyDecision{{[]string{"m1", "m2"}, decideArgv(now, fw, fw)}})
			return client.FCall(ctx, lib.DecideMany, keys, args...).Err()
		}},
		{"refund", func() error {
			return client.FCall(ctx, lib.Refund, []string{"rg:{g}:r", "rg:{g}:r:1"}, now, 5000, fw[0], fw[1], fw[2], fw[3], fw[4], now, 4, 1000).Err()
		}},
	} {
		if err := client.FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := client.FunctionLoadReplace(ctx, lib.Source).Err(); err != nil {
			t.Fatal(err)
		}
		if err := first.call(); err != nil {
			t.Errorf("%s as the first call after FUNCTION LOAD: %v", first.name, err)
		}
	}
}

// TestLibLocals: only calls of the globals themselves are rewritten, nested
// ones too; a field, a method or a longer name that ends the same is not.
func TestLibLocals(t *testing.T) {
	in := "tonumber(a) + obj.tonumber(b) + s:tonumber(c) + my_tonumber(d) + math.max(math.ceil(e), math.min(1, 2))\n" +
		"redis.call('HSET', k, 'c', string.format('%d', tonumber(x)))"
	want := "rg_tonumber(a) + obj.tonumber(b) + s:tonumber(c) + my_tonumber(d) + rg_max(rg_ceil(e), rg_min(1, 2))\n" +
		"rg_call('HSET', k, 'c', rg_format('%d', rg_tonumber(x)))"
	if got := libLocals(in); got != want {
		t.Fatalf("libLocals:\n got %s\nwant %s", got, want)
	}
}

// TestOneTimePerDecision: a decision on the Redis clock asks TIME once,
// however many checks it holds, through EVALSHA and FCALL alike.
func TestOneTimePerDecision(t *testing.T) {
	client := testredis.Start(t).Client(t)
	ctx := context.Background()
	lib := Library()
	if err := client.FunctionLoadReplace(ctx, lib.Source).Err(); err != nil {
		t.Fatal(err)
	}
	var checks [][5]int64
	for i := range algorithmFiles {
		checks = append(checks, [5]int64{int64(i + 1), 100, 60_000_000, 100, 1})
	}
	keys := []string{"rg:{t}:a", "rg:{t}:b", "rg:{t}:c", "rg:{t}:d", "rg:{t}:e"}
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const calls = 20
	for i := 0; i < calls; i++ {
		if err := DecideScript.Run(ctx, client, keys, decideArgv(0, checks...)...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := client.FCall(ctx, lib.Decide, keys[:1], decideArgv(0, checks[0])...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	info := client.Info(ctx, "commandstats").Val()
	m := regexp.MustCompile(`cmdstat_time:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		t.Fatalf("no TIME in INFO commandstats:\n%s", info)
	}
	if n, _ := strconv.Atoi(m[1]); n != 2*calls {
		t.Fatalf("%d TIME calls for %d decisions, want one each", n, 2*calls)
	}
}

// TestLibraryOnCluster: the library loads on every primary of a real Redis
// Cluster and FCALL through a cluster client (routed by its first key, like
// EVALSHA) answers every call exactly as the script does, for keys of many
// slots and for several checks in one slot.
func TestLibraryOnCluster(t *testing.T) {
	c := testredis.StartCluster(t)
	cc := c.Client(t)
	ctx := testredis.Ctx(t)
	lib := Library()
	if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.FunctionLoadReplace(ctx, lib.Source).Err()
	}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMicro()
	checks := [][5]int64{{1, 3, 60_000_000, 3, 1}, {3, 3, 60_000_000, 3, 1}, {4, 2, 1_000_000, 3, 1}}
	for i := 0; i < 60; i++ {
		tag := fmt.Sprintf("id%d", i%15) // 15 hash tags, spread over the slots
		keys := func(space string) []string {
			return []string{"rg:{" + space + tag + "}:fw", "rg:{" + space + tag + "}:sw", "rg:{" + space + tag + "}:gc"}
		}
		args := decideArgv(now+int64(i)*1000, checks...)
		a, aerr := DecideScript.Run(ctx, cc, keys("s"), args...).Int64Slice()
		b, berr := cc.FCall(ctx, lib.Decide, keys("f"), args...).Int64Slice()
		if aerr != nil || berr != nil || !reflect.DeepEqual(a, b) {
			t.Fatalf("call %d (%s): EVALSHA %v (%v), FCALL %v (%v)", i, tag, a, aerr, b, berr)
		}
	}
}

// TestRecordLayouts: an algorithm whose table row names a string record
// packs and unpacks exactly that many doubles, everywhere its file (and
// lease.lua, which writes records through the algorithms' own functions)
// touches the record, except where it rewrites some of its fields in place
// (SETRANGE at a field's byte offset, whole fields inside the record); one
// whose row names none packs nothing.
func TestRecordLayouts(t *testing.T) {
	format := regexp.MustCompile(`struct\.(?:un)?pack\('([^']*)'`)
	partial := regexp.MustCompile(`redis\.call\('SETRANGE', key, '(\d+)', struct\.pack\('([^']*)'`)
	for _, info := range limits.AlgorithmTable() {
		src, err := Source(string(info.Name) + ".lua")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range partial.FindAllStringSubmatch(src, -1) {
			off, _ := strconv.Atoi(m[1])
			n := strings.Count(m[2], "d")
			if m[2] != "<"+strings.Repeat("d", n) || off%8 != 0 || off/8+n > len(info.Record) {
				t.Errorf("%s rewrites %q at byte %d, which is not whole fields of its record %v", info.Name, m[2], off, info.Record)
			}
		}
		src = partial.ReplaceAllString(src, "")
		found := format.FindAllStringSubmatch(src, -1)
		if info.Record == nil {
			if len(found) > 0 {
				t.Errorf("%s packs %q, but its table row names no record", info.Name, found[0][1])
			}
			continue
		}
		want := "<" + strings.Repeat("d", len(info.Record))
		if len(found) == 0 {
			t.Errorf("%s: no struct.pack or struct.unpack of its record %v", info.Name, info.Record)
		}
		for _, f := range found {
			if f[1] != want {
				t.Errorf("%s uses the format %q, want %q for its record %v", info.Name, f[1], want, info.Record)
			}
		}
	}
	if lease, _ := Source("lease.lua"); format.MatchString(lease) {
		t.Error("lease.lua packs a record itself; it must write through the algorithm's functions")
	}
}
