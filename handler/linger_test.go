package handler

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestLingerSkippedAfterClientEnds: a connection whose client has ended
// its stream (NGINX closing an idle upstream connection) closes at once,
// without the half-close and drain; one whose client may still send keeps
// the lingering close.
func TestLingerSkippedAfterClientEnds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lln := LingerListener(ln, nil)
	for _, ends := range []bool{true, false} {
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		server, err := lln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		lc := server.(*lingerConn)
		if _, err := io.WriteString(client, "ping"); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(lc, buf); err != nil {
			t.Fatal(err)
		}
		if ends {
			_ = client.(*net.TCPConn).CloseWrite()
			if n, err := lc.Read(buf); n != 0 || err != io.EOF {
				t.Fatalf("read after the client's end: %d, %v", n, err)
			}
		}
		if lc.lingers() == ends {
			t.Errorf("client ended %v: lingers %v", ends, lc.lingers())
		}
		start := time.Now()
		closed := make(chan error, 1)
		go func() { closed <- lc.Close() }()
		if !ends {
			// the lingering close reads what the client still sends, then
			// closes when the client ends
			time.Sleep(50 * time.Millisecond)
			if _, err := io.WriteString(client, "more"); err != nil {
				t.Fatal(err)
			}
			_ = client.(*net.TCPConn).CloseWrite()
		}
		if err := <-closed; err != nil {
			t.Errorf("client ended %v: Close: %v", ends, err)
		}
		if took := time.Since(start); ends && took > lingerTime/2 || !ends && took < 50*time.Millisecond {
			t.Errorf("client ended %v: Close took %v", ends, took)
		}
		client.Close()
	}
}
