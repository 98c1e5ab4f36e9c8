// Package admin is rategate's admin HTTP API, served on the admin listener
// (loopback by default, or behind admin.token): Prometheus metrics, the
// rules in force with their runtime overrides, config reload, key
// inspection and reset, the identities denied most, and Go profiles. It
// only speaks HTTP: what it shows and changes belongs to the limiter, the
// policy manager and the top-denied sketch, handed to it at wiring time.
// See docs/operations.md; the command-line client is package admincli.
package admin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/policy"
	"github.com/rategate/rategate/top"
)

// DefaultTimeout bounds the store calls of one admin request.
const DefaultTimeout = 2 * time.Second

// Reloader re-reads the config file and applies what can be swapped.
type Reloader interface {
	Reload(trigger string) (ReloadResult, error)
}

// ReloadResult describes a reload that applied the file.
type ReloadResult struct {
	Source string `json:"source"`
	Rules  int    `json:"rules"`
	// Added, Removed and Changed list rule names by what the reload did.
	Added   []string `json:"added"`
	Removed []string `json:"removed"`
	Changed []string `json:"changed"`
	// Applied lists the other settings the reload changed
	// ("failure_mode", "deny_status", "admin.token", ...).
	Applied []string `json:"applied"`
	// NeedRestart lists every changed setting a reload cannot swap (a
	// listener, the store's address), field by field: the running process
	// keeps its old value until it restarts. A reload with any is reported
	// as partial (HTTP 409, exit status 1 of `rategate admin reload`).
	NeedRestart []string `json:"need_restart"`
}

// ErrNoConfigFile is a Reloader's error when rategate runs the built-in
// example policy: there is no file to re-read.
var ErrNoConfigFile = errors.New("no config file in use (rategate runs the built-in example policy); start it with -config FILE to reload")

// MetricsWriter writes the Prometheus text exposition; *metrics.Metrics is one.
type MetricsWriter interface {
	WritePrometheus(w io.Writer)
}

// Server serves the admin API. It is safe for concurrent use.
type Server struct {
	token    atomic.Pointer[[32]byte] // sha256 of the token; nil: no token
	rules    *policy.Manager
	limiter  *limits.Limiter
	reloader Reloader
	metrics  MetricsWriter
	top      *top.Top
	log      zerolog.Logger
	timeout  time.Duration
	pprof    bool
	// ipv6Prefix makes ?ip= the ip dimension /auth uses (identity.ipv6_prefix).
	ipv6Prefix atomic.Int32
	// pathParamsV makes ?route= the route /auth counts (identity.path_parameters).
	pathParamsV atomic.Uint32

	bufs sync.Pool // of *bytes.Buffer, for /metrics
}

// ServerOptions configures NewServer. Rules and Limiter are required.
type ServerOptions struct {
	// Token, when not empty, is required on every call as
	// "Authorization: Bearer <token>" (SetToken changes it).
	Token   string
	Rules   *policy.Manager
	Limiter *limits.Limiter
	// Reloader answers POST /v1/reload; nil answers 409.
	Reloader Reloader
	Metrics  MetricsWriter
	Top      *top.Top
	Log      zerolog.Logger
	// Timeout bounds each store call (DefaultTimeout).
	Timeout time.Duration
	// Pprof serves Go's profiles under /debug/pprof/ (off by default: a
	// CPU profile costs the service while it runs).
	Pprof bool
	// IPv6Prefix is identity.ipv6_prefix, for ?ip= (SetIPv6Prefix changes it).
	IPv6Prefix int
	// PathParams is identity.path_parameters, for ?route= (SetPathParams
	// changes it).
	PathParams limits.PathParams
}

// NewServer returns the admin API handler.
func NewServer(opts ServerOptions) *Server {
	s := &Server{
		rules:    opts.Rules,
		limiter:  opts.Limiter,
		reloader: opts.Reloader,
		metrics:  opts.Metrics,
		top:      opts.Top,
		log:      opts.Log,
		timeout:  opts.Timeout,
		pprof:    opts.Pprof,
	}
	s.SetToken(opts.Token)
	s.SetIPv6Prefix(opts.IPv6Prefix)
	s.SetPathParams(opts.PathParams)
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	s.bufs.New = func() any { return bytes.NewBuffer(make([]byte, 0, 64<<10)) }
	return s
}

// SetToken changes the admin token ("" turns authentication off); calls
// already authorized finish.
func (s *Server) SetToken(token string) {
	if token == "" {
		s.token.Store(nil)
		return
	}
	h := sha256.Sum256([]byte(token))
	s.token.Store(&h)
}

// SetIPv6Prefix sets the network length an IPv6 ?ip= is counted by (a
// reload of identity.ipv6_prefix); <= 0 means limits.DefaultIPv6Prefix.
func (s *Server) SetIPv6Prefix(bits int) { s.ipv6Prefix.Store(int32(bits)) }

// SetPathParams sets what a ?route= makes of path parameters, as /auth
// does (a reload of identity.path_parameters).
func (s *Server) SetPathParams(p limits.PathParams) { s.pathParamsV.Store(uint32(p)) }

func (s *Server) pathParams() limits.PathParams { return limits.PathParams(s.pathParamsV.Load()) }

// authorized checks "Authorization: Bearer <token>": the scheme in any case
// (RFC 9110 section 11.1), the token compared in constant time (both sides
// hashed first, so neither its length nor a prefix leaks).
func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	want := s.token.Load()
	if want == nil {
		return true
	}
	v := bytes.TrimLeft(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization), " ")
	scheme, cred, ok := bytes.Cut(v, []byte(" "))
	if !ok || !bytes.EqualFold(scheme, []byte("Bearer")) {
		return false
	}
	got := sha256.Sum256(bytes.TrimSpace(cred))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// Serve is the fasthttp handler of the admin listener. Routes match the
// path as the client sent it, segment by segment, each segment decoded on
// its own: a rule name holding an escaped "/" (r1%2F..%2Fr2) is one
// segment, an unknown rule, never a way to reach another one.
func (s *Server) Serve(ctx *fasthttp.RequestCtx) {
	if !s.authorized(ctx) {
		ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="rategate admin"`)
		writeError(ctx, fasthttp.StatusUnauthorized, "missing or wrong admin token: send \"Authorization: Bearer <admin.token>\"", nil)
		return
	}
	path := string(ctx.Request.URI().PathOriginal())
	segs, ok := splitPath(path)
	if !ok {
		writeError(ctx, fasthttp.StatusBadRequest, "malformed path "+strconv.Quote(path), nil)
		return
	}
	method := string(ctx.Method())
	switch {
	case match(segs, "metrics"):
		if allow(ctx, method, "GET") {
			s.serveMetrics(ctx)
		}
	case match(segs, "v1", "rules"):
		if allow(ctx, method, "GET") {
			writeJSON(ctx, fasthttp.StatusOK, s.rules.View())
		}
	case match(segs, "v1", "rules", "*", "override"):
		if allow(ctx, method, "PUT", "DELETE") {
			s.override(ctx, method, segs[2])
		}
	case match(segs, "v1", "rules", "*", "identities"):
		if allow(ctx, method, "GET", "PUT", "DELETE") {
			s.identities(ctx, method, segs[2])
		}
	case match(segs, "v1", "keys", "*"):
		if allow(ctx, method, "GET", "DELETE") {
			s.key(ctx, method, segs[2])
		}
	case match(segs, "v1", "top"):
		if allow(ctx, method, "GET") {
			s.serveTop(ctx)
		}
	case match(segs, "v1", "reload"):
		if allow(ctx, method, "POST") {
			s.reload(ctx)
		}
	case len(segs) >= 2 && segs[0] == "debug" && segs[1] == "pprof":
		s.servePprof(ctx, string(ctx.Path()))
	case len(segs) == 0 || match(segs, "v1"):
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString(index)
	default:
		writeError(ctx, fasthttp.StatusNotFound, "no such admin endpoint "+path+"; GET / lists them", nil)
	}
}

// splitPath splits a raw request path into its segments, each
// percent-decoded on its own; a trailing slash is ignored. ok is false for
// a path that does not start with "/" or holds an invalid escape.
func splitPath(raw string) (segs []string, ok bool) {
	if !strings.HasPrefix(raw, "/") {
		return nil, false
	}
	raw = strings.TrimSuffix(raw[1:], "/")
	if raw == "" {
		return nil, true
	}
	for _, p := range strings.Split(raw, "/") {
		d, err := url.PathUnescape(p)
		if err != nil {
			return nil, false
		}
		segs = append(segs, d)
	}
	return segs, true
}

// match reports whether segs are exactly pattern, "*" matching any one
// non-empty segment.
func match(segs []string, pattern ...string) bool {
	if len(segs) != len(pattern) {
		return false
	}
	for i, p := range pattern {
		if p == "*" && segs[i] != "" || p == segs[i] {
			continue
		}
		return false
	}
	return true
}

const index = `rategate admin API
GET    /metrics                         Prometheus metrics
GET    /v1/rules                        rules: file values, override, effective values
PUT    /v1/rules/{name}/override        {"limit":N,"period":"1m","burst":M,"factor":1.5,"reason":"...","ttl":"2h"}
DELETE /v1/rules/{name}/override        back to the file's values
GET    /v1/rules/{rule}/identities      the rule's identity overrides and exceptions (?n=&after= to page)
PUT    /v1/rules/{rule}/identities?ip=&user=&...
                                        one identity's own numbers {"limit":N,...}, {"exempt":true} or {"block":true}, "ttl", "reason"
DELETE /v1/rules/{rule}/identities?ip=&user=&...
                                        remove it
GET    /v1/keys/{rule}?ip=&user=&...    one identity's state, without consuming
DELETE /v1/keys/{rule}?ip=&user=&...    reset it
GET    /v1/top?rule=&minutes=&n=        identities denied most in the last minutes
POST   /v1/reload                       re-read the config file
GET    /debug/pprof/                    Go profiles (only with -pprof)
`

// allow answers 405 unless method is one of methods.
func allow(ctx *fasthttp.RequestCtx, method string, methods ...string) bool {
	for _, m := range methods {
		if method == m {
			return true
		}
	}
	ctx.Response.Header.Set(fasthttp.HeaderAllow, strings.Join(methods, ", "))
	writeError(ctx, fasthttp.StatusMethodNotAllowed, "method "+method+" not allowed; use "+strings.Join(methods, " or "), nil)
	return false
}

// metricsContentType is the Prometheus text format's Content-Type.
const metricsContentType = "text/plain; version=0.0.4; charset=utf-8"

func (s *Server) serveMetrics(ctx *fasthttp.RequestCtx) {
	if s.metrics == nil {
		writeError(ctx, fasthttp.StatusNotFound, "metrics are off", nil)
		return
	}
	buf := s.bufs.Get().(*bytes.Buffer)
	buf.Reset()
	s.metrics.WritePrometheus(buf)
	ctx.SetContentType(metricsContentType)
	ctx.SetBody(buf.Bytes()) // copies
	s.bufs.Put(buf)
}

func (s *Server) override(ctx *fasthttp.RequestCtx, method, name string) {
	c, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	var rv policy.RuleView
	var err error
	if method == "PUT" {
		rv, err = s.rules.SetOverride(c, name, ctx.PostBody())
	} else {
		rv, err = s.rules.DeleteOverride(c, name)
	}
	if err != nil {
		var fe policy.FieldErrors
		var se *policy.StoreError
		switch {
		case errors.Is(err, policy.ErrUnknownRule):
			writeError(ctx, fasthttp.StatusNotFound, err.Error(), nil)
		case errors.As(err, &fe):
			writeError(ctx, fasthttp.StatusBadRequest, "invalid override for rule \""+name+"\"", fe)
		case errors.As(err, &se):
			writeError(ctx, fasthttp.StatusServiceUnavailable, "override store unavailable: "+err.Error(), nil)
		default:
			writeError(ctx, fasthttp.StatusBadRequest, err.Error(), nil)
		}
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, rv)
}

func (s *Server) reload(ctx *fasthttp.RequestCtx) {
	if s.reloader == nil {
		writeError(ctx, fasthttp.StatusConflict, ErrNoConfigFile.Error(), nil)
		return
	}
	res, err := s.reloader.Reload("admin api")
	if err != nil {
		if errors.Is(err, ErrNoConfigFile) {
			writeError(ctx, fasthttp.StatusConflict, err.Error(), nil)
			return
		}
		var list config.Errors
		var msgs []string
		if errors.As(err, &list) {
			for _, e := range list {
				msgs = append(msgs, e.Error())
			}
		} else {
			msgs = []string{err.Error()}
		}
		writeError(ctx, fasthttp.StatusBadRequest, "config invalid: the running rules were kept", msgs)
		return
	}
	result, status := "success", fasthttp.StatusOK
	if len(res.NeedRestart) > 0 {
		// Applied what it could; the rest waits for a restart.
		result, status = "partial", fasthttp.StatusConflict
	}
	writeJSON(ctx, status, struct {
		Result string `json:"result"`
		ReloadResult
	}{result, res})
}

func (s *Server) serveTop(ctx *fasthttp.RequestCtx) {
	args := ctx.QueryArgs()
	if problems := plainParams(args, "use rule, minutes and n", "rule", "minutes", "n"); len(problems) > 0 {
		writeError(ctx, fasthttp.StatusBadRequest, "cannot list the identities denied most", problems)
		return
	}
	minutes, err := top.MinutesParam(string(args.Peek("minutes")))
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error(), nil)
		return
	}
	n := 20
	if v := string(args.Peek("n")); v != "" {
		if n, err = atoiRange(v, 1, 1000); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, "n: "+err.Error(), nil)
			return
		}
	}
	var rules []string
	if r := string(args.Peek("rule")); r != "" {
		if s.ruleByName(r) == nil {
			writeError(ctx, fasthttp.StatusNotFound, "no such rule \""+r+"\"", nil)
			return
		}
		rules = []string{r}
	}
	if s.top == nil {
		writeError(ctx, fasthttp.StatusNotFound, "the top-denied sketch is off", nil)
		return
	}
	c, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	v, err := s.top.Query(c, rules, minutes, n)
	if err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, err.Error(), nil)
		return
	}
	s.markBlocked(&v)
	writeJSON(ctx, fasthttp.StatusOK, v)
}

// ruleByName returns the effective rule called name, or nil.
func (s *Server) ruleByName(name string) *limits.Rule { return s.limiter.Rule(name) }

// APIError is the body of every admin error.
type APIError struct {
	Error  string   `json:"error"`
	Errors []string `json:"errors,omitempty"`
}

func writeError(ctx *fasthttp.RequestCtx, status int, msg string, details []string) {
	writeJSON(ctx, status, APIError{Error: msg, Errors: details})
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // "limit must be >= 1", not "\u003e="
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		status = fasthttp.StatusInternalServerError
		buf.Reset()
		_ = json.NewEncoder(&buf).Encode(APIError{Error: "encode answer: " + err.Error()})
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(buf.Bytes())
}
