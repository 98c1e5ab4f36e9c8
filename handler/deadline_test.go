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

	c.start(20 * time.Millisecond)
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
	c.stop()

	// Reused after expiring: a new channel, open.
	c.start(time.Hour)
	select {
	case <-c.Done():
		t.Fatal("reused context is already done")
	default:
	}
	if c.Err() != nil {
		t.Fatalf("reused: Err %v", c.Err())
	}
	c.stop()

	// A short use, stopped in time, then a long one: the first use's timer
	// must not end the second.
	for range 200 {
		c.start(time.Microsecond)
		c.stop()
		c.start(time.Hour)
		time.Sleep(10 * time.Microsecond)
		if c.Err() != nil {
			t.Fatal("a stale timer ended a later use")
		}
		c.stop()
	}
	if c.Value("k") != nil {
		t.Fatal("Value")
	}
}
