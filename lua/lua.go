// Package lua embeds rategate's Redis scripts and builds, from the same
// sources, everything rategate runs in Redis: the multi-rule decide script,
// the refund script (Redis Cluster), the lease script (rules with lease:
// true), and a Redis Functions library holding decide, decide_many and
// refund.
//
// Each lua/<algorithm>.lua runs on its own with redis-cli --eval: its
// functions stand above a "-- @standalone" line, a small main below it. The
// builders take the part above the line and join it with a driver
// (decide.lua, decide_many.lua, refund.lua, lease.lua). decide.lua and
// decide_many.lua split the same way at a "-- @driver" line: the functions
// above it go to the top level (of the script, of the library), the body
// below it into the script's main or the library's function.
package lua

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/rategate/rategate/limits"
	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

const (
	standaloneMarker = "-- @standalone"
	driverMarker     = "-- @driver"
)

// Source returns the full text of one embedded script.
func Source(name string) (string, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("lua: %w", err)
	}
	return string(b), nil
}

// FunctionLibrary is decide.lua, decide_many.lua and refund.lua as one
// Redis Functions library (Redis >= 7): load it once per server with
// FUNCTION LOAD REPLACE, then FCALL Decide (or Refund) with exactly the
// KEYS and ARGV of the script, for exactly its reply. Unlike EVALSHA, which
// runs a script's whole top level (every function definition) on each
// call, FCALL runs only the function.
type FunctionLibrary struct {
	// Name is "rategate_<version>", the version 12 hex digits of a hash of
	// the sources (comments included) and the library's code: it changes
	// whenever any of them does, so two rategate versions never replace
	// each other's library.
	Name string
	// Source is the library's code, "#!lua name=<Name>" first.
	Source string
	// Decide, DecideMany and Refund are the function names: Name +
	// "_decide", "_decide_many" and "_refund" (function names are global on
	// a server). DecideMany takes several decisions in one call
	// (decide_many.lua; DecideManyScript is its twin).
	Decide, DecideMany, Refund string
}

// built is everything the package assembles from the embedded sources,
// once: they are fixed at compile time, and TestBuild checks they assemble.
var built = mustBuild()

// The scripts, ready to run with Script.Run (EVALSHA, EVAL on NOSCRIPT).
var (
	// DecideScript decides one request's checks all-or-nothing (decide.lua).
	DecideScript = redis.NewScript(built.decide)
	// DecideManyScript is the library's decide_many as a script, for
	// servers that do not run functions: several requests' decisions in
	// one call, each exactly as DecideScript would (decide_many.lua).
	DecideManyScript = redis.NewScript(built.decideMany)
	// RefundScript gives back what admitted slots of a denied request took
	// on Redis Cluster (refund.lua).
	RefundScript = redis.NewScript(built.refund)
	// LeaseScript takes, returns, resets and shows the slices of a leased
	// key's quota (lease.lua).
	LeaseScript = redis.NewScript(built.lease)
)

// Decide returns the source of DecideScript.
func Decide() (string, error) { return built.decide, nil }

// Refund returns the source of RefundScript.
func Refund() (string, error) { return built.refund, nil }

// DecideMany returns the source of DecideManyScript.
func DecideMany() (string, error) { return built.decideMany, nil }

// Lease returns the source of LeaseScript.
func Lease() (string, error) { return built.lease, nil }

// Library returns the decide, decide_many and refund functions as a
// function library.
func Library() FunctionLibrary { return built.lib }

type assembly struct {
	decide, decideMany, refund, lease string
	lib                               FunctionLibrary
}

func mustBuild() assembly {
	a, err := build(Source)
	if err != nil {
		panic(err)
	}
	return a
}

// source reads one script by file name; Source, or another set in tests.
type source func(name string) (string, error)

// strip drops the lines that hold only a comment, and blank lines, from a
// part of an assembled script: the assembled scripts are for Redis (the
// sources, with their comments, are the files), and a script's whole text
// is sent again on every EVAL that follows a NOSCRIPT. Lines that hold code
// keep their trailing comments. Block comments are refused: a line-wise cut
// could break them.
func strip(name, src string) (string, error) {
	var sb strings.Builder
	for _, line := range strings.Split(src, "\n") {
		t := strings.TrimSpace(line)
		if strings.Contains(t, "--[[") || strings.Contains(t, "--[=") {
			return "", fmt.Errorf("lua: %s has a block comment; the builder strips comments line by line", name)
		}
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		sb.WriteString(line)
		sb.WriteString("\n")
	}
	return sb.String(), nil
}

// splitDriver cuts a driver file at its "@driver" line: the functions
// above it, the body below, each stripped of comments.
func splitDriver(name, src string) (fns, drv string, err error) {
	cut := strings.Index(src, driverMarker)
	if cut < 0 {
		return "", "", fmt.Errorf("lua: %s has no %q line", name, driverMarker)
	}
	if fns, err = strip(name, src[:cut]); err != nil {
		return "", "", err
	}
	drv, err = strip(name, src[cut:])
	return fns, drv, err
}

// algorithm is one algorithm file's functions.
type algorithm struct {
	code int
	fn   string
	body string // the part above "@standalone"
}

// algorithmParts reads every algorithm file and checks that it defines the
// three functions the drivers call.
func algorithmParts(read source) ([]algorithm, error) {
	var out []algorithm
	for _, info := range limits.AlgorithmTable() {
		a := struct{ file, fn string }{string(info.Name) + ".lua", string(info.Name)}
		src, err := read(a.file)
		if err != nil {
			return nil, err
		}
		cut := strings.Index(src, standaloneMarker)
		if cut < 0 {
			return nil, fmt.Errorf("lua: %s has no %q line", a.file, standaloneMarker)
		}
		body, err := strip(a.file, src[:cut])
		if err != nil {
			return nil, err
		}
		for _, f := range []string{a.fn, a.fn + "_put", a.fn + "_refund"} {
			if n := strings.Count(body, "local function "+f+"("); n != 1 {
				return nil, fmt.Errorf("lua: %s defines %s %d times above its %q line, want once", a.file, f, n, standaloneMarker)
			}
		}
		out = append(out, algorithm{code: info.Code, fn: a.fn, body: body})
	}
	return out, nil
}

// dispatch writes rg_algorithms and rg_puts, each algorithm's function and
// its put by code (nil for one a script leaves undefined).
func dispatch(sb *strings.Builder, algos []algorithm) {
	var fns, puts []string
	for _, a := range algos {
		fns = append(fns, fmt.Sprintf("[%d] = %s", a.code, a.fn))
		puts = append(puts, fmt.Sprintf("[%d] = %s_put", a.code, a.fn))
	}
	fmt.Fprintf(sb, "local rg_algorithms = {%s}\n", strings.Join(fns, ", "))
	fmt.Fprintf(sb, "local rg_puts = {%s}\n\n", strings.Join(puts, ", "))
}

// refundDriver returns refund.lua with its two tables filled in.
func refundDriver(read source, algos []algorithm) (string, error) {
	drv, err := read("refund.lua")
	if err != nil {
		return "", err
	}
	if drv, err = strip("refund.lua", drv); err != nil {
		return "", err
	}
	var at, rt []string
	for _, a := range algos {
		at = append(at, fmt.Sprintf("[%d] = %s", a.code, a.fn))
		rt = append(rt, fmt.Sprintf("[%d] = %s_refund", a.code, a.fn))
	}
	if !strings.Contains(drv, "ALGORITHM_TABLE") || !strings.Contains(drv, "REFUND_TABLE") {
		return "", fmt.Errorf("lua: refund.lua lacks its ALGORITHM_TABLE or REFUND_TABLE")
	}
	drv = strings.Replace(drv, "ALGORITHM_TABLE", strings.Join(at, ", "), 1)
	return strings.Replace(drv, "REFUND_TABLE", strings.Join(rt, ", "), 1), nil
}

// libGlobals are the globals the library's code reaches through locals
// instead: a global is a table lookup on every use, and these are used on
// every decision (BenchmarkShipping: about 4% of Redis's time per decision
// in batches, sliding_window 4.44 → 4.23 µs, gcra 5.99 → 5.66, three
// sliding_window rules 12.4 → 11.75). The library's top level runs at
// FUNCTION LOAD, where Redis offers none of them, so the locals are
// declared there (libPrelude) and every registered function sets them
// first (libEntry). The sources keep the plain names: they run as they
// are under redis-cli --eval, and the scripts use them as they are.
var libGlobals = [][2]string{
	{"redis.call", "rg_call"},
	{"tonumber", "rg_tonumber"},
	{"math.floor", "rg_floor"},
	{"math.ceil", "rg_ceil"},
	{"math.max", "rg_max"},
	{"math.min", "rg_min"},
	{"string.format", "rg_format"},
	{"struct.pack", "rg_pack"},
	{"struct.unpack", "rg_unpack"},
}

var libPrelude, libEntry, libCalls = func() (string, string, *regexp.Regexp) {
	var globals, locals, quoted []string
	for _, g := range libGlobals {
		globals, locals = append(globals, g[0]), append(locals, g[1])
		quoted = append(quoted, regexp.QuoteMeta(g[0]))
	}
	// a call of one of them: the name, not the tail of a longer name or a
	// field or method of something else, then "("
	calls := regexp.MustCompile(`(^|[^\w.:])(` + strings.Join(quoted, "|") + `)\(`)
	return "local " + strings.Join(locals, ", ") + "\n",
		strings.Join(locals, ", ") + " = " + strings.Join(globals, ", ") + "\n",
		calls
}()

// libLocals rewrites code's calls of libGlobals as calls of their locals.
func libLocals(code string) string {
	local := map[string]string{}
	for _, g := range libGlobals {
		local[g[0]] = g[1]
	}
	// Matches do not overlap, so in f(g(x)) the "(" before g belongs to
	// f's match: run again until nothing is left.
	for {
		next := libCalls.ReplaceAllStringFunc(code, func(m string) string {
			sub := libCalls.FindStringSubmatch(m)
			return sub[1] + local[sub[2]] + "("
		})
		if next == code {
			return code
		}
		code = next
	}
}

func build(readFile source) (assembly, error) {
	// The library's version hashes every source read, comments included.
	sources := sha1.New()
	read := func(name string) (string, error) {
		src, err := readFile(name)
		fmt.Fprintf(sources, "%s %d\n%s", name, len(src), src)
		return src, err
	}
	algos, err := algorithmParts(read)
	if err != nil {
		return assembly{}, err
	}
	// records.lua's rg_hold, which the algorithms call, comes first in
	// everything assembled.
	records, err := read("records.lua")
	if err != nil {
		return assembly{}, err
	}
	if records, err = strip("records.lua", records); err != nil {
		return assembly{}, err
	}
	decideSrc, err := read("decide.lua")
	if err != nil {
		return assembly{}, err
	}
	// decide.lua's functions (rg_one, rg_all) stand above its "@driver"
	// line, its driver below.
	decideFns, decideDrv, err := splitDriver("decide.lua", decideSrc)
	if err != nil {
		return assembly{}, err
	}
	// The scripts' copy never writes a check at once (decide.lua's
	// rg_careful says why); the library's learns.
	const careful = "local rg_careful = 0\n"
	if n := strings.Count(decideFns, careful); n != 1 {
		return assembly{}, fmt.Errorf("lua: decide.lua declares %q %d times, want once", careful, n)
	}
	scriptFns := strings.Replace(decideFns, careful, "local rg_careful = math.huge\n", 1)
	refundDrv, err := refundDriver(read, algos)
	if err != nil {
		return assembly{}, err
	}
	// decide_many.lua too: its helpers above the line, at the library's
	// top level; its body below, the function's.
	manySrc, err := read("decide_many.lua")
	if err != nil {
		return assembly{}, err
	}
	manyFns, manyDrv, err := splitDriver("decide_many.lua", manySrc)
	if err != nil {
		return assembly{}, err
	}

	// The decide script: its checks' algorithm codes are every sixth
	// argument from the second.
	var d strings.Builder
	d.WriteString("-- rategate decide script, assembled by lua.go from lua/*.lua (their comments explain it).\n")
	d.WriteString(records)
	lazyAlgorithms(&d, algos, "for i = 2, #ARGV, 6 do")
	d.WriteString(scriptFns)
	d.WriteString(decideDrv)

	// The decide_many script, for servers that do not run functions: the
	// library's decide_many as a script, its codes in its shapes (every
	// sixth argument from the fourth, r of them; the body checks r).
	var dm strings.Builder
	dm.WriteString("-- rategate decide_many script, assembled by lua.go from lua/*.lua (their comments explain it).\n")
	dm.WriteString(records)
	lazyAlgorithms(&dm, algos, "for i = 4, 3 + 6 * math.min(tonumber(ARGV[2]) or 0, (#ARGV - 3) / 6), 6 do")
	dm.WriteString(scriptFns)
	dm.WriteString(manyFns)
	dm.WriteString(manyDrv)

	var r strings.Builder
	r.WriteString("-- rategate refund script, assembled by lua.go from lua/*.lua (their comments explain it).\n")
	r.WriteString(records)
	for _, a := range algos {
		r.WriteString(a.body)
		r.WriteString("\n")
	}
	r.WriteString(refundDrv)

	// The lease script: every algorithm (a call names one), then the
	// driver. It is not part of the library (not read through read: its
	// changes do not rename the library).
	leaseDrv, err := readFile("lease.lua")
	if err != nil {
		return assembly{}, err
	}
	if leaseDrv, err = strip("lease.lua", leaseDrv); err != nil {
		return assembly{}, err
	}
	var ls strings.Builder
	ls.WriteString("-- rategate lease script, assembled by lua.go from lua/*.lua (their comments explain it).\n")
	ls.WriteString(records)
	for _, a := range algos {
		ls.WriteString(a.body)
		ls.WriteString("\n")
	}
	ls.WriteString(leaseDrv)

	// The library: every algorithm once, at load; the drivers as functions
	// whose parameters are named like the globals a script sees, each
	// starting with libEntry (see libGlobals).
	var l strings.Builder
	l.WriteString(libPrelude)
	l.WriteString(records)
	for _, a := range algos {
		l.WriteString(a.body)
		l.WriteString("\n")
	}
	dispatch(&l, algos)
	l.WriteString(decideFns)
	l.WriteString(manyFns)
	l.WriteString("local function rg_decide(KEYS, ARGV)\n" + libEntry)
	l.WriteString(decideDrv)
	l.WriteString("end\n\nlocal function rg_decide_many(KEYS, ARGV)\n" + libEntry)
	l.WriteString(manyDrv)
	l.WriteString("end\n\nlocal function rg_refund(KEYS, ARGV)\n" + libEntry)
	l.WriteString(refundDrv)
	l.WriteString("end\n\n")
	code := libLocals(l.String())
	sources.Write([]byte(code))
	lib := FunctionLibrary{Name: "rategate_" + hex.EncodeToString(sources.Sum(nil)[:6])}
	lib.Decide, lib.DecideMany, lib.Refund = lib.Name+"_decide", lib.Name+"_decide_many", lib.Name+"_refund"
	lib.Source = fmt.Sprintf("#!lua name=%s\n-- rategate function library, assembled by lua.go from lua/*.lua (their comments explain it).\n%s"+
		"redis.register_function('%s', rg_decide)\nredis.register_function('%s', rg_decide_many)\nredis.register_function('%s', rg_refund)\n",
		lib.Name, code, lib.Decide, lib.DecideMany, lib.Refund)

	return assembly{decide: d.String(), decideMany: dm.String(), refund: r.String(), lease: ls.String(), lib: lib}, nil
}

// lazyAlgorithms writes the algorithms and their dispatch so that a
// script defines only those its call uses: Redis runs a script's whole top
// level on every EVALSHA, and each function definition is an allocation.
// Each algorithm's part sits in a block that runs only when its code is
// among the arguments loop visits (a Lua for line; the loop's body reads
// ARGV[i]), its functions assigned to locals declared outside the block.
func lazyAlgorithms(sb *strings.Builder, algos []algorithm, loop string) {
	var used, scan []string
	for _, a := range algos {
		used = append(used, fmt.Sprintf("rg_u%d", a.code))
		scan = append(scan, fmt.Sprintf("c == %d then rg_u%d = true", a.code, a.code))
	}
	fmt.Fprintf(sb, "local %s\n%s\n  local c = tonumber(ARGV[i])\n  if %s end\nend\n\n",
		strings.Join(used, ", "), loop, strings.Join(scan, " elseif "))
	for _, a := range algos {
		fmt.Fprintf(sb, "local %[1]s, %[1]s_put\nif rg_u%[2]d then\n", a.fn, a.code)
		body := a.body
		for _, f := range []string{a.fn, a.fn + "_put"} {
			body = strings.Replace(body, "local function "+f+"(", "function "+f+"(", 1)
		}
		sb.WriteString(body)
		sb.WriteString("end\n\n")
	}
	dispatch(sb, algos)
}
