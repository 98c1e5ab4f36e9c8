package admin

import (
	"fmt"
	"math"
	"strconv"
	"sync/atomic"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"
)

// maxProfileSeconds bounds the seconds of a CPU profile or an execution
// trace: each holds an admin connection (and, for the trace, costs the
// service) for that long.
const maxProfileSeconds = 600

// cpuProfiling and tracing are set while a CPU profile or a trace runs.
// The Go runtime runs one of each per process at a time (it refuses a
// second, which net/http/pprof answers with a 500).
var cpuProfiling, tracing atomic.Bool

// servePprof serves Go's runtime profiles, as net/http/pprof does:
//
//	go tool pprof http://127.0.0.1:9090/debug/pprof/profile?seconds=10
//	go tool pprof http://127.0.0.1:9090/debug/pprof/heap
//
// They are off unless rategate runs with -pprof: they reveal internals and
// a CPU profile or trace costs the service while it runs. The admin
// listener's token and loopback default protect them like the rest.
//
// A CPU profile or trace is asked for with GET, for a whole number of
// seconds (a trace: any positive number) up to maxProfileSeconds, one at a
// time: net/http/pprof would run its default length on a seconds it cannot
// read, and answer a second one with a 500.
func (s *Server) servePprof(ctx *fasthttp.RequestCtx, path string) {
	if !s.pprof {
		writeError(ctx, fasthttp.StatusNotFound, "profiling is off: start rategate with -pprof (env RATEGATE_PPROF=1) to serve "+path, nil)
		return
	}
	if path == "/debug/pprof" {
		ctx.Redirect("/debug/pprof/", fasthttp.StatusMovedPermanently)
		return
	}
	var running *atomic.Bool
	switch path {
	case "/debug/pprof/profile":
		running = &cpuProfiling
	case "/debug/pprof/trace":
		running = &tracing
	}
	if running != nil {
		if !allow(ctx, string(ctx.Method()), "GET") {
			return
		}
		if msg := badSeconds(ctx.QueryArgs(), running == &tracing); msg != "" {
			writeError(ctx, fasthttp.StatusBadRequest, msg, nil)
			return
		}
		if !running.CompareAndSwap(false, true) {
			writeError(ctx, fasthttp.StatusConflict, path+" is already running (one at a time): ask again when it ends", nil)
			return
		}
		defer running.Store(false)
	}
	pprofhandler.PprofHandler(ctx)
}

// badSeconds checks the seconds parameter of a CPU profile (a whole
// number) or a trace (fraction true: any number), and returns what is
// wrong with it, or "" (absent: net/http/pprof's default, 30 and 1).
func badSeconds(args *fasthttp.Args, fraction bool) string {
	vals := args.PeekMulti("seconds")
	if len(vals) == 0 {
		return ""
	}
	if len(vals) > 1 {
		return "seconds is given more than once"
	}
	want := fmt.Sprintf("seconds must be a whole number from 1 to %d", maxProfileSeconds)
	if fraction {
		want = fmt.Sprintf("seconds must be a number above 0, at most %d", maxProfileSeconds)
	}
	v := string(vals[0])
	if fraction {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || f <= 0 || f > maxProfileSeconds {
			return fmt.Sprintf("%s, not %q", want, v)
		}
		return ""
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 || n > maxProfileSeconds {
		return fmt.Sprintf("%s, not %q", want, v)
	}
	return ""
}
