package handler

import (
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rs/zerolog"
)

// TestDenialLogBytesBounded (attack probe): the denial log is sampled to at
// most denialBurst lines a second (and as many shadow lines) so that "an
// attack produce[s] a few lines per second, not one per request", and
// verdictFields caps the request id it quotes (maxLoggedRequestID) because
// "a setup that passes the client's own header through must not let it grow
// log lines". Every other identity field of the line is written whole: the
// route, the host, the user and each header dimension, as long as the
// client sent them. Through the shipped configs the client chooses all of
// them: X-Original-URI is $request_uri, X-Original-Host is $host (NGINX
// accepts bytes >= 0x80 in both), and rategate-identity-demo.conf passes
// the client's X-User as the user. NGINX's default large_client_header_buffers
// (4 x 8k) lets each be close to 8 KiB, and the line makes them bigger: a
// raw byte 0xE9 is "%E9" in the route (3 bytes), and an invalid UTF-8 byte
// in the host or user is written by zerolog as "\ufffd" (6 bytes).
//
// One denied request so writes a line of about 120 KB instead of ~400 B:
// at the sampler's 10 denial + 10 shadow lines a second that is about
// 2.4 MB/s, some 200 GB a day per instance, from one client over its
// limit (the flood that the sampling was meant to make harmless).
//
// Expected: a denial line stays small whatever the request carried (each
// identity field capped, as the request id is): here at most 4 KiB.
// Got: a line of ~120 KB (each field's size times 3 or 6).
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
	check(t, len(line) <= maxLine,
		"one denial log line is %d bytes (want <= %d): the route, host and user of the request are written whole "+
			"and grow 3-6x in the line; at 10 denial + 10 shadow lines a second that is %.1f MB/s of log from one client",
		len(line), maxLine, float64(20*len(line))/1e6)
}
