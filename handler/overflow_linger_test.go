package handler

import (
	"bufio"
	"io"
	"testing"
	"time"
)

// TestServerOverCapDoesNotStallAccept: past MaxConns a new connection is
// answered 503 and closed by fasthttp's accept loop itself. The lingering
// close (read what the client still sends, up to lingerTime) ran there, on
// the accept goroutine: each connection over the cap whose client neither
// sent nor closed held every later accept for a second, so a client that
// filled the cap and kept opening idle connections made every other client
// wait seconds (in the kernel's backlog) for its 503, or for the slot a
// closing connection freed, instead of getting it at once. Measured on
// the admin listener (256 connections): 8 idle connections over the cap
// delayed the next client's 503 by 7.9 s.
func TestServerOverCapDoesNotStallAccept(t *testing.T) {
	addr := hardened(t, ServerOptions{MaxConns: 1})
	holder := dial(t, addr)
	_, err := io.WriteString(holder, goodRequest)
	noErr(t, err)
	status, _ := readStatus(t, bufio.NewReader(holder))
	equal(t, 204, status)

	// Three idle connections over the cap: they send nothing and never
	// close while the test runs.
	for range 3 {
		dial(t, addr)
	}
	time.Sleep(20 * time.Millisecond)

	start := time.Now()
	c := dial(t, addr)
	_, _ = io.WriteString(c, goodRequest)
	status, _ = readStatus(t, bufio.NewReader(c))
	took := time.Since(start)
	equal(t, 503, status)
	check(t, took < lingerTime/2, "the 503 over the cap took %v: the accept loop lingered on the idle connections before it", took)
}
