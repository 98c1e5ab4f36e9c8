package handler

import (
	"bytes"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rategate/rategate/limits"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// Response header names, written with SetCanonical so they go out spelled
// as the IETF draft and docs/decision-endpoint.md spell them.
var (
	hdrPolicy      = []byte("RateLimit-Policy")
	hdrRateLimit   = []byte("RateLimit")
	hdrLimit       = []byte("X-RateLimit-Limit")
	hdrRemaining   = []byte("X-RateLimit-Remaining")
	hdrReset       = []byte("X-RateLimit-Reset")
	hdrRule        = []byte("X-RateLimit-Rule")
	hdrRetryAfter  = []byte("Retry-After")
	hdrStatus      = []byte("X-RateLimit-Status")
	valUnavailable = []byte("unavailable")
	valLocal       = []byte("local")

	paramSlashBody = []byte("a path parameter holds an escaped '/' (%2F): where it ends depends on who decodes the path," +
		" so rategate cannot count it (identity.path_parameters: strip)\n")
	trailerBody = []byte("trailer fields on /auth: rategate reads a client's identity from the request head only" +
		" (send no body: proxy_pass_request_body off)\n")
)

// auth answers one auth_request subrequest. It never reads a body.
func (h *Handler) auth(ctx *fasthttp.RequestCtx, rules limits.RuleSet) {
	// One clock read for the request: its latency and its decision's
	// deadline both start here.
	start := time.Now()
	hdr := &ctx.Request.Header
	s := h.pool.Get().(*scratch)
	defer h.put(s)

	// fasthttp's Peek falls back to a chunked body's trailer fields: a
	// client could name itself after the body, where no proxy in front
	// replaces what it wrote. NGINX sends /auth no body. Trailer fields
	// come only after a chunked body; a Trailer header alone, which NGINX
	// passes on from the client, only declares names. (fasthttp sets the
	// ContentLength of an empty chunked body to 0 before it reads the
	// trailer: the raw head says it was chunked.)
	if len(hdr.PeekTrailerKeys()) > 0 && (hdr.ContentLength() == -1 || rawCount(hdr.RawHeaders(), "Transfer-Encoding") > 0) {
		h.badRequest(ctx, trailerBody, limits.RejectTrailer, start)
		return
	}

	uri := hdr.PeekCanonical(h.uriHeader)
	if len(uri) == 0 {
		// ingress-nginx's auth-url sends the full URL instead.
		uri = hdr.PeekCanonical(h.urlHeader)
		if len(uri) == 0 {
			h.badRequest(ctx, h.missingURI, limits.RejectMissingURI, start)
			return
		}
		if uri[0] != '/' && !limits.IsAbsoluteURL(uri) {
			h.badRequest(ctx, h.badURL, limits.RejectMissingURI, start)
			return
		}
	}
	if limits.AmbiguousURL(uri) {
		// "http://a?b/c": Host "a?b" and /c, or Host "a" and ?b/c.
		h.badRequest(ctx, h.ambiguousURL, limits.RejectMissingURI, start)
		return
	}
	s.route = h.pathParams.Normalize(s.route[:0], uri)
	var nginxRoute []byte
	if h.pathParams == limits.StripPathParams && hasParams(uri) {
		if limits.ParamSlash(uri) {
			h.badRequest(ctx, paramSlashBody, limits.RejectMissingURI, start)
			return
		}
		s.nginxRoute = limits.NormalizeRoute(s.nginxRoute[:0], uri)
		if !bytes.Equal(s.nginxRoute, s.route) {
			nginxRoute = s.nginxRoute
		}
	}

	// The address is copied out at once: PeekAll's result is only valid
	// until the next PeekAll.
	addr, ok := h.clientIP(hdr)
	if !ok {
		h.badRequest(ctx, h.noIP, limits.RejectIP, start)
		return
	}
	s.ip = limits.AppendIPIdentity(s.ip[:0], addr, h.ipv6Prefix)

	var cost int64
	if h.costHeader != nil {
		// An empty value counts as absent: NGINX omits a header whose
		// variable is empty, so the two cannot mean different things.
		if v := hdr.PeekCanonical(h.costHeader); len(v) > 0 {
			if cost, ok = parseCost(v, h.maxCost); !ok {
				h.badRequest(ctx, h.badCost, limits.RejectCost, start)
				return
			}
		}
	}

	method := hdr.PeekCanonical(h.methodHeader)
	if len(method) == 0 {
		method = hdr.Method()
	}
	// An absolute URL (ingress-nginx's X-Original-URL) names the host
	// NGINX served; a client-sent X-Original-Host cannot say another.
	host, fromURL := limits.URLHost(uri)
	if !fromURL {
		host = hdr.PeekCanonical(h.hostHeader)
		if len(host) == 0 {
			host = hdr.Host()
		}
	}
	// Host names are case-insensitive, and a port or a trailing dot names
	// the same host: one host must be one counter, whichever header said it.
	s.host = limits.AppendHost(s.host[:0], host)

	if o := h.repeatedIdentity(hdr); o != nil {
		h.badRequest(ctx, o.body, limits.RejectDuplicateHeader, start)
		return
	}
	if h.headers != nil {
		// One load for the check and the decision: a reload between two
		// would decide the request by rules whose headers were not checked.
		if !rules.Valid() {
			rules = h.headers.RuleSet()
		}
		names := rules.Headers()
		s.listed = h.listedNames(s.listed[:0], hdr.Peek(repeatedHeader), names)
		for i, name := range names {
			if repeated(hdr, name, s.listed[i]) {
				// NGINX passes every copy on, and the application may take
				// another than the first, which a rule would count.
				h.badRequest(ctx, []byte("duplicate "+name+" header: a header the rate-limit rules read must be sent once\n"),
					limits.RejectDuplicateHeader, start)
				return
			}
		}
	}

	s.req = limits.Request{
		Method:     method,
		Route:      s.route,
		NginxRoute: nginxRoute,
		Host:       s.host,
		IP:         s.ip,
		User:       hdr.PeekCanonical(h.userHeader),
		Headers:    hdr,
		Cost:       cost,
		Addr:       addr,
		RuleSet:    rules,
	}

	s.ctx.start(start, h.timeout)
	s.deciding = true
	err := h.dec.Decide(s.ctx, &s.req, &s.dec)
	s.deciding = false
	switch {
	case s.dec.Undecided:
		h.storeFailed(ctx, s.dec.Mode, err)
	case s.dec.Local:
		// The shared store could not decide and the local fallback did.
		h.errLog.Warn().Err(err).Str("fallback", s.dec.Fallback.String()).Msg("rate-limit store failed; decided by the local fallback")
		ctx.Response.Header.SetCanonical(hdrStatus, valLocal)
		h.respond(ctx, s)
	default:
		h.respond(ctx, s)
	}
	if h.obs != nil {
		h.obs.Decided(&s.dec, time.Since(start))
	}
}

// hasParams reports whether uri may hold a path parameter: a ';', literal
// or escaped (a query's count too: the check is only to skip the second
// normalization for the many requests without one).
func hasParams(uri []byte) bool {
	if bytes.IndexByte(uri, ';') >= 0 {
		return true
	}
	for i := bytes.IndexByte(uri, '%'); i >= 0 && i+2 < len(uri); {
		if uri[i+1] == '3' && (uri[i+2] == 'B' || uri[i+2] == 'b') {
			return true
		}
		j := bytes.IndexByte(uri[i+1:], '%')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}

// maxPooledBuf bounds each buffer kept in the pool, so one huge request
// does not pin its memory for good.
const maxPooledBuf = 16 << 10

// put clears the request's references and returns s to the pool, without
// the buffers a huge request grew past maxPooledBuf: only those are grown
// again by the next such request (dropping the whole scratch made it
// regrow every buffer: 86 allocations and twice the CPU from a 16.5 KB
// route on).
func (h *Handler) put(s *scratch) {
	if s.deciding {
		// A decision that panicked (Handler.survive answers it): what it
		// left in s is unknown, so s is not reused.
		return
	}
	s.req = limits.Request{}
	s.route, s.nginxRoute, s.ip, s.host = shed(s.route), shed(s.nginxRoute), shed(s.ip), shed(s.host)
	s.buf, s.list, s.item = shed(s.buf), shed(s.list), shed(s.item)
	s.dec.ShedBuffers(maxPooledBuf)
	h.pool.Put(s)
}

// shed returns b, or nil when it grew past maxPooledBuf.
func shed(b []byte) []byte {
	if cap(b) > maxPooledBuf {
		return nil
	}
	return b
}

// clientIP returns the client address from the configured IP header.
func (h *Handler) clientIP(hdr *fasthttp.RequestHeader) (netip.Addr, bool) {
	if h.xff {
		return forwardedClient(hdr.PeekAll(h.ipHeaderName), h.trusted)
	}
	return parseIP(hdr.PeekCanonical(h.ipHeader))
}

// repeated reports whether the request sent header name (canonical, as
// Limiter.RuleHeaders gives it) more than once. fasthttp keeps a single
// value of a few headers (the last one's), so for those the raw header
// lines are counted. NGINX's Lua variant (nginx/rategate_access.lua)
// passes one copy of some headers the client repeated, and names them in
// X-Rategate-Repeated (named, its value).
func repeated(hdr *fasthttp.RequestHeader, name string, listed bool) bool {
	if listed || len(hdr.PeekAll(name)) > 1 {
		return true
	}
	return slices.Contains(singleValued, name) && rawCount(hdr.RawHeaders(), name) > 1
}

// repeatedHeader lists (comma-separated, any case) headers the client
// sent more than once where the request rategate gets carries one copy:
// the Lua variant sets it, or clears a client's own. Through the plain
// variant a client's copy can only refuse its own request.
const repeatedHeader = "X-Rategate-Repeated"

// nameIndex is the position of each header name of a rule set
// (Limiter.RuleHeaders), by its lower-case spelling.
type nameIndex struct {
	names []string
	pos   map[string]int
	// shortest and longest bound the names' lengths: an item outside
	// them is skipped without a look-up
	shortest, longest int
	// long: the positions of the names longer than listedNames lower-cases
	// on the stack, compared with asciiEqualFold instead
	long []int
}

// maxLowered is the longest list item listedNames lower-cases (on the
// stack) for its look-up.
const maxLowered = 64

// listedNames appends to dst, for each of names, whether the
// comma-separated list names it, in any case. The list is read once,
// whatever the number of names: a client's own X-Rategate-Repeated may
// be 8 KiB long (scanned once per name, 3,500 items under 20 names cost
// 152x an ordinary request).
func (h *Handler) listedNames(dst []bool, list []byte, names []string) []bool {
	for range names {
		dst = append(dst, false)
	}
	if len(list) == 0 || len(names) == 0 {
		return dst
	}
	x := h.names.Load()
	if x == nil || len(x.names) != len(names) || &x.names[0] != &names[0] {
		x = &nameIndex{names: names, pos: make(map[string]int, len(names)), shortest: len(names[0])}
		for i, n := range names {
			l := strings.ToLower(n)
			if _, ok := x.pos[l]; !ok {
				x.pos[l] = i
			}
			x.shortest, x.longest = min(x.shortest, len(l)), max(x.longest, len(l))
			if len(n) > maxLowered {
				x.long = append(x.long, i)
			}
		}
		h.names.Store(x)
	}
	var low [maxLowered]byte
	for i := 0; i < len(list); {
		j := i
		for j < len(list) && list[j] != ',' {
			j++
		}
		item := list[i:j]
		i = j + 1
		if n := len(item); n > 0 && (item[0] <= ' ' || item[0] >= utf8.RuneSelf || item[n-1] <= ' ' || item[n-1] >= utf8.RuneSelf) {
			item = bytes.TrimSpace(item)
		}
		if len(item) < x.shortest || len(item) > x.longest {
			continue
		}
		if len(item) > len(low) {
			// A name this long is rare; lowering the item would allocate.
			for _, k := range x.long {
				if asciiEqualFold(names[k], item) {
					dst[len(dst)-len(names)+k] = true
				}
			}
			continue
		}
		l := low[:0]
		for _, c := range item {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			l = append(l, c)
		}
		if k, ok := x.pos[string(l)]; ok {
			dst[len(dst)-len(names)+k] = true
		}
	}
	return dst
}

// repeatedIdentity returns the first identity header (h.once) the request
// sends more than once, or nil. PeekAll also sees a copy in a chunked
// body's trailer, and its cost hardly grows with the number of header
// lines (about 260 ns for the six with none, 350 ns with 60 other lines,
// where one scan of the raw head took 1.1 µs).
func (h *Handler) repeatedIdentity(hdr *fasthttp.RequestHeader) *onceHeader {
	for i := range h.once {
		if len(hdr.PeekAll(h.once[i].name)) > 1 {
			return &h.once[i]
		}
	}
	return nil
}

// nextHeaderName splits the first line off raw (a head as the client sent
// it) and returns the line's header name, trimmed (empty when the line has
// none), and the lines after it.
func nextHeaderName(raw []byte) (name, rest []byte) {
	line := raw
	if i := bytes.IndexByte(raw, '\n'); i >= 0 {
		line, rest = raw[:i], raw[i+1:]
	}
	if c := bytes.IndexByte(line, ':'); c > 0 {
		name = bytes.TrimSpace(line[:c])
	}
	return name, rest
}

// asciiEqualFold reports whether a and b are equal but for ASCII case.
func asciiEqualFold(a string, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(b); i++ {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if l := x | 0x20; l != y|0x20 || l < 'a' || l > 'z' {
			return false
		}
	}
	return true
}

// singleValued are the request headers fasthttp keeps one value of.
var singleValued = []string{fasthttp.HeaderUserAgent, fasthttp.HeaderContentType, fasthttp.HeaderContentLength,
	fasthttp.HeaderHost, fasthttp.HeaderConnection, fasthttp.HeaderTransferEncoding, fasthttp.HeaderTrailer}

// rawCount counts the header lines of raw (as the client sent them) named
// name, in any case.
func rawCount(raw []byte, name string) int {
	n := 0
	for len(raw) > 0 {
		var got []byte
		got, raw = nextHeaderName(raw)
		if asciiEqualFold(name, got) {
			n++
		}
	}
	return n
}

// parseCost parses a request cost: a decimal integer in [1, max], optionally
// surrounded by spaces. No sign, no exponent.
func parseCost(b []byte, max int64) (int64, bool) {
	b = bytes.Trim(b, " \t")
	if len(b) == 0 || len(b) > 18 { // 18 digits cannot overflow int64
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, n >= 1 && n <= max
}

// badRequest answers 400 with body and tells the observer why.
func (h *Handler) badRequest(ctx *fasthttp.RequestCtx, body []byte, reason limits.RejectReason, start time.Time) {
	ctx.SetStatusCode(fasthttp.StatusBadRequest)
	ctx.SetBody(body)
	if h.obs != nil {
		h.obs.Rejected(reason, time.Since(start))
	}
}

// storeFailed answers a request nothing could decide, as the failure mode
// says: deny is 503, allow (and local, whose fallback failed too) 204.
func (h *Handler) storeFailed(ctx *fasthttp.RequestCtx, mode limits.FailureMode, err error) {
	h.errLog.Warn().Err(err).Str("failure_mode", mode.String()).Msg("rate-limit store failed; request not decided")
	ctx.Response.Header.SetCanonical(hdrStatus, valUnavailable)
	if mode == limits.FailDeny {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		msg := "unknown error"
		if err != nil {
			msg = err.Error()
		}
		ctx.SetBodyString("rate-limit store unavailable: " + msg + "\n")
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// respond writes the decision in s.dec: status, rate-limit headers and, for
// a denial, a one-line reason. Shadow verdicts are left out of the headers;
// one that would have denied is logged (sampled).
func (h *Handler) respond(ctx *fasthttp.RequestCtx, s *scratch) {
	d := &s.dec
	resp := &ctx.Response.Header

	// The verdict with the least remaining quota (X-RateLimit-*).
	best := -1
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		if v.Rule.Shadow {
			if !v.Result.Allowed {
				h.logShadow(ctx, v, s)
			}
			continue
		}
		if best < 0 || v.Result.Remaining < d.Verdicts[best].Result.Remaining {
			best = i
		}
	}
	buf := s.buf[:0]
	if best >= 0 {
		var list []byte
		buf, list = s.appendLists(buf, d, best)
		resp.SetCanonical(hdrPolicy, buf)
		resp.SetCanonical(hdrRateLimit, list)
		s.list = list

		b := &d.Verdicts[best]
		resp.SetCanonical(hdrLimit, s.ruleText(best, b.Rule).limit)
		buf = strconv.AppendInt(buf[:0], max(b.Result.Remaining, 0), 10)
		resp.SetCanonical(hdrRemaining, buf)
		buf = strconv.AppendInt(buf[:0], usToSeconds(b.Result.ResetUS), 10)
		resp.SetCanonical(hdrReset, buf)
	}

	if d.Admitted {
		s.buf = buf
		ctx.SetStatusCode(fasthttp.StatusNoContent)
		return
	}

	ctx.SetStatusCode(int(h.denyStatus.Load()))
	if d.Denier < 0 || d.Denier >= len(d.Verdicts) {
		// A store that denies without naming a rule: still a denial.
		s.buf = buf
		return
	}
	v := &d.Verdicts[d.Denier]
	name := v.Rule.Name
	buf = appendHeaderSafe(buf[:0], name)
	resp.SetCanonical(hdrRule, buf)

	// A denial has no body: NGINX reuses its keep-alive connection to
	// rategate only after a response whose body it did not have to read
	// (auth_request never reads one), and under attack denials are most
	// answers. Retry-After and X-RateLimit-Rule carry everything. The one
	// exception is a cost that can never fit: a configuration problem
	// worth a sentence, and rare.
	if v.Rule.Identity == limits.IdentityBlock && v.Result.RetryUS == limits.NeverFits {
		// A block without an end: no Retry-After, and a sentence.
		buf = append(buf[:0], "blocked by rule "...)
		buf = appendSFString(buf, name)
		buf = append(buf, '\n')
		ctx.SetBody(buf)
	} else if v.Result.RetryUS == limits.NeverFits {
		buf = append(buf[:0], "rate limited by rule "...)
		buf = appendSFString(buf, name)
		buf = append(buf, "; request cost "...)
		buf = strconv.AppendInt(buf, v.Cost, 10)
		buf = append(buf, " can never fit (burst "...)
		buf = strconv.AppendInt(buf, v.Rule.Burst, 10)
		buf = append(buf, ")\n"...)
		ctx.SetBody(buf)
	} else {
		retry := max(usToSeconds(v.Result.RetryUS), 1)
		buf = strconv.AppendInt(buf[:0], retry, 10)
		resp.SetCanonical(hdrRetryAfter, buf)
	}
	s.buf = buf

	if e := h.denyLog.Info(); e.Enabled() {
		if d.Cached {
			e.Bool("deny_cache", true)
		}
		if v.Rule.Identity != limits.IdentityNone {
			e.Str("identity_override", v.Rule.Identity.String())
		}
		h.verdictFields(e, ctx, v, s).Msg("request limited")
	}
}

// logShadow logs, sampled, a shadow rule that would have denied s's request.
func (h *Handler) logShadow(ctx *fasthttp.RequestCtx, v *limits.Verdict, s *scratch) {
	if e := h.shadowLog.Info(); e.Enabled() {
		h.verdictFields(e.Bool("shadow", true), ctx, v, s).
			Msg("shadow rule would have limited this request (not enforced)")
	}
}

// maxLoggedRequestID bounds the request id a log line quotes: NGINX's is 32
// hex digits, and a setup that passes the client's own header through must
// not let it grow log lines.
const maxLoggedRequestID = 64

// maxLoggedValue bounds each identity value a denial line quotes (the
// user, route, method, host and header dimensions): the client chooses
// them, up to NGINX's header buffers (8 KiB each by default), and the line
// writes a raw byte as "%E9" or "\ufffd": whole, one denial wrote 120 KB,
// and the sampled lines of one client over its limit megabytes a second.
// The store key (its identity hashed past 96 bytes) names the identity
// whole; "clipped" says a value was cut.
const maxLoggedValue = 128

// logged returns b cut to maxLoggedValue, and whether it was cut.
func logged(b []byte, clipped *bool) []byte {
	if len(b) <= maxLoggedValue {
		return b
	}
	*clipped = true
	return b[:maxLoggedValue]
}

// verdictFields adds to e what answers "why was this request limited?":
// the rule, every identity dimension (ip, user, route, method, host, and the
// headers the rule is keyed on), the store key, the rule's numbers and this
// request's, and NGINX's request id. Durations carry their unit in the name.
func (h *Handler) verdictFields(e *zerolog.Event, ctx *fasthttp.RequestCtx, v *limits.Verdict, s *scratch) *zerolog.Event {
	r := v.Rule
	clipped := false
	e.Str("rule", r.Name).
		Bytes("ip", s.req.IP).
		Bytes("user", logged(s.req.User, &clipped)).
		Bytes("route", logged(s.req.Route, &clipped)).
		Bytes("method", logged(s.req.Method, &clipped)).
		Bytes("host", logged(s.req.Host, &clipped))
	if hasHeaderKey(r) {
		hd := zerolog.Dict()
		for _, p := range r.Key {
			if p.Kind == limits.KeyHeader {
				hd.Bytes(p.Header, logged(s.req.Headers.Peek(p.Header), &clipped))
			}
		}
		e.Dict("headers", hd)
	}
	if clipped {
		e.Bool("clipped", true)
	}
	e.Str("key", v.Key).
		Int64("limit", r.Limit).
		Int64("period_ms", r.Period.Milliseconds()).
		Int64("remaining", max(v.Result.Remaining, 0)).
		Int64("cost", v.Cost)
	if v.Result.RetryUS == limits.NeverFits {
		e.Bool("never_fits", true)
	} else {
		e.Int64("retry_after_ms", ceilDiv(v.Result.RetryUS, 1000))
	}
	if id := ctx.Request.Header.PeekCanonical(h.requestIDHeader); len(id) > 0 {
		e.Bytes("request_id", id[:min(len(id), maxLoggedRequestID)])
	}
	return e
}

// hasHeaderKey reports whether r is keyed on a request header.
func hasHeaderKey(r *limits.Rule) bool {
	for _, p := range r.Key {
		if p.Kind == limits.KeyHeader {
			return true
		}
	}
	return false
}

// usToSeconds converts a duration in microseconds to whole seconds, rounded
// up; negative durations are 0.
func usToSeconds(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return ceilDiv(us, 1_000_000)
}

// ceilDiv is a/b rounded up, for a >= 0 and b > 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a-1)/b + 1
}

// appendSFString appends name as a structured-field string (RFC 8941 §3.3.3):
// quoted, with '"' and '\' escaped. Rule names are [a-z0-9_-]+ after config
// validation; any other byte outside printable ASCII becomes '?' so a
// header can never be broken by a name.
func appendSFString(dst []byte, name string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c > 0x7e:
			dst = append(dst, '?')
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// appendHeaderSafe appends name with bytes outside printable ASCII replaced
// by '?'.
func appendHeaderSafe(dst []byte, name string) []byte {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		dst = append(dst, c)
	}
	return dst
}

// maxListBytes bounds each of RateLimit-Policy and RateLimit. A client
// chooses how many rules its request matches (a header or a path a rule
// matches on), and NGINX reads the answer's head into one buffer (4 KiB
// by default, proxy_buffer_size): a head that does not fit is a 502 to
// NGINX, which the shipped configs let through as rategate unavailable,
// and which makes NGINX take the instance for down. Two lists of 1 KiB
// and the rest of the head fit with room to spare.
const maxListBytes = 1024

// appendLists writes RateLimit-Policy's items to pol and RateLimit's to
// list (s.list's space): one per non-shadow verdict, in rule order; past
// maxListBytes, as appendBounded keeps them.
func (s *scratch) appendLists(pol []byte, d *limits.Decision, best int) (_, list []byte) {
	list = s.list[:0]
	start := len(pol)
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		if v.Rule.Shadow {
			continue
		}
		if len(list) > 0 {
			pol = append(pol, ", "...)
			list = append(list, ", "...)
		}
		pol = append(pol, s.ruleText(i, v.Rule).policy...)
		list = appendRateLimitItem(list, s, i, v)
	}
	if len(pol)-start <= maxListBytes && len(list) <= maxListBytes {
		return pol, list
	}
	return s.appendBounded(pol[:start], list[:0], d, best)
}

// appendBounded is appendLists past maxListBytes: the items of the verdict
// with the least remaining quota (best) and of the one that denied
// always, room kept for them, and the others in rule order while both
// lists stay within maxListBytes.
func (s *scratch) appendBounded(pol, list []byte, d *limits.Decision, best int) (_, _ []byte) {
	start := len(pol)
	must := func(i int) bool { return i == best || (!d.Admitted && i == d.Denier) }
	var resPol, resList int // room kept for the must items not yet written
	for i := range d.Verdicts {
		if must(i) {
			s.item = appendRateLimitItem(s.item[:0], s, i, &d.Verdicts[i])
			resPol += 2 + len(s.ruleText(i, d.Verdicts[i].Rule).policy)
			resList += 2 + len(s.item)
		}
	}
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		if v.Rule.Shadow {
			continue
		}
		p := s.ruleText(i, v.Rule).policy
		s.item = appendRateLimitItem(s.item[:0], s, i, v)
		if must(i) {
			resPol -= 2 + len(p)
			resList -= 2 + len(s.item)
		} else if len(pol)-start+2+len(p)+resPol > maxListBytes || len(list)+2+len(s.item)+resList > maxListBytes {
			continue
		}
		if len(list) > 0 {
			pol = append(pol, ", "...)
			list = append(list, ", "...)
		}
		pol = append(pol, p...)
		list = append(list, s.item...)
	}
	return pol, list
}

// appendRateLimitItem appends verdict v's RateLimit item (v is the i-th).
func appendRateLimitItem(dst []byte, s *scratch, i int, v *limits.Verdict) []byte {
	dst = append(dst, s.ruleText(i, v.Rule).name()...)
	dst = append(dst, ";r="...)
	dst = strconv.AppendInt(dst, max(v.Result.Remaining, 0), 10)
	dst = append(dst, ";t="...)
	return strconv.AppendInt(dst, usToSeconds(v.Result.ResetUS), 10)
}

// ruleText is what the rate-limit headers say of one rule, formatted once:
// its RateLimit-Policy item (the name as a structured-field string, then
// ";q=" and ";w=") and its limit in decimal.
type ruleText struct {
	rule    *limits.Rule
	policy  []byte
	nameLen int // policy[:nameLen] is the quoted name
	limit   []byte
}

// name is the rule's name as a structured-field string.
func (t *ruleText) name() []byte { return t.policy[:t.nameLen] }

// maxRuleTexts bounds the rules a scratch keeps formatted: the verdicts
// past it are formatted for each answer.
const maxRuleTexts = 8

// ruleText returns the header text of rule r, the i-th verdict of the
// answer. A scratch keeps the text of the rules of its last answers by
// verdict position, so a rule that comes back in the same place is not
// formatted again. Rules are immutable once built, and the kept pointer
// keeps r alive (no other rule can take its address), so the same pointer
// is the same text; anything else is formatted afresh. Positions past the
// kept ones are formatted into the spare for each answer.
func (s *scratch) ruleText(i int, r *limits.Rule) *ruleText {
	if i < len(s.rules) && s.rules[i].rule == r {
		return &s.rules[i]
	}
	t := &s.spare
	if i < maxRuleTexts {
		for len(s.rules) <= i {
			s.rules = append(s.rules, ruleText{})
		}
		t = &s.rules[i]
		t.rule = r
	}
	q, w, _ := limits.PolicyWindow(r.Limit, r.Period)
	t.policy = appendSFString(t.policy[:0], r.Name)
	t.nameLen = len(t.policy)
	t.policy = append(t.policy, ";q="...)
	t.policy = strconv.AppendInt(t.policy, q, 10)
	t.policy = append(t.policy, ";w="...)
	t.policy = strconv.AppendInt(t.policy, w, 10)
	t.limit = strconv.AppendInt(t.limit[:0], r.Limit, 10)
	return t
}
