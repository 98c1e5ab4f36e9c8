package handler

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
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
// a lingering close (bounded: at most a second and 64 MiB read), and so
// that running out of file descriptors or kernel memory does not stop the
// server: such an accept is tried again after a pause (5 ms, doubling up
// to a second while it keeps failing), as net/http does, and onErr (nil:
// none) hears of each failure. fasthttp takes any accept error but a
// timeout for the end of the listener, and rategate would stop: a client
// that could open enough connections would stop every limit.
//
// It also counts the connections it accepted that are still open, which
// Serve reads (crowded).
func LingerListener(ln net.Listener, onErr func(error)) net.Listener {
	return lingerListener{ln, onErr, new(atomic.Int64)}
}

type lingerListener struct {
	net.Listener
	onErr func(error)
	open  *atomic.Int64 // connections accepted and not yet closed
}

// maxAcceptPause bounds the pause between failed accepts.
const maxAcceptPause = time.Second

func (l lingerListener) Accept() (net.Conn, error) {
	var pause time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !exhausted(err) {
				return nil, err
			}
			if l.onErr != nil {
				l.onErr(err)
			}
			pause = min(max(2*pause, 5*time.Millisecond), maxAcceptPause)
			time.Sleep(pause)
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok {
			l.open.Add(1)
			return &lingerConn{TCPConn: tc, open: l.open}, nil
		}
		return c, nil
	}
}

// exhausted reports whether an accept failed for want of a resource that
// comes back when connections close: file descriptors (the process's or
// the system's) or kernel memory.
func exhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
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
	// open is its listener's count of open connections; closed makes
	// Close take this one off it once.
	open   *atomic.Int64
	closed atomic.Bool
	// read is set by the first Read. A connection closed before any read
	// is one the accept loop refused (fasthttp's 503 past Concurrency):
	// its lingering close must not run on the accept goroutine.
	read atomic.Bool
}

// maxBackgroundLingers bounds the refused connections lingering at once
// off the accept loop; past it one closes at once (its client may see a
// reset instead of the 503).
const maxBackgroundLingers = 256

// backgroundLingers holds a token per refused connection lingering.
var backgroundLingers = make(chan struct{}, maxBackgroundLingers)

// crowdedConns is the number of open connections from which Serve closes
// a connection after a request head over bigHead (a variable for tests).
var crowdedConns int64 = 512

// crowded reports whether c's listener holds more than crowdedConns open
// connections (true for a connection of another listener: unknown).
func crowded(c net.Conn) bool {
	lc, ok := c.(*lingerConn)
	return !ok || lc.open.Load() > crowdedConns
}

// Read records the client's end of the stream.
func (c *lingerConn) Read(b []byte) (int, error) {
	if !c.read.Load() { // a plain load per read after the first, not a store
		c.read.Store(true)
	}
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
// lingers). A connection never read from is one fasthttp's accept loop
// refused: it lingers on a goroutine of its own (at most
// maxBackgroundLingers at once), so that a client holding such
// connections open cannot hold every later accept for lingerTime each.
func (c *lingerConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	if !c.lingers() {
		return c.TCPConn.Close()
	}
	if !c.read.Load() {
		select {
		case backgroundLingers <- struct{}{}:
			go func() {
				defer func() { <-backgroundLingers }()
				_ = c.linger()
			}()
			return nil
		default:
			return c.TCPConn.Close()
		}
	}
	return c.linger()
}

// linger is the lingering close itself.
func (c *lingerConn) linger() error {
	if err := c.CloseWrite(); err != nil {
		return c.TCPConn.Close()
	}
	_ = c.SetReadDeadline(time.Now().Add(lingerTime))
	_, _ = io.CopyN(io.Discard, c.TCPConn, lingerMax)
	return c.TCPConn.Close()
}
