package handler

import (
	"io"
	"net"
	"sync/atomic"
	"time"
)

// Lingering close: when the server ends a connection while the client is
// still sending (a request head over the limit answered 431, a body it
// never reads), closing at once makes the kernel answer the unread bytes
// with a reset, and a client that checks its write before reading sees
// "connection reset" instead of the answer. So the main listener's
// connections close the way NGINX's lingering_close does: send FIN after
// the answer, read and discard what the client still sends for a bounded
// time, then close.

// Bounds of a lingering close.
const (
	lingerTime = time.Second
	lingerMax  = 64 << 20
)

// LingerListener wraps ln so that every connection it accepts closes with
// a lingering close (bounded: at most a second and 64 MiB read).
func LingerListener(ln net.Listener) net.Listener { return lingerListener{ln} }

type lingerListener struct{ net.Listener }

func (l lingerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return &lingerConn{TCPConn: tc}, nil
	}
	return c, nil
}

type lingerConn struct {
	*net.TCPConn
	// writeFailed is set when a write failed (a client that does not read
	// ran the write timeout out): such a connection closes at once,
	// reading for it would only help it along.
	writeFailed atomic.Bool
	// peerDone is set when a read found the client's end of the stream
	// (NGINX closing an idle upstream connection): nothing more will come
	// to drain, so the connection closes at once, without the half-close
	// and the read.
	peerDone atomic.Bool
}

// Read records the client's end of the stream.
func (c *lingerConn) Read(b []byte) (int, error) {
	n, err := c.TCPConn.Read(b)
	if err == io.EOF {
		c.peerDone.Store(true)
	}
	return n, err
}

// Write records a failed write.
func (c *lingerConn) Write(b []byte) (int, error) {
	n, err := c.TCPConn.Write(b)
	if err != nil {
		c.writeFailed.Store(true)
	}
	return n, err
}

// lingers reports whether Close half-closes and drains first: not once
// the client has ended the stream or stopped reading.
func (c *lingerConn) lingers() bool {
	return !c.writeFailed.Load() && !c.peerDone.Load()
}

// Close half-closes, drains what the client still sends, then closes (see
// lingers).
func (c *lingerConn) Close() error {
	if !c.lingers() {
		return c.TCPConn.Close()
	}
	if err := c.CloseWrite(); err != nil {
		return c.TCPConn.Close()
	}
	_ = c.SetReadDeadline(time.Now().Add(lingerTime))
	_, _ = io.CopyN(io.Discard, c.TCPConn, lingerMax)
	return c.TCPConn.Close()
}
