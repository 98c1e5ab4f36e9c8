package handler

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// These tests run the hardened server of NewServer, with short timeouts,
// against clients that misbehave on purpose.

// hardened serves a handler over the memory limiter (one generous per-IP
// rule) with NewServer(opts) on a loopback port until the test ends.
func hardened(t *testing.T, opts ServerOptions) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noErr(t, err)
	return hardenedOn(t, opts, ln)
}

// hardenedOn is hardened on a listener of the test's making.
func hardenedOn(t *testing.T, opts ServerOptions, ln net.Listener) string {
	t.Helper()
	l, _ := newLimiter(t, rule("per-ip", 1<<30, time.Minute, limits.KeyIP))
	return serveOn(t, NewServer(New(l, l, Options{}), opts), ln, LingerListener(ln, nil))
}

// serveNew serves h with NewServer's defaults on a loopback port until
// the test ends, and returns the address.
func serveNew(t *testing.T, h *Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noErr(t, err)
	return serveOn(t, NewServer(h, ServerOptions{}), ln, ln)
}

// serveOn runs srv on served (ln, or a wrapper of it) until the test ends,
// then closes ln, and returns ln's address.
func serveOn(t *testing.T, srv *fasthttp.Server, ln, served net.Listener) string {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(served) }()
	t.Cleanup(func() {
		noErr(t, ln.Close())
		noErr(t, <-done)
	})
	return ln.Addr().String()
}

const goodRequest = "GET /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /\r\nX-Real-IP: 192.0.2.1\r\n\r\n"

// dial opens a connection with a 5s deadline for everything.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	noErr(t, err)
	noErr(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	t.Cleanup(func() { c.Close() })
	return c
}

// readStatus reads one response from br and returns its status and body.
func readStatus(t *testing.T, br *bufio.Reader) (int, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	noErr(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	noErr(t, err)
	return resp.StatusCode, string(b)
}

// timedGood sends a good request on a new connection and returns the status
// and how long the answer took.
func timedGood(t *testing.T, addr string) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	c := dial(t, addr)
	_, err := io.WriteString(c, goodRequest)
	noErr(t, err)
	status, _ := readStatus(t, bufio.NewReader(c))
	c.Close()
	return status, time.Since(start)
}

// waitClosed reads from c until the server closes it (or answers and then
// closes), failing the test if that takes longer than within.
func waitClosed(t *testing.T, c net.Conn, within time.Duration) {
	t.Helper()
	if !closedWithin(c, within) {
		t.Fatalf("connection still open after %v", within)
	}
}

// closedWithin reads and discards from c until the server closes it and
// reports whether that happened within the given time.
func closedWithin(c net.Conn, within time.Duration) bool {
	if err := c.SetReadDeadline(time.Now().Add(within)); err != nil {
		return true // already closed on our side
	}
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

func TestServerAnswersBeforeTheBody(t *testing.T) {
	addr := hardened(t, ServerOptions{})
	// A 10 MB body announced, 2 KiB sent: the answer comes from the headers
	// at once, and the server closes the connection instead of reading 10 MB.
	c := dial(t, addr)
	head := strings.Replace(goodRequest, "\r\n\r\n", "\r\nContent-Length: 10000000\r\n\r\n", 1)
	_, err := io.WriteString(c, head+strings.Repeat("x", 2048))
	noErr(t, err)
	start := time.Now()
	br := bufio.NewReader(c)
	status, _ := readStatus(t, br)
	equal(t, 204, status)
	check(t, time.Since(start) < time.Second, "answer took %v", time.Since(start))
	waitClosed(t, c, 2*time.Second)

	// An endless chunked body: same.
	c = dial(t, addr)
	head = strings.Replace(goodRequest, "\r\n\r\n", "\r\nTransfer-Encoding: chunked\r\n\r\n", 1)
	_, err = io.WriteString(c, head+"400\r\n"+strings.Repeat("y", 1024)+"\r\n")
	noErr(t, err)
	status, _ = readStatus(t, bufio.NewReader(c))
	equal(t, 204, status)

	// A small body is skipped and the connection stays usable: the body is
	// never parsed as a second request.
	c = dial(t, addr)
	smuggled := "GET /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /smuggled\r\nX-Real-IP: 192.0.2.66\r\n\r\n"
	head = strings.Replace(goodRequest, "\r\n\r\n", "\r\nContent-Length: "+strconv.Itoa(len(smuggled))+"\r\n\r\n", 1)
	_, err = io.WriteString(c, head+smuggled+goodRequest)
	noErr(t, err)
	br = bufio.NewReader(c)
	for i := range 2 {
		status, _ := readStatus(t, br)
		equal(t, 204, status, "response %d", i)
	}
	noErr(t, c.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
	_, err = br.ReadByte()
	check(t, err != nil, "a third response: the body was parsed as a request")
}

func TestServerHeadSizes(t *testing.T) {
	addr := hardened(t, ServerOptions{})
	// Four 8 KiB identity headers, NGINX's largest lines, reach the handler.
	big := strings.Repeat("u", 8<<10)
	req := "GET /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /" + big + "\r\nX-Real-IP: 192.0.2.1\r\n" +
		"X-User-Id: " + big + "\r\nX-Original-Host: " + big + "\r\nX-Plan: " + big + "\r\nConnection: close\r\n\r\n"
	c := dial(t, addr)
	_, err := io.WriteString(c, req)
	noErr(t, err)
	status, body := readStatus(t, bufio.NewReader(c))
	equal(t, 204, status, body)

	// A head larger than the read buffer gets 431 and the connection ends.
	c = dial(t, addr)
	req = "GET /auth HTTP/1.1\r\nHost: x\r\n" + strings.Repeat("X-Junk: "+strings.Repeat("j", 1000)+"\r\n", 80) + "\r\n"
	_, _ = io.WriteString(c, req) // the server may close before reading it all
	status, _ = readStatus(t, bufio.NewReader(c))
	equal(t, 431, status)

	// Far over it (20 MiB of one header): the client can send it all
	// without a reset, and reads the 431 (a lingering close drains what
	// it still sends instead of answering it with RST).
	c = dial(t, addr)
	big = "GET /auth HTTP/1.1\r\nHost: x\r\nX-Junk: " + strings.Repeat("j", 20<<20) + "\r\n\r\n"
	_, err = io.WriteString(c, big)
	noErr(t, err)
	status, _ = readStatus(t, bufio.NewReader(c))
	equal(t, 431, status)
}

func TestServerMaxConns(t *testing.T) {
	addr := hardened(t, ServerOptions{MaxConns: 4})
	// Four keep-alive connections, each having made a request, fill it.
	conns := make([]net.Conn, 4)
	for i := range conns {
		conns[i] = dial(t, addr)
		_, err := io.WriteString(conns[i], goodRequest)
		noErr(t, err)
		status, _ := readStatus(t, bufio.NewReader(conns[i]))
		equal(t, 204, status)
	}
	// The fifth gets a clear 503 and is closed. It carries none of the
	// handler's headers: no X-RateLimit-Status, by which NGINX's access
	// log (rategate-status.conf) tells it from a store-down 503.
	c := dial(t, addr)
	_, _ = io.WriteString(c, goodRequest)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	noErr(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	equal(t, 503, resp.StatusCode)
	check(t, strings.Contains(string(b), "Concurrency limit exceeded"), "503 body %q does not say why", b)
	check(t, resp.Header.Get("X-RateLimit-Status") == "", "the 503 at the connection limit says X-RateLimit-Status %q", resp.Header.Get("X-RateLimit-Status"))

	// One leaves; a new connection is served again.
	conns[0].Close()
	deadline := time.Now().Add(2 * time.Second)
	for {
		status, _ := timedGood(t, addr)
		if status == 204 {
			break
		}
		check(t, time.Now().Before(deadline), "still %d 2s after a connection was freed", status)
		if t.Failed() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServerSlowLoris(t *testing.T) {
	addr := hardened(t, ServerOptions{ReadTimeout: 300 * time.Millisecond})
	// 100 clients trickle a request head one byte every 50ms, which would
	// take them many seconds to finish.
	const n = 100
	stop := make(chan struct{})
	var wg sync.WaitGroup
	closedAfter := make(chan time.Duration, n)
	start := time.Now()
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		noErr(t, err)
		wg.Go(func() {
			defer c.Close()
			for _, b := range []byte(goodRequest) {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				_ = c.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := c.Write([]byte{b}); err != nil {
					break
				}
			}
			if closedWithin(c, 3*time.Second) {
				closedAfter <- time.Since(start)
			} else {
				closedAfter <- time.Hour
			}
		})
	}
	// Meanwhile a well-behaved client is answered at once.
	for range 10 {
		status, d := timedGood(t, addr)
		equal(t, 204, status)
		check(t, d < time.Second, "good request took %v during the slow-loris", d)
		time.Sleep(20 * time.Millisecond)
	}
	// Every slow connection is closed by the server shortly after its
	// ReadTimeout, long before it could finish its request.
	wg.Wait()
	close(stop)
	close(closedAfter)
	var worst time.Duration
	for d := range closedAfter {
		worst = max(worst, d)
	}
	t.Logf("100 slow-loris connections closed by the server within %v (ReadTimeout 300ms; finishing would take %v)",
		worst, time.Duration(len(goodRequest))*50*time.Millisecond)
	check(t, worst < 2*time.Second, "slow connections held for %v", worst)
}

// TestServerFirstRequestFromAccept: a new connection's ReadTimeout runs
// from accept, not from its first byte: a client that waits before its
// first byte and then trickles its head is closed after ReadTimeout, not
// nearly twice that (fasthttp's ReduceMemoryUsage would restart it).
func TestServerFirstRequestFromAccept(t *testing.T) {
	const timeout = 400 * time.Millisecond
	addr := hardened(t, ServerOptions{ReadTimeout: timeout})
	c := dial(t, addr)
	start := time.Now()
	time.Sleep(timeout - 50*time.Millisecond)
	for _, b := range []byte(goodRequest) {
		if _, err := c.Write([]byte{b}); err != nil {
			break
		}
		if closedWithin(c, 30*time.Millisecond) {
			break
		}
	}
	held := time.Since(start)
	t.Logf("ReadTimeout %v: a client that waited %v before its first byte was closed after %v", timeout, timeout-50*time.Millisecond, held)
	check(t, held < timeout*3/2, "connection held %v, want about ReadTimeout (%v) from accept", held, timeout)
}

// settledHeap is the live heap after two collections (the second frees
// what the first's finalizers and sync.Pool's victim cache released).
func settledHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestServerIdleConnectionMemory: what an idle keep-alive connection pins
// is its read buffer and little more (DefaultMaxConns says so).
func TestServerIdleConnectionMemory(t *testing.T) {
	if raceEnabled {
		t.Skip("heap sizes differ under the race detector")
	}
	addr := hardened(t, ServerOptions{})
	const n = 200
	before := settledHeap()
	for range n {
		c := dial(t, addr)
		noErr(t, c.SetDeadline(time.Time{}))
		_, err := io.WriteString(c, goodRequest)
		noErr(t, err)
		status, _ := readStatus(t, bufio.NewReader(c))
		equal(t, 204, status)
	}
	time.Sleep(100 * time.Millisecond) // every server goroutine back in its idle wait
	per := (settledHeap() - before) / n
	t.Logf("heap per idle keep-alive connection: %.1f KiB (read buffer %d KiB)", float64(per)/1024, DefaultReadBufferSize>>10)
	check(t, per < DefaultReadBufferSize+16<<10, "an idle connection pins %d bytes, want at most the read buffer and 16 KiB", per)
}

// TestServerBigHeadConnectionMemory: fasthttp keeps a connection's parsed
// request head while it idles (two copies, sized to the largest head it
// carried: 181 KiB a connection after a 60 KB head measured here, 1.7 GiB
// at DefaultMaxConns). Once the listener is crowded, a connection that
// carried a head over bigHead is answered with Connection: close and
// ends, so such connections pin no more than
// TestServerIdleConnectionMemory's. Below that (NGINX's keep-alive
// connections) it stays open: a close per request would move NGINX to a
// new connection per request.
func TestServerBigHeadConnectionMemory(t *testing.T) {
	if raceEnabled {
		t.Skip("heap sizes differ under the race detector")
	}
	defer func(n int64) { crowdedConns = n }(crowdedConns)
	crowdedConns = 20
	addr := hardened(t, ServerOptions{})
	big := "GET /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /\r\nX-Real-IP: 192.0.2.1\r\nX-Pad: " +
		strings.Repeat("p", 60_000) + "\r\n\r\n"
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	send := func(req string) *http.Response {
		t.Helper()
		c := dial(t, addr)
		noErr(t, c.SetDeadline(time.Time{}))
		_, err := io.WriteString(c, req)
		noErr(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		noErr(t, err)
		resp.Body.Close()
		equal(t, 204, resp.StatusCode)
		conns = append(conns, c)
		return resp
	}
	check(t, !send(big).Close, "a 60 KB head closed its connection with few connections open")
	for len(conns) <= int(crowdedConns) {
		check(t, !send(goodRequest).Close, "a small head closed its connection")
	}
	const n = 100
	time.Sleep(100 * time.Millisecond)
	before := settledHeap()
	for range n {
		check(t, send(big).Close, "no Connection: close after a 60 KB head with %d connections open", len(conns))
	}
	time.Sleep(100 * time.Millisecond) // every server goroutine done with its connection
	per := (settledHeap() - before) / n
	t.Logf("heap per connection after a 60 KB head, listener crowded: %.1f KiB", float64(per)/1024)
	check(t, per < DefaultReadBufferSize+16<<10, "a connection after a 60 KB head pins %d bytes, want at most the read buffer and 16 KiB", per)
}

func TestServerIdleTimeout(t *testing.T) {
	addr := hardened(t, ServerOptions{IdleTimeout: 200 * time.Millisecond})
	c := dial(t, addr)
	_, err := io.WriteString(c, goodRequest)
	noErr(t, err)
	br := bufio.NewReader(c)
	status, _ := readStatus(t, br)
	equal(t, 204, status)
	start := time.Now()
	waitClosed(t, c, 2*time.Second)
	check(t, time.Since(start) < time.Second, "idle connection closed after %v", time.Since(start))
}

func TestServerClientThatNeverReads(t *testing.T) {
	// Small server-side send buffers (accepted sockets inherit the
	// listener's), so the server's writes block after a few hundred
	// answers however slowly a busy machine runs it.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	noErr(t, err)
	addr := hardenedOn(t, ServerOptions{WriteTimeout: 200 * time.Millisecond}, ln)
	// Pipeline far more requests than the socket buffers hold answers for,
	// and never read: the server's writes block, it stops reading, and
	// after its write timeout it closes the connection, which the writer
	// sees as a broken pipe or a reset. Without the timeout the writer
	// would block until its own 10s deadline.
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	noErr(t, err)
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		noErr(t, tc.SetReadBuffer(4096))
	}
	wrote := make(chan error, 1)
	go func() {
		batch := strings.Repeat(goodRequest, 100)
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		for range 3000 { // 24 MB of requests, more than any socket buffers
			if _, err := io.WriteString(c, batch); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	time.Sleep(500 * time.Millisecond)
	status, d := timedGood(t, addr)
	equal(t, 204, status)
	check(t, d < time.Second, "good request took %v", d)
	select {
	case err := <-wrote:
		var ne net.Error
		check(t, err != nil && !(errors.As(err, &ne) && ne.Timeout()),
			"writer ended with %v, want the server to have closed the connection", err)
	case <-time.After(12 * time.Second):
		t.Fatal("writer still blocked after 12s")
	}
}

func TestServerLogsAreSampled(t *testing.T) {
	var out syncBuffer
	addr := hardened(t, ServerOptions{Logger: zerolog.New(&out).Level(zerolog.DebugLevel)})
	for range 300 {
		c := dial(t, addr)
		_, _ = io.WriteString(c, "\x16\x03\x01garbage that is not HTTP\r\n\r\n")
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}
	n := out.lines(`"component":"fasthttp"`)
	check(t, n >= 1 && n <= 10, "%d fasthttp log lines for 300 garbage requests, want a sampled few", n)
	check(t, out.lines("garbage") == 0, "the client's bytes reached the log")
}

// TestServerRefusalAfterIdleIsWritten: a request the server cannot parse
// (a control byte in a header value, which NGINX passes on) is answered 400
// on a keep-alive connection however long that connection sat idle before
// it. fasthttp sets a write deadline before each answer the handler makes,
// but not before the error answer it writes itself: on a connection whose
// last answer was older than the write timeout, the deadline had passed,
// the 400 was never written and the connection was closed (refusal sets
// its own). NGINX read that as "upstream prematurely closed connection", a
// 502, charged the instance a failure (max_fails) and, with every instance
// so, let the request through as rategate unavailable (e2e:
// TestRefusedRequestAfterIdleIsNotLetThrough).
func TestServerRefusalAfterIdleIsWritten(t *testing.T) {
	addr := hardened(t, ServerOptions{WriteTimeout: 200 * time.Millisecond})
	const bad = "GET /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /\r\nX-Real-IP: 192.0.2.1\r\nX-Junk: a\x01b\r\n\r\n"
	for _, idle := range []time.Duration{0, 400 * time.Millisecond} {
		c := dial(t, addr)
		br := bufio.NewReader(c)
		_, err := io.WriteString(c, goodRequest)
		noErr(t, err)
		status, _ := readStatus(t, br)
		equal(t, 204, status)
		time.Sleep(idle) // idle, as a pooled NGINX connection is between requests
		_, err = io.WriteString(c, bad)
		noErr(t, err)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Errorf("a control byte in a header after %v idle (write timeout 200ms): no answer (%v), want 400", idle, err)
			continue
		}
		resp.Body.Close()
		equal(t, 400, resp.StatusCode, "a control byte in a header after %v idle", idle)
	}
}

// panicky is a Decider with a bug that one client can reach: it panics on
// the user "boom" and decides everything else with next. It keeps the
// Decision it panicked with (so its memory is never handed out again as a
// new one) and counts later decisions given that same Decision: a
// scratch whose decision panicked is in an unknown state and must not be
// reused.
type panicky struct {
	next Decider
	mu   sync.Mutex
	// broken is the Decision a panic left behind, reused counts later
	// decisions handed it again.
	broken *limits.Decision
	reused int
}

func (p *panicky) Decide(ctx context.Context, req *limits.Request, d *limits.Decision) error {
	p.mu.Lock()
	if d == p.broken {
		p.reused++
	}
	if string(req.User) == "boom" {
		p.broken = d
		p.mu.Unlock()
		var m map[string]int
		m["x"]++ // a nil map write: the kind of bug a request may meet
	}
	p.mu.Unlock()
	return p.next.Decide(ctx, req, d)
}

// TestServerSurvivesAPanickingDecision: a bug that one request reaches
// (here a panic in the decider) answers that request 500, which
// auth_request makes a 500 for its client, and the process goes on. Left
// to itself, fasthttp does not recover a handler's panic: the process
// died, and every NGINX in front of it decided by $rategate_on_failure
// (open: every request let through) until it was restarted; the client
// could do it again at every restart. The scratch the panic left is
// dropped: later requests never decide with it.
func TestServerSurvivesAPanickingDecision(t *testing.T) {
	l, _ := newLimiter(t, rule("per-ip", 1<<30, time.Minute, limits.KeyIP))
	var logs syncBuffer
	p := &panicky{next: l}
	addr := serveNew(t, New(p, l, Options{Logger: zerolog.New(&logs)}))
	c := dial(t, addr)
	br := bufio.NewReader(c)
	_, err := io.WriteString(c, "GET /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /\r\nX-Real-IP: 192.0.2.1\r\nX-User-Id: boom\r\n\r\n")
	noErr(t, err)
	status, _ := readStatus(t, br)
	equal(t, 500, status, "the request whose decision panicked")
	// Many connections, one at a time: each served by a new goroutine, on
	// either P, so a scratch put back into either P's pool would be met.
	for range 40 {
		c := dial(t, addr)
		_, err := io.WriteString(c, goodRequest)
		noErr(t, err)
		status, _ := readStatus(t, bufio.NewReader(c))
		equal(t, 204, status, "a request after the panic")
		c.Close()
	}
	check(t, logs.lines("assignment to entry in nil map") == 1 && logs.lines("(*panicky).Decide") == 1,
		"the panic and its stack are not logged once: %d, %d lines", logs.lines("assignment to entry in nil map"), logs.lines("(*panicky).Decide"))
	p.mu.Lock()
	defer p.mu.Unlock()
	check(t, p.broken != nil && p.reused == 0, "the scratch whose decision panicked decided %d later requests", p.reused)
}

// TestServerLogsNoHeaderValue: fasthttp quotes an invalid header value in
// its message about the connection, SecureErrorLogMessage or not; the
// value (an API key a rule reads, say) must not reach the log.
func TestServerLogsNoHeaderValue(t *testing.T) {
	var out syncBuffer
	addr := hardened(t, ServerOptions{Logger: zerolog.New(&out).Level(zerolog.DebugLevel)})
	c := dial(t, addr)
	_, err := io.WriteString(c, "GET /auth HTTP/1.1\r\nHost: x\r\nX-Api-Key: SECRETKEY\x01x\r\n\r\n")
	noErr(t, err)
	_, _ = io.Copy(io.Discard, c)
	c.Close()
	check(t, out.lines(`"component":"fasthttp"`) == 1, "want the refused connection logged once: %d lines", out.lines(`"component":"fasthttp"`))
	check(t, out.lines("SECRETKEY") == 0, "the header value reached the log")
}
