// Package admin is rategate's operations side, served on the admin listener
// (loopback by default): Prometheus metrics, the rules in force with their
// runtime overrides, config reload, key inspection and reset, and the
// identities denied most. It also holds the `rategate admin` command-line
// client for that API. See docs/operations.md.
package admin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/metrics"
)

// DefaultTimeout bounds the store calls of one admin request.
const DefaultTimeout = 2 * time.Second

// Server serves the admin API. It is safe for concurrent use.
type Server struct {
	token   [32]byte // sha256 of "Bearer <token>"
	auth    bool
	rules   *Manager
	limiter *limits.Limiter
	store   limits.Store
	metrics *metrics.Metrics
	top     *Top
	log     zerolog.Logger
	timeout time.Duration
	pprof   bool

	bufs sync.Pool // of *[]byte, for /metrics
}

// ServerOptions configures NewServer. Rules and Limiter are required.
type ServerOptions struct {
	// Token, when not empty, is required on every call as
	// "Authorization: Bearer <token>".
	Token   string
	Rules   *Manager
	Limiter *limits.Limiter
	// Store answers key inspection and reset; default Limiter.Store().
	Store   limits.Store
	Metrics *metrics.Metrics
	Top     *Top
	Log     zerolog.Logger
	// Timeout bounds each store call (DefaultTimeout).
	Timeout time.Duration
	// Pprof serves Go's profiles under /debug/pprof/ (off by default: a
	// CPU profile costs the service while it runs).
	Pprof bool
}

// NewServer returns the admin API handler.
func NewServer(opts ServerOptions) *Server {
	s := &Server{
		auth:    opts.Token != "",
		rules:   opts.Rules,
		limiter: opts.Limiter,
		store:   opts.Store,
		metrics: opts.Metrics,
		top:     opts.Top,
		log:     opts.Log,
		timeout: opts.Timeout,
		pprof:   opts.Pprof,
	}
	if s.auth {
		s.token = sha256.Sum256([]byte("Bearer " + opts.Token))
	}
	if s.store == nil {
		s.store = opts.Limiter.Store()
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	s.bufs.New = func() any { b := make([]byte, 0, 64<<10); return &b }
	return s
}

// authorized compares the Authorization header with the token in constant
// time (both sides hashed first, so neither the length nor a prefix leaks).
func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	if !s.auth {
		return true
	}
	got := sha256.Sum256(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	return subtle.ConstantTimeCompare(got[:], s.token[:]) == 1
}

// Serve is the fasthttp handler of the admin listener.
func (s *Server) Serve(ctx *fasthttp.RequestCtx) {
	if !s.authorized(ctx) {
		ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="rategate admin"`)
		writeError(ctx, fasthttp.StatusUnauthorized, "missing or wrong admin token: send \"Authorization: Bearer <admin.token>\"", nil)
		return
	}
	path := string(ctx.Path())
	method := string(ctx.Method())
	switch {
	case path == "/metrics":
		if allow(ctx, method, "GET") {
			s.serveMetrics(ctx)
		}
	case path == "/v1/rules":
		if allow(ctx, method, "GET") {
			writeJSON(ctx, fasthttp.StatusOK, s.rules.View())
		}
	case strings.HasPrefix(path, "/v1/rules/") && strings.HasSuffix(path, "/override"):
		name := strings.TrimSuffix(strings.TrimPrefix(path, "/v1/rules/"), "/override")
		if allow(ctx, method, "PUT", "DELETE") {
			s.override(ctx, method, name)
		}
	case strings.HasPrefix(path, "/v1/keys/"):
		if allow(ctx, method, "GET", "DELETE") {
			s.key(ctx, method, strings.TrimPrefix(path, "/v1/keys/"))
		}
	case path == "/v1/top":
		if allow(ctx, method, "GET") {
			s.serveTop(ctx)
		}
	case path == "/v1/reload":
		if allow(ctx, method, "POST") {
			s.reload(ctx)
		}
	case strings.HasPrefix(path, "/debug/pprof"):
		s.servePprof(ctx, path)
	case path == "/" || path == "/v1":
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString(index)
	default:
		writeError(ctx, fasthttp.StatusNotFound, "no such admin endpoint "+path+"; GET / lists them", nil)
	}
}

const index = `rategate admin API
GET    /metrics                         Prometheus metrics
GET    /v1/rules                        rules: file values, override, effective values
PUT    /v1/rules/{name}/override        {"limit":N,"period":"1m","burst":M,"factor":1.5,"reason":"...","ttl":"2h"}
DELETE /v1/rules/{name}/override        back to the file's values
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

func (s *Server) serveMetrics(ctx *fasthttp.RequestCtx) {
	if s.metrics == nil {
		writeError(ctx, fasthttp.StatusNotFound, "metrics are off", nil)
		return
	}
	bp := s.bufs.Get().(*[]byte)
	b := s.metrics.AppendText((*bp)[:0])
	ctx.SetContentType(metrics.ContentType)
	ctx.SetBody(b) // copies
	*bp = b
	s.bufs.Put(bp)
}

func (s *Server) override(ctx *fasthttp.RequestCtx, method, name string) {
	c, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	var rv RuleView
	var err error
	if method == "PUT" {
		rv, err = s.rules.SetOverride(c, name, ctx.PostBody())
	} else {
		rv, err = s.rules.DeleteOverride(c, name)
	}
	if err != nil {
		var fe fieldErrors
		var se *storeError
		switch {
		case errors.Is(err, ErrUnknownRule):
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
	res, err := s.rules.Reload("admin api")
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
	writeJSON(ctx, fasthttp.StatusOK, struct {
		Result string `json:"result"`
		ReloadResult
	}{"success", res})
}

func (s *Server) serveTop(ctx *fasthttp.RequestCtx) {
	args := ctx.QueryArgs()
	minutes, err := minutesParam(string(args.Peek("minutes")))
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
	writeJSON(ctx, fasthttp.StatusOK, v)
}

// ruleByName returns the effective rule called name, or nil.
func (s *Server) ruleByName(name string) *limits.Rule {
	for _, r := range s.limiter.Rules() {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// apiError is the body of every admin error.
type apiError struct {
	Error  string   `json:"error"`
	Errors []string `json:"errors,omitempty"`
}

func writeError(ctx *fasthttp.RequestCtx, status int, msg string, details []string) {
	writeJSON(ctx, status, apiError{Error: msg, Errors: details})
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // "limit must be >= 1", not "\u003e="
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		status = fasthttp.StatusInternalServerError
		buf.Reset()
		_ = json.NewEncoder(&buf).Encode(apiError{Error: "encode answer: " + err.Error()})
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(buf.Bytes())
}
