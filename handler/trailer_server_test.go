package handler

import (
	"bufio"
	"io"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestTrailerNeverNamesTheClientOnNewServer: through the server rategate
// runs (NewServer, which streams request bodies), a chunked body's trailer
// is not read before the answer, so a header there never names the
// client: the request is decided from its head, and the user its trailer
// names keeps an untouched quota. (The answer is 204 here; the handler's
// 400 for trailer fields, TestTrailerIsRefused, fires only where a server
// reads the body before the handler, as a plain fasthttp.Server does. An
// earlier version of docs/decision-endpoint.md promised that 400 on this
// server too.)
func TestTrailerNeverNamesTheClientOnNewServer(t *testing.T) {
	l, _ := newLimiter(t, rule("per-user", 1, time.Hour, limits.KeyUser))
	addr := serveNew(t, New(l, l, Options{}))
	send := func(req string) int {
		t.Helper()
		c := dial(t, addr)
		_, err := io.WriteString(c, req)
		noErr(t, err)
		status, _ := readStatus(t, bufio.NewReader(c))
		c.Close()
		return status
	}
	head := "POST /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /x\r\nX-Real-IP: 192.0.2.1\r\n" +
		"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
	for i, body := range []string{
		"1\r\na\r\n0\r\nX-User-Id: u2\r\n\r\n", // a body, then a trailer
		"0\r\nX-User-Id: u2\r\n\r\n",           // an empty body, then a trailer
	} {
		status := send(head + body)
		if i == 0 {
			equal(t, 204, status, "the first anonymous request from 192.0.2.1 (chunked body %q)", body)
		} else {
			check(t, status == 429 || status == 400, "the second anonymous request from 192.0.2.1: %d, want its own 429 (or 400)", status)
		}
	}
	user := "GET /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /x\r\nX-Real-IP: 192.0.2.1\r\nX-User-Id: u2\r\nConnection: close\r\n\r\n"
	equal(t, 204, send(user), "u2's first request: the trailers that named u2 must not have counted")
	equal(t, 429, send(user), "u2's second request (limit 1)")
}
