package handler

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits/memstore"

	"github.com/rategate/rategate/limits"
	"github.com/valyala/fasthttp"
)

// This file holds the helpers of the listener tests: a real fasthttp server
// on a loopback port, a client, and the limiter built on the memory store.

// testServer is a Handler served on 127.0.0.1:0.
type testServer struct {
	addr   string
	client *fasthttp.HostClient
}

// serve starts h on a fresh loopback port until the test ends.
func serve(t *testing.T, h *Handler) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noErr(t, err)
	srv := &fasthttp.Server{
		Handler: h.Serve,
		// NGINX's large_client_header_buffers default is 8k per line; the
		// server must take that much or hostile values never reach /auth.
		ReadBufferSize: 64 << 10,
		// fasthttp logs every malformed request it rejects itself; the
		// hostile-input tests send many on purpose.
		Logger: quiet{},
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		noErr(t, srv.Shutdown())
		noErr(t, <-done)
	})
	return &testServer{
		addr:   ln.Addr().String(),
		client: &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 512, ReadBufferSize: 64 << 10},
	}
}

// quiet is a fasthttp.Logger that drops everything.
type quiet struct{}

func (quiet) Printf(string, ...any) {}

// reply is a response reduced to what the tests compare.
type reply struct {
	status int
	body   string
	// headers are the response's headers, lower-case names, except the
	// ones fasthttp always writes (Server, Date, Content-Type, Content-Length).
	headers map[string]string
}

// get sends method path with the headers given as name, value pairs; a name
// given twice becomes two header lines.
func (ts *testServer) get(t *testing.T, path string, kv ...string) reply {
	t.Helper()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + ts.addr + path)
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Add(kv[i], kv[i+1])
		if strings.EqualFold(kv[i], "Host") {
			req.UseHostHeader = true
		}
	}
	noErr(t, ts.client.DoTimeout(req, resp, 5*time.Second))
	return toReply(resp)
}

// auth is get("/auth", ...).
func (ts *testServer) auth(t *testing.T, kv ...string) reply {
	t.Helper()
	return ts.get(t, "/auth", kv...)
}

func toReply(resp *fasthttp.Response) reply {
	r := reply{status: resp.StatusCode(), body: string(resp.Body()), headers: map[string]string{}}
	for k, v := range resp.Header.All() {
		name := strings.ToLower(string(k))
		switch name {
		case "server", "date", "content-type", "content-length":
			continue
		}
		if _, dup := r.headers[name]; dup {
			r.headers[name] += "\n" + string(v) // make duplicates visible
			continue
		}
		r.headers[name] = string(v)
	}
	return r
}

// raw sends request bytes as they are over a new connection and parses the
// answer with net/http, which needs no cooperation from the sender's side:
// the fasthttp and net/http clients refuse to send the hostile bytes.
func (ts *testServer) raw(t *testing.T, request string) (status int, body string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", ts.addr, 5*time.Second)
	noErr(t, err)
	defer conn.Close()
	noErr(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = io.WriteString(conn, request)
	noErr(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	noErr(t, err, "no HTTP answer to %.200q", request)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	noErr(t, err)
	return resp.StatusCode, string(b)
}

// pinnedClock is the real limiter deciding at a fixed store time, so that
// reset and retry values are exact. now is set 18 s into a minute and an
// hour, two hours ahead: 60 s windows then reset in 42 s, 1 h windows in
// 3582 s, and the memory store's janitor (on the real clock) expires nothing.
type pinnedClock struct {
	l   *limits.Limiter
	now int64
}

func (p pinnedClock) Decide(ctx context.Context, req *limits.Request, d *limits.Decision) error {
	return p.l.DecideAt(ctx, req, d, p.now)
}

// RuleHeaders passes the limiter's on: a pinned limiter refuses what the
// limiter itself would.
func (p pinnedClock) RuleSet() limits.RuleSet { return p.l.RuleSet() }

func pinnedNow() int64 {
	hour := (time.Now().Unix()/3600 + 2) * 3600
	return hour*1_000_000 + 18_000_000
}

// newLimiter returns a limiter on a fresh memory store, closed at the end of
// the test.
func newLimiter(t *testing.T, rules ...*limits.Rule) (*limits.Limiter, *memstore.Store) {
	t.Helper()
	store := memstore.New()
	t.Cleanup(func() { noErr(t, store.Close()) })
	return limits.NewLimiter(store, "rg", rules), store
}

// pinned returns a Handler over a pinned-clock limiter with the rules.
func pinned(t *testing.T, opts Options, rules ...*limits.Rule) *testServer {
	t.Helper()
	l, _ := newLimiter(t, rules...)
	return serve(t, New(pinnedClock{l: l, now: pinnedNow()}, l, opts))
}

// rule is a fixed_window rule with burst = limit and cost 1.
func rule(name string, limit int64, period time.Duration, key ...limits.KeyKind) *limits.Rule {
	r := &limits.Rule{
		Name: name, Algorithm: limits.FixedWindow,
		Limit: limit, Period: period, Burst: limit, Cost: 1,
	}
	for _, k := range key {
		r.Key = append(r.Key, limits.KeyPart{Kind: k})
	}
	return r
}

// failingStore fails every decision and ping, like an unreachable Redis
// behind a limiter without a fallback: every decision is answered by the
// failure mode. It records the deadline of the last call.
type failingStore struct {
	err      error
	mode     limits.FailureMode
	deadline chan time.Duration
}

func (f *failingStore) Decide(ctx context.Context, _ *limits.Request, d *limits.Decision) error {
	f.recordDeadline(ctx)
	d.Verdicts, d.Denier = d.Verdicts[:0], -1
	d.Undecided, d.Mode, d.Err, d.Local = true, f.mode, f.err, false
	d.Admitted = f.mode != limits.FailDeny
	return f.err
}

func (f *failingStore) Ping(ctx context.Context) error {
	f.recordDeadline(ctx)
	return f.err
}

func (f *failingStore) StoreName() string { return "redis 127.0.0.1:1" }

func (f *failingStore) recordDeadline(ctx context.Context) {
	dl, ok := ctx.Deadline()
	left := time.Duration(-1)
	if ok {
		left = time.Until(dl)
	}
	select {
	case f.deadline <- left:
	default:
	}
}

// recorder admits everything and keeps a copy of the last identity.
type recorder struct{ got chan string }

func (r *recorder) Decide(_ context.Context, req *limits.Request, d *limits.Decision) error {
	d.Admitted, d.Denier, d.Verdicts = true, -1, d.Verdicts[:0]
	r.got <- fmt.Sprintf("method=%s route=%s host=%s ip=%s user=%s cost=%d",
		req.Method, req.Route, req.Host, req.IP, req.User, req.Cost)
	return nil
}

// canned fills every decision with a fixed one, for response formatting
// cases a real store produces only at awkward moments.
type canned limits.Decision

func (c *canned) Decide(_ context.Context, _ *limits.Request, d *limits.Decision) error {
	d.Admitted, d.Denier = c.Admitted, c.Denier
	d.Verdicts = append(d.Verdicts[:0], c.Verdicts...)
	return nil
}

// rawRoundTrip sends request over a new connection and returns everything the
// server writes until it closes (the request should ask Connection: close).
func rawRoundTrip(t *testing.T, ts *testServer, request string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", ts.addr, 5*time.Second)
	noErr(t, err)
	defer conn.Close()
	noErr(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = io.WriteString(conn, request)
	noErr(t, err)
	b, err := io.ReadAll(conn)
	noErr(t, err)
	return string(b)
}

// The checks below keep the tests on the standard library alone.

// equal reports a difference between want and got; msg is a format and its
// arguments.
func equal(t *testing.T, want, got any, msg ...any) bool {
	t.Helper()
	if reflect.DeepEqual(want, got) {
		return true
	}
	t.Errorf("%s\n got: %#v\nwant: %#v", format(msg), got, want)
	return false
}

// mustEqual is equal, stopping the test on a difference.
func mustEqual(t *testing.T, want, got any, msg ...any) {
	t.Helper()
	if !equal(t, want, got, msg...) {
		t.FailNow()
	}
}

// check reports a failed condition.
func check(t *testing.T, ok bool, msg ...any) {
	t.Helper()
	if !ok {
		t.Error(format(msg))
	}
}

// noErr stops the test on an error.
func noErr(t *testing.T, err error, msg ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", format(msg), err)
	}
}

func format(msg []any) string {
	if len(msg) == 0 {
		return "check failed"
	}
	if f, ok := msg[0].(string); ok {
		return fmt.Sprintf(f, msg[1:]...)
	}
	return fmt.Sprint(msg...)
}
