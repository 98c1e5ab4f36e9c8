package handler

import (
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rs/zerolog"
)

// TestDenialLogBytesBounded: the denial log is sampled to a few lines a
// second so that an attack cannot flood it, and each line must stay small
// whatever the request carried. Through the shipped configs the client
// chooses the route (X-Original-URI is $request_uri), the host ($host:
// NGINX takes bytes >= 0x80 in both) and, with the demo identity, the
// user, each up to NGINX's 8 KiB header buffers, and the line makes them
// bigger (a raw byte is "%E9" in the route, "\ufffd" in the host or user).
// Written whole, one denial made a line of about 120 KB: at 10 denial and
// 10 shadow lines a second, 2.4 MB/s of log from one client over its
// limit. Each value is now cut to maxLoggedValue, and the line says so.
func TestDenialLogBytesBounded(t *testing.T) {
	var logs syncBuffer
	ts := pinned(t, Options{Logger: zerolog.New(&logs)},
		rule("per-user", 1, time.Minute, limits.KeyUser))

	const n = 7900 // fits one of NGINX's default 8 KiB header buffers
	big := strings.Repeat("\xe9", n)
	req := func() string {
		return "GET /auth HTTP/1.1\r\nHost: x\r\n" +
			"X-Original-URI: /" + big + "\r\n" +
			"X-Real-IP: 192.0.2.1\r\n" +
			"X-Original-Method: GET\r\n" +
			"X-Original-Host: " + big + "\r\n" +
			"X-User-Id: u" + big + "\r\n" +
			"X-Request-Id: 0af7651916cd43dd8448eb211c80319c\r\n" +
			"Connection: close\r\n\r\n"
	}
	status, body := ts.raw(t, req())
	equal(t, 204, status, "first request: %q", body)
	status, body = ts.raw(t, req())
	equal(t, 429, status, "second request: %q", body)

	var line string
	logs.mu.Lock()
	for _, l := range strings.Split(logs.b.String(), "\n") {
		if strings.Contains(l, `"message":"request limited"`) {
			line = l
		}
	}
	logs.mu.Unlock()
	check(t, line != "", "no denial line logged")
	const maxLine = 4 << 10
	t.Logf("request head about %d bytes, denial log line %d bytes", 3*n, len(line))
	check(t, strings.Contains(line, `"clipped":true`), "the line does not say it was clipped: %.300s", line)
	check(t, len(line) <= maxLine,
		"one denial log line is %d bytes (want <= %d): the route, host and user of the request are written whole "+
			"and grow 3-6x in the line; at 10 denial + 10 shadow lines a second that is %.1f MB/s of log from one client",
		len(line), maxLine, float64(20*len(line))/1e6)
}
