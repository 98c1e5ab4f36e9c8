// Package handler holds rategate's HTTP side: the /auth decision endpoint that
// NGINX's auth_request calls, and the health endpoints. It turns request
// headers into a limits.Request, asks a Decider, and writes the status and
// rate-limit headers of docs/decision-endpoint.md. It does no limiter maths.
package handler

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// Default header names, as the shipped NGINX configs set them.
const (
	DefaultUserHeader   = "X-User-Id"
	DefaultIPHeader     = "X-Real-IP"
	DefaultURIHeader    = "X-Original-URI"
	DefaultURLHeader    = "X-Original-URL"
	DefaultMethodHeader = "X-Original-Method"
	DefaultHostHeader   = "X-Original-Host"
	// DefaultRequestIDHeader carries NGINX's $request_id, quoted in
	// denial log lines so a denial can be found in NGINX's access log.
	DefaultRequestIDHeader = "X-Request-Id"
)

// Defaults for the numeric options.
const (
	// DefaultTimeout is the store budget of one decision or readiness ping.
	DefaultTimeout = 50 * time.Millisecond
	// DefaultMaxCost bounds the cost header when Options.MaxCost is not set.
	DefaultMaxCost = 1000
)

// Options configures a Handler. The zero value of every field means its
// default; the caller maps the config file onto it.
type Options struct {
	// Header names the identity is read from. Defaults: X-User-Id,
	// X-Real-IP, X-Original-URI, X-Original-Method, X-Original-Host.
	// IPHeader may be X-Forwarded-For (any case), which is then walked
	// right-to-left past TrustedProxies.
	UserHeader, IPHeader, URIHeader, MethodHeader, HostHeader string
	// URLHeader (default X-Original-URL) holds the client request as a full
	// URL, as ingress-nginx's auth-url sends it; it is read only when
	// URIHeader is absent or empty. It may name the same header as
	// URIHeader.
	URLHeader string
	// IPv6Prefix is the length of the network an IPv6 client's `ip`
	// dimension is (default 64; see AppendIPIdentity).
	IPv6Prefix int
	// PathParams says whether the route keeps path parameters (the
	// default) or strips them (limits.PathParams).
	PathParams limits.PathParams
	// RequestIDHeader (default X-Request-Id) carries NGINX's $request_id;
	// denial and shadow log lines quote it.
	RequestIDHeader string
	// TrustedProxies are the hops skipped when walking X-Forwarded-For.
	// Unused for any other IPHeader.
	TrustedProxies []netip.Prefix
	// CostHeader names the header carrying a request's weight; "" turns
	// request costs off and every rule uses its own cost.
	CostHeader string
	// MaxCost is the largest cost CostHeader may carry (default 1000).
	MaxCost int64
	// DenyStatus is the status of a limited request: 429 (default) or 403.
	// SetDenyStatus changes it later (a reload).
	DenyStatus int
	// Timeout bounds each store call (default 50ms).
	Timeout time.Duration
	// Logger receives sampled store errors, denials and shadow rules that
	// would have denied, and per second the number of denial and shadow
	// lines the sampling suppressed. The zero Logger discards everything.
	Logger zerolog.Logger
	// Observer, when set, is told about every /auth answer (metrics, the
	// admin API's top-denied sketch). Nil observes nothing.
	Observer Observer
	// Asked, when set, is called as each /auth request begins (not for
	// /healthz or /readyz): the lag monitor ticks while requests come.
	Asked func()
}

// Observer is told about every /auth answer, after it is written. It is
// called on the hot path: implementations must be safe for concurrent use,
// must not block, should not allocate, and must not keep d or anything it
// points to after returning (Verdict.Key excepted: that string is never
// reused).
type Observer interface {
	// Decided reports a request the limiter answered: d.Verdicts holds each
	// matching rule's own verdict (none when no rule matched), d.Admitted
	// the answer, d.Local whether the local fallback decided, and
	// d.Undecided whether nothing did and the failure mode answered
	// (d.Mode; the verdicts' results are then unset).
	Decided(d *limits.Decision, elapsed time.Duration)
	// Rejected reports a 400.
	Rejected(reason limits.RejectReason, elapsed time.Duration)
}

// Decider decides one request; *limits.Limiter implements it. Decide fills d
// completely, whatever happened (d says how it was decided), and may reuse
// its buffers; d is owned by the caller. The error is the store's when it
// did not decide, for the log.
type Decider interface {
	Decide(ctx context.Context, req *limits.Request, d *limits.Decision) error
}

// HeaderReader is a Decider whose rules read request headers of their own
// (a header key dimension, a match on a header); *limits.Limiter is one.
// The handler refuses a request that sends one of them more than once.
// The request is checked against, and decided by, one rule set: the one
// RuleSet returns, passed on in limits.Request.RuleSet.
type HeaderReader interface {
	RuleSet() limits.RuleSet
}

// Pinger is the store as /readyz sees it; *limits.Limiter implements it.
type Pinger interface {
	Ping(ctx context.Context) error
	// StoreName describes the store, e.g. "redis 127.0.0.1:6379" or "memory".
	StoreName() string
}

// Handler serves the main listener. It is safe for concurrent use and keeps
// nothing from a request after returning.
type Handler struct {
	dec   Decider
	store Pinger

	// The header names in fasthttp's canonical form, as it stores the
	// request's, so a request is read with PeekCanonical and no name is
	// normalized again per request.
	userHeader, ipHeader, uriHeader, urlHeader, methodHeader, hostHeader, costHeader, requestIDHeader []byte
	// ipHeaderName is IPHeader as a string, for PeekAll.
	ipHeaderName string
	xff          bool
	// once lists the identity headers a request must send at most once
	// (canonical names), each with its 400 body: a proxy in front that
	// adds its copy after the client's instead of replacing it
	// (HAProxy's add-header) would otherwise let the client's first copy
	// name the client. X-Forwarded-For is a list and may repeat.
	once       []onceHeader
	trusted    []netip.Prefix
	ipv6Prefix int
	pathParams limits.PathParams
	maxCost    int64
	denyStatus atomic.Int32
	timeout    time.Duration
	// names is the lower-case index of the header names of the rule set
	// last seen (listedNames).
	names atomic.Pointer[nameIndex]

	// Answers to bad input, built once from the options.
	missingURI, badURL, ambiguousURL, noIP, badCost []byte

	// errLog, denyLog and shadowLog are sampled so that a dead store or an
	// attack produce a few lines per second, not one per request. The
	// samplers of denyLog and shadowLog count what they drop and say so.
	errLog        zerolog.Logger
	denyLog       zerolog.Logger
	shadowLog     zerolog.Logger
	denySampler   *countingSampler
	shadowSampler *countingSampler

	obs   Observer
	asked func()
	// headers, when the Decider is a HeaderReader: the headers rules read.
	headers HeaderReader

	pool sync.Pool // of *scratch
}

// scratch is the per-request state, pooled so the allowed path does not
// allocate for it.
type scratch struct {
	req   limits.Request
	dec   limits.Decision
	route []byte
	// nginxRoute is the route with path parameters kept, where they are
	// stripped and the request has any (Request.NginxRoute)
	nginxRoute []byte
	ip         []byte
	host       []byte
	buf        []byte
	// list is RateLimit's text, item one RateLimit item's (appendLists).
	list, item []byte
	ctx        *deadlineCtx
	// deciding is true while the Decider has the request (put drops a
	// scratch whose decision panicked)
	deciding bool
	// rules holds the header text of the rules of recent answers, by
	// verdict position (ruleText); spare is for the positions past it.
	rules []ruleText
	spare ruleText
	// listed[i] says X-Rategate-Repeated names the i-th header the rules
	// read (listedNames).
	listed []bool
}

// New returns a Handler deciding with d and reporting readiness of store
// (nil store: /readyz always answers 200). Options are checked leniently:
// an unknown DenyStatus or FailureMode falls back to the default and is
// logged, since the config package validates them before they get here.
func New(d Decider, store Pinger, opts Options) *Handler {
	h := &Handler{
		dec:        d,
		store:      store,
		trusted:    opts.TrustedProxies,
		ipv6Prefix: opts.IPv6Prefix,
		pathParams: opts.PathParams,
		maxCost:    opts.MaxCost,
		timeout:    opts.Timeout,
		obs:        opts.Observer,
		asked:      opts.Asked,
	}
	h.headers, _ = d.(HeaderReader)
	h.pool.New = func() any {
		return &scratch{
			route: make([]byte, 0, 256),
			ip:    make([]byte, 0, 64),
			host:  make([]byte, 0, 64),
			buf:   make([]byte, 0, 512),
			ctx:   newDeadlineCtx(),
		}
	}

	name := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	user := name(opts.UserHeader, DefaultUserHeader)
	ip := name(opts.IPHeader, DefaultIPHeader)
	uri := name(opts.URIHeader, DefaultURIHeader)
	url := name(opts.URLHeader, DefaultURLHeader)
	h.userHeader = canonical(user)
	h.ipHeader = canonical(ip)
	h.ipHeaderName = ip
	h.uriHeader = canonical(uri)
	h.urlHeader = canonical(url)
	h.methodHeader = canonical(name(opts.MethodHeader, DefaultMethodHeader))
	h.hostHeader = canonical(name(opts.HostHeader, DefaultHostHeader))
	h.requestIDHeader = canonical(name(opts.RequestIDHeader, DefaultRequestIDHeader))
	h.xff = strings.EqualFold(ip, fasthttp.HeaderXForwardedFor)
	if opts.CostHeader != "" {
		h.costHeader = canonical(opts.CostHeader)
	}
	if h.maxCost <= 0 {
		h.maxCost = DefaultMaxCost
	}
	if h.timeout <= 0 {
		h.timeout = DefaultTimeout
	}
	if h.ipv6Prefix <= 0 {
		h.ipv6Prefix = limits.DefaultIPv6Prefix
	}

	const urlVars = "$scheme://$http_host$request_uri"
	switch {
	case strings.EqualFold(uri, url):
		h.missingURI = []byte("missing " + uri + ` header: add "proxy_set_header ` + uri + " " + urlVars + `;" to the auth location` + "\n")
	case url == DefaultURLHeader:
		h.missingURI = []byte("missing " + uri + " and " + url + ` headers: add "proxy_set_header ` + uri + ` $request_uri;" to the auth location` +
			` (ingress-nginx's auth-url sets "` + url + " " + urlVars + `")` + "\n")
	default:
		h.missingURI = []byte("missing " + uri + " and " + url + ` headers: add "proxy_set_header ` + uri + ` $request_uri;" to the auth location` +
			` (or "proxy_set_header ` + url + " " + urlVars + `;")` + "\n")
	}
	h.badURL = []byte("invalid " + url + " header: want an absolute URL such as https://host/path?query, as " +
		`"proxy_set_header ` + url + " " + urlVars + `;" sets it` + "\n")
	h.ambiguousURL = []byte("ambiguous absolute URL: a '?' or '#' comes before the first '/' after the host, " +
		"so the path cannot be told from the Host header the client sent\n")
	ipVar := "$remote_addr"
	if h.xff {
		ipVar = "$proxy_add_x_forwarded_for"
	}
	for _, n := range []string{uri, url, name(opts.MethodHeader, DefaultMethodHeader), name(opts.HostHeader, DefaultHostHeader), user, ip, opts.CostHeader} {
		c := string(canonical(n))
		if n == "" || h.xff && n == ip || slices.ContainsFunc(h.once, func(o onceHeader) bool { return o.name == c }) {
			continue
		}
		h.once = append(h.once, onceHeader{c, []byte("duplicate " + n + " header: a header rategate reads the client's identity from must be sent once" +
			` (set it with proxy_set_header, which replaces the client's copy)` + "\n")})
	}
	h.noIP = []byte("no valid client IP in " + ip + `: add "proxy_set_header ` + ip + " " + ipVar + `;" to the auth location` + "\n")
	if h.costHeader != nil {
		h.badCost = []byte("invalid " + opts.CostHeader + " header: want an integer from 1 to " + strconv.FormatInt(h.maxCost, 10) + "\n")
	}

	log := opts.Logger
	if !h.SetDenyStatus(opts.DenyStatus) && opts.DenyStatus != 0 {
		log.Warn().Int("deny_status", opts.DenyStatus).Msg("deny status must be 429 or 403; using 429")
	}

	// At most one line per second, plus every 1000th after that.
	h.errLog = log.Sample(&zerolog.BurstSampler{
		Burst: 1, Period: time.Second, NextSampler: &zerolog.BasicSampler{N: 1000},
	})
	// A few denials per second for the operator to see what is limited,
	// and one line per second saying how many more there were.
	h.denySampler = newCountingSampler(log, zerolog.InfoLevel, "denial", denialBurst, time.Second)
	h.denyLog = log.Sample(h.denySampler)
	// Shadow rules exist to be watched: the same budget as denials, kept
	// apart so a noisy shadow rule cannot hide real denials.
	h.shadowSampler = newCountingSampler(log, zerolog.InfoLevel, "shadow", denialBurst, time.Second)
	h.shadowLog = log.Sample(h.shadowSampler)
	return h
}

// denialBurst is how many denial (and, apart, shadow) lines a second are
// logged in full.
const denialBurst = 10

// SetDenyStatus sets the status of a limited request: 429, or 403 for the
// quiet NGINX mapping. Anything else (0 included) sets 429 and reports
// false.
func (h *Handler) SetDenyStatus(status int) bool {
	switch status {
	case fasthttp.StatusTooManyRequests, fasthttp.StatusForbidden:
		h.denyStatus.Store(int32(status))
		return true
	}
	h.denyStatus.Store(fasthttp.StatusTooManyRequests)
	return false
}

var (
	bodyOK       = []byte("ok\n")
	bodyNotFound = []byte("not found\n")
)

// Serve is the fasthttp handler of the main listener: /auth (any method),
// /healthz, /readyz; anything else is 404.
func (h *Handler) Serve(ctx *fasthttp.RequestCtx) { h.ServeWith(ctx, limits.RuleSet{}) }

// ServeWith is Serve deciding /auth by the rule set rs (limits.Limiter's
// RuleSet): a caller that swaps handlers with the rules (a reload that
// changes deny_status or an identity setting) picks the handler from the
// same RuleSet. The zero RuleSet: the rules in force.
func (h *Handler) ServeWith(ctx *fasthttp.RequestCtx, rs limits.RuleSet) {
	defer h.survive(ctx)
	switch string(ctx.Path()) {
	case "/auth":
		if h.asked != nil {
			h.asked()
		}
		h.auth(ctx, rs)
	case "/healthz":
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetBody(bodyOK)
	case "/readyz":
		h.ready(ctx)
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetBody(bodyNotFound)
	}
	if heavyRequest(&ctx.Request.Header) || (crowded(ctx.Conn()) && bigRequest(&ctx.Request.Header)) {
		ctx.SetConnectionClose()
	}
}

// survive answers a request whose handling panicked 500, closing its
// connection, and logs the panic with its stack (sampled like the other
// errors). fasthttp does not recover a handler's panic: a bug one request
// reaches would end the process, and every NGINX in front of it would
// decide by $rategate_on_failure (open: every request let through) until
// it restarted, again at every such request. auth_request makes the 500 a
// 500 for that client, not a pass.
func (h *Handler) survive(ctx *fasthttp.RequestCtx) {
	p := recover()
	if p == nil {
		return
	}
	ctx.Response.Reset()
	ctx.SetStatusCode(fasthttp.StatusInternalServerError)
	ctx.SetBody(bodyPanic)
	ctx.SetConnectionClose()
	h.errLog.Error().Str("panic", fmt.Sprint(p)).Bytes("stack", debug.Stack()).
		Msg("a request met a bug in rategate and was answered 500; please report this line")
}

var bodyPanic = []byte("internal error\n")

// bigHead is the request head past which a connection closes after its
// answer while the listener is crowded (crowdedConns). fasthttp keeps a
// connection's parsed head (two copies of it, sized to the largest head
// the connection carried) while it idles: a head just under 16 KiB pinned
// 104 KiB a connection, 840 MiB at DefaultMaxConns, against about 72 KiB
// otherwise (TestServerBigHeadConnectionMemory,
// TestServerHeadUnderBigHeadConnectionMemory); under 3 KiB (and bigURI
// and bigFields) a connection pins at most about 90 KiB, 720 MiB at the
// cap (TestServerHeadUnderEveryCrowdedLimitConnectionMemory), and with
// the close at most
// crowdedConns connections keep a bigger head. Below that, as NGINX's
// keep-alive connections are, such connections stay open: a client can
// send heads this large through NGINX (its client header buffers and the
// copied URI), and a close per request would move NGINX to a new
// connection per request (TIME_WAIT sockets on its side: measured 6% of
// them, about 7,800 such requests a second to use up its ports to one
// rategate, and then every subrequest fails).
const bigHead = 3 << 10

// bigURI is the request line's URI past which a connection closes after
// its answer while the listener is crowded, as for bigHead: fasthttp keeps
// copies of the URI (parsed path and query) with the idle connection too,
// two to three times its size (a 60 KB URI pinned 201 to 264 KiB a
// connection, TestServerBigRequestLineConnectionMemory), and RawHeaders
// leaves the request line out. NGINX's auth subrequest asks for the auth
// location's own URI ("/auth"), never the client's, so a long one is not
// NGINX's and closing its connection costs NGINX nothing.
const bigURI = 1 << 10

// bigFields is the number of header fields past which a connection closes
// after its answer while the listener is crowded, as for bigHead: fasthttp
// keeps each field's parsed key and value with the idle connection, about
// 80 bytes a field beyond its bytes, so many short fields under bigHead
// pinned far more than a long one (2,700 empty fields, a 13.5 KB head: 283
// KiB a connection, TestServerManyHeaderFieldsConnectionMemory). NGINX's
// auth subrequest carries its own fields (up to 36 set by nginx-auth.conf)
// and the client's, a few dozen: 128 leaves them room.
const bigFields = 128

// bigRequest reports whether a request's head makes its idle connection
// pin more than an ordinary one (bigHead, bigURI, bigFields).
func bigRequest(h *fasthttp.RequestHeader) bool {
	raw := h.RawHeaders()
	return len(raw) > bigHead || len(h.RequestURI()) > bigURI || bytes.Count(raw, newline) > bigFields
}

var newline = []byte{'\n'}

// heavyFields is the number of header fields past which a connection
// closes after its answer, crowded or not: about 80 bytes a field stay
// with the idle connection, so a 64 KiB head of 13,000 empty fields
// pinned 1 MiB a connection (531 MiB for the connections below
// crowdedConns, TestServerManyHeaderFieldsUncrowdedConnectionMemory),
// where 1,000 fields pin 142 KiB, under a 60 KB head's 181 KiB. NGINX
// refuses a client's request of about 1,000 fields or more (its header
// buffers), so no subrequest it sends is closed by this.
const heavyFields = 1000

// heavyRequest reports whether a request carried more than heavyFields
// header fields, or a Trailer field naming more than heavyFields trailer
// fields: fasthttp keeps a copy of each name with the idle connection as
// well (12,000 names on one line pinned 478 KiB a connection,
// TestServerTrailerListUncrowdedConnectionMemory), and the line count
// misses them. Each field takes at least 3 bytes ("a:\n": fasthttp takes
// a bare line feed inside a head), so a shorter head is not counted.
func heavyRequest(h *fasthttp.RequestHeader) bool {
	if len(h.PeekTrailerKeys()) > heavyFields {
		return true
	}
	raw := h.RawHeaders()
	return len(raw) > 3*heavyFields && bytes.Count(raw, newline) > heavyFields
}

// ready answers 200 when the store answers a ping within the timeout.
func (h *Handler) ready(ctx *fasthttp.RequestCtx) {
	if h.store == nil {
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetBodyString("ready: no store\n")
		return
	}
	c, cancel := context.WithTimeout(context.Background(), h.timeout)
	err := h.store.Ping(c)
	cancel()
	if err != nil {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString("not ready: " + h.store.StoreName() + ": " + err.Error() + "\n")
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetBodyString("ready: " + h.store.StoreName() + "\n")
}

// canonical is a header name as fasthttp stores it (each word capitalized),
// so that PeekCanonical finds it however the request spelled its case.
func canonical(name string) []byte {
	return fasthttp.AppendNormalizedHeaderKey(nil, name)
}

// onceHeader is an identity header that must come once, and the 400 body
// for a request that sends it twice.
type onceHeader struct {
	name string
	body []byte
}
