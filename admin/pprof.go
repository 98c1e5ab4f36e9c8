package admin

import (
	"fmt"
	"math"
	"net/url"
	"strconv"
	"sync/atomic"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"
)

// maxProfileSeconds bounds the seconds of a CPU profile or of a delta
// profile (heap?seconds=N...): each holds an admin connection that long,
// and a CPU profile costs the service while it runs. maxTraceSeconds
// bounds an execution trace's, which costs more and whose output is held
// in memory whole until it ends (fasthttp's adaptor buffers the answer).
const (
	maxProfileSeconds = 600
	maxTraceSeconds   = 60
)

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
// A CPU profile or trace is asked for with GET, one at a time (the
// runtime runs one of each per process; net/http/pprof answers a second
// with a 500). seconds, wherever it is given, is checked as net/http/pprof
// will read it (from the request line as sent: fasthttp's own query ends
// at a '#', pprof's does not): a whole number from 1 to
// maxProfileSeconds, for a trace a number above 0 up to maxTraceSeconds
// (net/http/pprof would run its default length on one it cannot read).
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
	if running != nil && !allow(ctx, string(ctx.Method()), "GET") {
		return
	}
	u, err := url.ParseRequestURI(string(ctx.RequestURI()))
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "cannot read the request target: "+err.Error(), nil)
		return
	}
	if msg := badSeconds(u.Query()["seconds"], running == &tracing); msg != "" {
		writeError(ctx, fasthttp.StatusBadRequest, msg, nil)
		return
	}
	if running != nil {
		if !running.CompareAndSwap(false, true) {
			writeError(ctx, fasthttp.StatusConflict, path+" is already running (one at a time): ask again when it ends", nil)
			return
		}
		defer running.Store(false)
	}
	pprofhandler.PprofHandler(ctx)
}

// badSeconds checks the values of the seconds parameter (nil: absent,
// net/http/pprof's default) and returns what is wrong with them, or "". A
// trace's (trace true) is any number above 0 up to maxTraceSeconds, any
// other a whole number from 1 to maxProfileSeconds.
func badSeconds(vals []string, trace bool) string {
	if len(vals) == 0 {
		return ""
	}
	if len(vals) > 1 {
		return "seconds is given more than once"
	}
	v := vals[0]
	if trace {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || f <= 0 || f > maxTraceSeconds {
			return fmt.Sprintf("seconds of a trace must be a number above 0, at most %d, not %q", maxTraceSeconds, v)
		}
		return ""
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 || n > maxProfileSeconds {
		return fmt.Sprintf("seconds must be a whole number from 1 to %d, not %q", maxProfileSeconds, v)
	}
	return ""
}
