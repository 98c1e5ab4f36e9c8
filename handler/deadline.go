package handler

import (
	"context"
	"sync"
	"time"
)

// deadlineCtx is the context of one decision: context.WithTimeout without
// its four allocations per request. Each pooled scratch owns one and
// restarts it for every request; its timer and channel are reused, and a
// new channel is made only after a deadline actually passed (the old one is
// closed for good).
//
// Whoever receives it must not keep it past the call: the next request
// reuses it. The store honours that (the Redis store's pipelines copy the
// deadline of a call they may still hold after its caller gave up).
type deadlineCtx struct {
	mu       sync.Mutex
	deadline time.Time
	done     chan struct{}
	expired  bool
	timer    *time.Timer
}

var _ context.Context = (*deadlineCtx)(nil)

func newDeadlineCtx() *deadlineCtx {
	c := &deadlineCtx{done: make(chan struct{})}
	c.timer = time.AfterFunc(time.Hour, c.expire)
	c.timer.Stop()
	return c
}

// start arms the context to expire d from now.
func (c *deadlineCtx) start(d time.Duration) {
	c.mu.Lock()
	if c.expired {
		c.done = make(chan struct{})
		c.expired = false
	}
	c.deadline = time.Now().Add(d)
	c.mu.Unlock()
	c.timer.Reset(d)
}

// stop disarms it once the call returned.
func (c *deadlineCtx) stop() { c.timer.Stop() }

// expire runs on the timer. A run left over from an earlier request (a
// timer func may still run after Stop or Reset) finds the deadline in the
// future and does nothing.
func (c *deadlineCtx) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expired || time.Now().Before(c.deadline) {
		return
	}
	c.expired = true
	close(c.done)
}

func (c *deadlineCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, true
}

func (c *deadlineCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

func (c *deadlineCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expired {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *deadlineCtx) Value(any) any { return nil }
