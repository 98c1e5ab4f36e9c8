package handler

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// Defaults of ServerOptions. They are sized for the one client the main
// listener has, NGINX: it sends a complete, bodyless subrequest at once and
// keeps a pool of keep-alive connections (upstream keepalive_timeout 60s).
const (
	// DefaultReadTimeout bounds reading one request, headers and all, from
	// its first byte (a new connection: from accept). A slow-loris client
	// holds a connection no longer than this. (fasthttp's
	// ReduceMemoryUsage would restart it at a new connection's first byte,
	// letting a client hold it twice as long: NewServer leaves it off.)
	DefaultReadTimeout = 5 * time.Second
	// DefaultWriteTimeout bounds writing one response.
	DefaultWriteTimeout = 5 * time.Second
	// DefaultIdleTimeout is how long a keep-alive connection may wait for
	// its next request; longer than NGINX's upstream keepalive_timeout, so
	// rategate does not close a connection NGINX is about to reuse.
	DefaultIdleTimeout = 120 * time.Second
	// DefaultReadBufferSize is the largest request head accepted (request
	// line plus headers): NGINX's large_client_header_buffers allows 8 KiB
	// per header line, and several identity headers may be that long.
	// Larger heads get 431.
	DefaultReadBufferSize = 64 << 10
	// DefaultMaxConns is the number of connections served at once. The
	// next one gets "503 Service Unavailable" and is closed. Together with
	// DefaultReadBufferSize it bounds the memory clients can pin: a
	// connection holds its read buffer, a 4 KiB write buffer and fasthttp's
	// own state of it (its request context, a few KiB) from its first
	// request to its close, idle or not (StreamRequestBody keeps the reader
	// with the connection): about ReadBufferSize + 8 KiB (71 KiB measured,
	// TestServerIdleConnectionMemory), so at most some 580 MiB at the
	// defaults.
	DefaultMaxConns = 8192
	// maxRequestBodySize is what the server reads of a request body before
	// calling the handler. /auth never looks at a body (NGINX sends none);
	// the little that is pre-read keeps pipelined requests framed, anything
	// longer is skipped after the answer or the connection is closed.
	maxRequestBodySize = 1 << 10
)

// ServerOptions configures NewServer. The zero value of every field means
// its default.
type ServerOptions struct {
	// ReadTimeout, WriteTimeout, IdleTimeout: see the Default constants.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// ReadBufferSize is the largest request head, at least 64 KiB.
	ReadBufferSize int
	// MaxConns is the number of connections served at once (fasthttp's
	// Concurrency); beyond it new connections get 503 and are closed.
	MaxConns int
	// MaxConnsPerIP, when positive, caps the connections one client address
	// may hold (beyond it fasthttp answers 429 and closes). It is off by
	// default: the clients are the NGINX boxes, so a per-IP cap would
	// throttle NGINX itself, and NGINX would read fasthttp's 429 as a
	// rate-limit denial.
	MaxConnsPerIP int
	// Logger receives fasthttp's own messages (malformed requests, refused
	// connections) at debug level, sampled: they are about clients, and a
	// flood of garbage must not become a flood of log lines.
	Logger zerolog.Logger
}

// NewServer returns the hardened fasthttp server of the main listener,
// serving h. The caller runs it with Serve(listener) and stops it with
// Shutdown.
func NewServer(h *Handler, opts ServerOptions) *fasthttp.Server {
	or := func(v, def time.Duration) time.Duration {
		if v <= 0 {
			return def
		}
		return v
	}
	maxConns := opts.MaxConns
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	writeTimeout := or(opts.WriteTimeout, DefaultWriteTimeout)
	return &fasthttp.Server{
		Handler:        h.Serve,
		ErrorHandler:   refusal(writeTimeout),
		Name:           "rategate",
		ReadTimeout:    or(opts.ReadTimeout, DefaultReadTimeout),
		WriteTimeout:   writeTimeout,
		IdleTimeout:    or(opts.IdleTimeout, DefaultIdleTimeout),
		ReadBufferSize: max(opts.ReadBufferSize, DefaultReadBufferSize),
		Concurrency:    maxConns,
		MaxConnsPerIP:  max(opts.MaxConnsPerIP, 0),
		// The handler answers from the headers alone: the body is not read
		// before it runs (beyond a 1 KiB pre-read), and what is left of it
		// is discarded afterwards, or the connection closed.
		StreamRequestBody:            true,
		MaxRequestBodySize:           maxRequestBodySize,
		DisablePreParseMultipartForm: true,
		// fasthttp reads the clock for every request to stamp ctx.Time(),
		// which nothing here reads (auth reads its own start); lazily, the
		// clock is read only if ctx.Time() is called, and the idle
		// bookkeeping of Shutdown's sweep uses fasthttp's coarse second.
		LazyRequestTime: true,
		// ReduceMemoryUsage stays off. With StreamRequestBody fasthttp
		// never gives a keep-alive connection's read buffer back, so it
		// saved no memory (about 67 KiB per idle connection with it, 71
		// without); it cost a one-byte read system call on every new
		// connection, and it restarted ReadTimeout at a new connection's
		// first byte (DefaultReadTimeout).
		// During shutdown, answers say Connection: close so NGINX stops
		// reusing the connection.
		CloseOnShutdown:       true,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		// fasthttp's error messages leave the request's bytes out (but for
		// quoted values, which FasthttpLogger drops): hostile input must
		// not reach the log.
		SecureErrorLogMessage: true,
		Logger:                FasthttpLogger(opts.Logger),
	}
}

// refusal returns the server's answer to a request it cannot read (a
// malformed head, a control byte in a header, a head over ReadBufferSize):
// fasthttp's own statuses and texts, written under a write deadline of
// its own. fasthttp sets one before each answer of the handler, not before
// these: on a keep-alive connection idle for longer than the write
// timeout, the deadline left from its last answer has passed, and the
// refusal was dropped with the connection. NGINX reads that as rategate
// unavailable (a 502 from every instance, each charged a failure), and
// lets the request through under failure_mode open: a client could pass
// a spent limit with a control byte in any header NGINX forwards.
func refusal(writeTimeout time.Duration) func(*fasthttp.RequestCtx, error) {
	return func(ctx *fasthttp.RequestCtx, err error) {
		_ = ctx.SetWriteDeadline(time.Now().Add(writeTimeout)) // a closed connection has nobody to answer
		var small *fasthttp.ErrSmallBuffer
		var netErr *net.OpError
		switch {
		case errors.As(err, &small):
			ctx.Error("Too big request header", fasthttp.StatusRequestHeaderFieldsTooLarge)
		case errors.As(err, &netErr) && netErr.Timeout():
			ctx.Error("Request timeout", fasthttp.StatusRequestTimeout)
		default:
			ctx.Error("Error when parsing request", fasthttp.StatusBadRequest)
		}
	}
}

// FasthttpLogger routes a fasthttp server's messages to log, at most a
// few lines per second plus every 1000th. Messages about one client's
// malformed request are debug; the connection limits being hit is a
// warning (fasthttp itself says so at most once a minute). What a client
// sent is left out: fasthttp quotes an invalid header value in some
// messages whatever SecureErrorLogMessage says (an API key a rule reads,
// an admin listener's bearer token).
func FasthttpLogger(log zerolog.Logger) fasthttp.Logger {
	return fasthttpLogger{log: log.Sample(&zerolog.BurstSampler{
		Burst: 5, Period: time.Second, NextSampler: &zerolog.BasicSampler{N: 1000},
	})}
}

type fasthttpLogger struct{ log zerolog.Logger }

// Printf implements fasthttp.Logger.
func (l fasthttpLogger) Printf(format string, args ...any) {
	ev := l.log.Debug()
	if strings.HasPrefix(format, "The incoming connection cannot be served") ||
		strings.HasPrefix(format, "The number of connections from") {
		ev = l.log.Warn()
	}
	if ev.Enabled() {
		ev.Str("component", "fasthttp").Msg(withoutQuoted(fmt.Sprintf(format, args...)))
	}
}

// withoutQuoted replaces every double-quoted part of msg (Go's %q: a
// backslash escapes a quote) by "…", keeping the rest.
func withoutQuoted(msg string) string {
	var b strings.Builder
	in := false
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		switch {
		case !in && c == '"':
			in = true
			b.WriteString(`"…"`)
		case in && c == '\\':
			i++ // the escaped byte
		case in && c == '"':
			in = false
		case !in:
			b.WriteByte(c)
		}
	}
	return b.String()
}
