package handler

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestDeadlineCtx: a reused context expires like context.WithTimeout, gets
// a fresh Done channel after it expired, and a timer left over from an
// earlier use never ends a later one early.
func TestDeadlineCtx(t *testing.T) {
	c := newDeadlineCtx()

	c.start(time.Now(), 20*time.Millisecond)
	if err := c.Err(); err != nil {
		t.Fatalf("fresh: Err %v", err)
	}
	dl, ok := c.Deadline()
	if !ok || time.Until(dl) > 20*time.Millisecond || time.Until(dl) < 0 {
		t.Fatalf("deadline %v in %v", ok, time.Until(dl))
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not done 5s after a 20ms deadline")
	}
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("expired: Err %v", c.Err())
	}

	// Reused after expiring: a new channel, open.
	c.start(time.Now(), time.Hour)
	select {
	case <-c.Done():
		t.Fatal("reused context is already done")
	default:
	}
	if c.Err() != nil {
		t.Fatalf("reused: Err %v", c.Err())
	}

	// A short use, then a long one: the first use's timer must not end
	// the second.
	for range 200 {
		c.start(time.Now(), time.Microsecond)
		c.start(time.Now(), time.Hour)
		time.Sleep(10 * time.Microsecond)
		if c.Err() != nil {
			t.Fatal("a stale timer ended a later use")
		}
	}

	// A long use, then a shorter one (a smaller timeout): the timer armed
	// for the first must not hold the second past its own deadline.
	c.start(time.Now(), 20*time.Millisecond)
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a 20ms use after an hour's use: not done after 5s")
	}
	if c.Value("k") != nil {
		t.Fatal("Value")
	}
}

// TestDeadlineCtxBusy: a context restarted faster than its timeout never
// expires while it is in use (its timer, armed for an earlier deadline,
// moves on to the latest), and expires at the last deadline once the
// restarts stop, not before.
func TestDeadlineCtxBusy(t *testing.T) {
	c := newDeadlineCtx()
	const timeout = 20 * time.Millisecond
	var last time.Time
	// checked counts the uses seen alive before their deadline; a use
	// whose sleep overran the whole timeout (a starved machine: seen at
	// 67ms for a 2ms sleep under -race) was due to expire, and proves
	// nothing either way.
	checked := 0
	for end := time.Now().Add(6 * timeout); checked < 30 || time.Now().Before(end); {
		if time.Since(end) > 10*time.Second {
			t.Fatalf("only %d of the uses were checked before their deadline in 10s", checked)
		}
		c.start(time.Now(), timeout)
		last, _ = c.Deadline()
		time.Sleep(timeout / 10)
		err := c.Err()
		if left := time.Until(last); left > 0 {
			if err != nil {
				t.Fatalf("expired %v before its deadline", left)
			}
			checked++
		}
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not done 5s after the last deadline")
	}
	if now := time.Now(); now.Before(last) {
		t.Fatalf("done %v before the last deadline", last.Sub(now))
	}
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err %v", c.Err())
	}
}
