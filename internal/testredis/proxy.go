package testredis

import (
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a fault-injecting TCP proxy in front of a Redis server, on a free
// loopback port. It forwards both ways; with DropReplies it cuts a
// connection instead of forwarding what Redis answered, so the commands
// Redis already ran lose their replies (the client sees EOF), which is how
// a connection dies after a command ran. It stops with the test.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	dropPerMille atomic.Int64
	delay        atomic.Int64 // ns each read from Redis is held before it is passed on
	reqDelay     atomic.Int64 // ns each read from the client is held before it is passed on
	dropped      atomic.Int64
	forwarded    atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// StartProxy starts a proxy to target (host:port) and registers its end with
// t.Cleanup.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Port is the proxy's port.
func (p *Proxy) Port() int {
	_, port, _ := net.SplitHostPort(p.Addr)
	n, _ := strconv.Atoi(port)
	return n
}

// DropReplies makes the proxy cut the connection instead of forwarding a
// read from Redis with the given probability (0 turns it off).
func (p *Proxy) DropReplies(probability float64) {
	p.dropPerMille.Store(int64(probability * 1000))
}

// DelayReplies makes the proxy hold each read from Redis for d before
// passing it on (0 turns it off): the commands run at once, their replies
// come late.
func (p *Proxy) DelayReplies(d time.Duration) {
	p.delay.Store(int64(d))
}

// DelayRequests makes the proxy hold each read from the client for d
// before passing it on to Redis (0 turns it off): commands run late, in
// Redis's time, and their replies come straight back.
func (p *Proxy) DelayRequests(d time.Duration) {
	p.reqDelay.Store(int64(d))
}

// Dropped returns how many reads from Redis were dropped (and their
// connections cut); Forwarded how many were passed on.
func (p *Proxy) Dropped() int64   { return p.dropped.Load() }
func (p *Proxy) Forwarded() int64 { return p.forwarded.Load() }

// Close stops accepting and cuts every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.track(client, true)
		p.track(server, true)
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			defer server.Close()
			defer client.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					if d := p.reqDelay.Load(); d > 0 {
						time.Sleep(time.Duration(d))
					}
					if _, werr := server.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() {
			defer p.wg.Done()
			defer p.track(client, false)
			defer p.track(server, false)
			buf := make([]byte, 32<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 {
					if pm := p.dropPerMille.Load(); pm > 0 && rand.Int64N(1000) < pm {
						p.dropped.Add(1)
						client.Close()
						server.Close()
						return
					}
					if d := p.delay.Load(); d > 0 {
						time.Sleep(time.Duration(d))
					}
					p.forwarded.Add(1)
					if _, werr := client.Write(buf[:n]); werr != nil {
						server.Close()
						return
					}
				}
				if err != nil {
					client.Close()
					return
				}
			}
		}()
	}
}
