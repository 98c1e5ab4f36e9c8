package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

// heldConn delays the first write its hold says to hold, as a network
// that loses a segment and retransmits it seconds later: the bytes reach
// Redis late, after the client gave up on the connection and closed it
// (the close waits for them, as TCP sends what was written before its FIN).
type heldConn struct {
	net.Conn
	hold func(b []byte) time.Duration

	mu      sync.Mutex
	pending int
	closing bool
}

func (c *heldConn) Write(b []byte) (int, error) {
	if d := c.hold(b); d > 0 {
		buf := bytes.Clone(b)
		c.mu.Lock()
		c.pending++
		c.mu.Unlock()
		go func() {
			time.Sleep(d)
			// the kernel's retransmission knows no write deadline
			_ = c.Conn.SetWriteDeadline(time.Time{})
			_, _ = c.Conn.Write(buf)
			c.mu.Lock()
			c.pending--
			closeNow := c.pending == 0 && c.closing
			c.mu.Unlock()
			if closeNow {
				// let Redis read it before the FIN
				time.Sleep(50 * time.Millisecond)
				c.Conn.Close()
			}
		}()
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *heldConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending > 0 {
		c.closing = true
		return nil
	}
	return c.Conn.Close()
}

// TestClusterRefundDelayedInTheNetworkRunsOnce: a denied request's refund
// (alice's slot admitted, global denied) is sent with its marker, and the
// network holds that send for 4 s (a segment lost and retransmitted, on
// one connection). The request's deadline passes, so refundLater resends
// the same job on another connection: it runs at once, sets the marker
// (for about 2 s) and gives alice's unit back. The first send then reaches
// Redis after the marker has expired, finds none, and gives alice's unit
// back a second time: alice (limit 2, one request admitted) is admitted
// twice more in the window, three admissions in a window of 2. A refund
// runs at most once only if no send of it can run after its marker ends.
func TestClusterRefundDelayedInTheNetworkRunsOnce(t *testing.T) {
	c := sharedCluster.Get(t)
	ctx := testredis.Ctx(t)
	var refundSHA []byte
	var held atomic.Int32
	const delay = 4 * time.Second
	rs, err := Open(Options{ClusterAddrs: c.Addrs(), Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &heldConn{Conn: conn, hold: func(b []byte) time.Duration {
			if refundSHA != nil && bytes.Contains(b, refundSHA) && held.CompareAndSwap(0, 1) {
				return delay
			}
			return 0
		}}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	refundSHA = []byte(rs.refund.Hash())
	owner, _ := slotOwners(t, c)
	glob, alice, decide := aliceBehindASpentGlobal(t, ctx, rs, owner, fmt.Sprintf("%d-", time.Now().UnixNano()))
	// alice's slot first (limit 2 < 3): admits; global denies; the refund's
	// first send is held by the network past the deadline
	a, res, err := decide(200*time.Millisecond, alice, glob)
	if err != nil || a || !res[0].Allowed || res[1].Allowed {
		t.Fatalf("want alice's slot admitting and global denying: %v %+v %v", a, res, err)
	}
	if held.Load() != 1 {
		t.Fatal("the refund was not held")
	}
	time.Sleep(delay + 500*time.Millisecond)
	refunds := rs.Refunds()
	var admitted int
	for i := 0; i < 3; i++ {
		a, _, err := decide(time.Second, alice)
		if err != nil {
			t.Fatalf("alice's request %d after: %v", i+2, err)
		}
		if a {
			admitted++
		}
	}
	t.Logf("refunds %+v; alice admitted %d of 3 more requests (limit 2, 1 admitted before)", refunds, admitted)
	if admitted != 1 {
		t.Errorf("%d admitted for a limit of 2 (1 before, %d of 3 after), want 2: the denied request's refund, "+
			"held 4 s by the network, ran after its resend's marker had expired and gave alice's unit back a second time (refunds %+v)",
			1+admitted, admitted, refunds)
	}
}
