package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdminTokenNeverLoggedOrEchoed: the admin token reaches neither the
// log nor an error body. The main listener had fasthttp's
// SecureErrorLogMessage and the admin listener did not: a request fasthttp
// cannot parse (a bad Content-Length, a header line without a colon) was
// logged with its raw bytes, the Authorization header and its bearer token
// included, and the same bytes were sent back in the 400's JSON body.
func TestAdminTokenNeverLoggedOrEchoed(t *testing.T) {
	t.Parallel()
	const token = "tok-0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rategate.yaml")
	writeFile(t, cfg, "admin:\n  token: "+token+"\nrules:\n  - name: r\n    key: [ip]\n    algorithm: gcra\n    limit: 5\n    period: 1m\n")
	p := startRategate(t, "token-log", cfg, token) // -log-level debug

	for _, req := range []string{
		"GET /v1/rules HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + "\r\nContent-Length: abc\r\n\r\n",
		"GET /v1/rules HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + "\r\nBroken\r\n\r\n",
		// fasthttp quotes an invalid header value in its error whatever
		// SecureErrorLogMessage says
		"GET /v1/rules HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + "\x01\r\n\r\n",
	} {
		conn, err := net.DialTimeout("tcp", p.admin, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		conn.Close()
		if strings.Contains(string(body), token) {
			t.Errorf("%d answer to a malformed admin request echoes the bearer token: %s", resp.StatusCode, body)
		}
	}
	time.Sleep(300 * time.Millisecond)
	log, err := os.ReadFile(p.rg.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, token) {
			t.Errorf("the admin token is in the log: %.400s", line)
		}
	}
}
