package redisstore

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
)

// aliceBehindASpentGlobal sets up a denied request whose refund is the
// matter (two cluster refund tests): a global check (limit 3) already spent
// by others and alice's check (limit 2) on another primary, with one of
// her requests admitted; tag keeps the keys apart between runs. decide
// decides checks as one request under timeout.
func aliceBehindASpentGlobal(t *testing.T, ctx context.Context, rs *Store, owner func(int) string, tag string) (glob, alice limits.Check,
	decide func(timeout time.Duration, checks ...limits.Check) (bool, []limits.Result, error)) {
	t.Helper()
	hour := storetest.SteadyPeriod()
	glob = limits.Check{Key: fmt.Sprintf("rg:{glob%s:}:fw", tag), Algorithm: limits.FixedWindow, Limit: 3, PeriodUS: hour, Burst: 3, Cost: 1}
	gAddr := owner(KeySlot(glob.Key))
	// alice's key on a primary other than global's
	for n := 0; n < 1000; n++ {
		k := fmt.Sprintf("rg:{pu:alice%s%d}:fw", tag, n)
		if owner(KeySlot(k)) != gAddr {
			alice = limits.Check{Key: k, Algorithm: limits.FixedWindow, Limit: 2, PeriodUS: hour, Burst: 2, Cost: 1}
			break
		}
	}
	if alice.Key == "" {
		t.Fatal("no key for alice off global's primary")
	}
	decide = func(timeout time.Duration, checks ...limits.Check) (bool, []limits.Result, error) {
		res := make([]limits.Result, len(checks))
		dctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		a, err := rs.Decide(dctx, &limits.Batch{Checks: checks}, res)
		return a, res, err
	}
	// global spent by others; alice has one admitted request (1 of 2)
	for i := 0; i < 3; i++ {
		if a, _, err := decide(time.Second, limits.Check{Key: fmt.Sprintf("rg:{g%s%d}:fw", tag, i), Algorithm: limits.FixedWindow,
			Limit: 9, PeriodUS: hour, Burst: 9, Cost: 1}, glob); err != nil || !a {
			t.Fatalf("filler %d: %v %v", i, a, err)
		}
	}
	if a, _, err := decide(time.Second, alice); err != nil || !a {
		t.Fatalf("alice's first request: %v %v", a, err)
	}
	return glob, alice, decide
}

// respCommand encodes args as one RESP command.
func respCommand(args ...any) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		s := fmt.Sprint(a)
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(s), s)
	}
	return b.String()
}

// TestClusterRefundResentAfterLostReplyRunsOnceInAMigratingSlot: a
// denied request's refund (alice's slot admitted, global denied) is sent
// with its marker; its reply is lost (alice's primary stalls past the
// request's deadline, then runs it: the marker is set and alice's unit is
// given back), so decideSlots hands the same job to refundLater, whose
// send reaches the primary after a resharding step (SETSLOT MIGRATING,
// MIGRATE of alice's key) queued behind the first run. The resend names
// alice's key, now on the target, and the marker, which the first run left
// on the source: a script with one key present and one missing is refused
// TRYAGAIN. runRefund took that TRYAGAIN for "the marker is on neither
// side" and dropped the marker (unmark), and the unmarked refund followed
// ASK to the target and gave alice's unit back a second time: the refund
// of a resend is exactly what the marker is for. Alice (limit 2) then held
// a count of 0 after one admitted request, and was admitted twice more:
// three admissions in a window of 2. A job a send of which may have run is
// never unmarked now: the resend waits out the migration or is lost
// (strict).
func TestClusterRefundResentAfterLostReplyRunsOnceInAMigratingSlot(t *testing.T) {
	c := testredis.StartCluster(t)
	rs := openClusterStore(t, c)
	ctx := testredis.Ctx(t)
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	owner, _ := slotOwners(t, c)
	glob, alice, decide := aliceBehindASpentGlobal(t, ctx, rs, owner, "")
	slot := KeySlot(alice.Key)
	aAddr, gAddr := owner(slot), owner(KeySlot(glob.Key))

	nodes, err := c.Topology()
	if err != nil {
		t.Fatal(err)
	}
	var src, dst testredis.ClusterNode
	for _, n := range nodes {
		switch {
		case !n.Primary || len(n.Slots) == 0:
		case n.Addr == aAddr:
			src = n
		case dst.ID == "":
			dst = n
		}
	}
	if _, err := c.Node(dst.Addr).Do("CLUSTER", "SETSLOT", slot, "IMPORTING", src.ID); err != nil {
		t.Fatal(err)
	}
	// A resharding tool's connection to the source, opened now.
	tool, err := net.Dial("tcp", src.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tool.Close()

	A, G := c.Node(aAddr), c.Node(gAddr)
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = A.Thaw()
		}
	}
	defer thaw()
	// global's primary stalls 100 ms: alice's slot decides (admits) at
	// once, global's answer (denied) comes at 100 ms, when alice's primary
	// is stalled, so the refund is sent into that stall.
	if err := G.Freeze(); err != nil {
		t.Fatal(err)
	}
	type out struct {
		a    bool
		res  []limits.Result
		err  error
		took time.Duration
	}
	done := make(chan out, 1)
	go func() {
		start := time.Now()
		a, res, err := decide(400*time.Millisecond, alice, glob)
		done <- out{a, res, err, time.Since(start)}
	}()
	time.Sleep(50 * time.Millisecond)
	if err := A.Freeze(); err != nil {
		_ = G.Thaw()
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := G.Thaw(); err != nil {
		t.Fatal(err)
	}
	// the resharding step reaches the stalled source after the refund
	time.Sleep(100 * time.Millisecond)
	port := strings.TrimPrefix(dst.Addr, "127.0.0.1:")
	if _, err := tool.Write([]byte(respCommand("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.ID) +
		respCommand("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", alice.Key))); err != nil {
		t.Fatal(err)
	}
	// the request's deadline (400 ms) passes, refundLater resends
	time.Sleep(400 * time.Millisecond)
	thaw()
	o := <-done
	t.Logf("denied request: admitted=%v err=%v results=%+v after %v", o.a, o.err, o.res, o.took.Round(time.Millisecond))
	if o.err != nil || o.a || !o.res[0].Allowed || o.res[1].Allowed {
		t.Fatalf("want alice's slot admitting and global denying: %v %+v %v", o.a, o.res, o.err)
	}
	_ = tool.SetReadDeadline(time.Now().Add(5 * time.Second))
	rd := bufio.NewReader(tool)
	for i := 0; i < 2; i++ {
		line, err := rd.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "+OK") {
			t.Fatalf("resharding step %d: %q %v", i, line, err)
		}
	}
	time.Sleep(backgroundRefundTimeout + 200*time.Millisecond)
	refunds := rs.Refunds()

	// alice: one admitted request of 2; she has one left.
	var admitted int
	var last []limits.Result
	for i := 0; i < 3; i++ {
		a, res, err := decide(time.Second, alice)
		if err != nil {
			t.Fatalf("alice's request %d after: %v", i+2, err)
		}
		if a {
			admitted++
		}
		last = res
	}
	t.Logf("refunds %+v; alice admitted %d of 3 more requests (limit 2, 1 admitted before), last %+v", refunds, admitted, last[0])
	if admitted != 1 {
		t.Errorf("alice (limit 2, one request admitted, one denied) was admitted %d more times in the window, want 1: "+
			"the denied request's refund ran twice: once with its marker (reply lost at the deadline), then, resent by refundLater "+
			"after the key moved to the migration's target, refused TRYAGAIN (key gone, marker present on the source), "+
			"unmarked by runRefund and run again on the target via ASK (refunds %+v)", admitted, refunds)
	}
}
