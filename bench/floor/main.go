// Command floor is the do-nothing service of rategate's load benchmark: a
// fasthttp server that answers 204 No Content to any request on any path
// and does nothing else.
//
// `make bench` runs it twice: as the auth service of the floor NGINX (the
// fastest possible auth_request answer, which rategate is compared with),
// and as the application both NGINX copies proxy allowed requests to, so
// the floor and rategate runs pay for exactly the same upstream app.
//
//	floor -listen 127.0.0.1:18080
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "listen `addr`")
	flag.Parse()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
	srv := &fasthttp.Server{
		Handler:               noContent,
		Name:                  "floor",
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-errc:
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	case <-sigs:
		_ = srv.Shutdown()
	}
}

// noContent answers every request with 204 and no body.
func noContent(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}
