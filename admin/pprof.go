package admin

import (
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"
)

// servePprof serves Go's runtime profiles, as net/http/pprof does:
//
//	go tool pprof http://127.0.0.1:9090/debug/pprof/profile?seconds=10
//	go tool pprof http://127.0.0.1:9090/debug/pprof/heap
//
// They are off unless rategate runs with -pprof: they reveal internals and
// a CPU profile or trace costs the service while it runs. The admin
// listener's token and loopback default protect them like the rest.
func (s *Server) servePprof(ctx *fasthttp.RequestCtx, path string) {
	if !s.pprof {
		writeError(ctx, fasthttp.StatusNotFound, "profiling is off: start rategate with -pprof (env RATEGATE_PPROF=1) to serve "+path, nil)
		return
	}
	if path == "/debug/pprof" {
		ctx.Redirect("/debug/pprof/", fasthttp.StatusMovedPermanently)
		return
	}
	pprofhandler.PprofHandler(ctx)
}
