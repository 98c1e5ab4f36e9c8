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
// The timer is not stopped when a decision returns, nor reset when the next
// one starts: every decision of a scratch has the same timeout, so a timer
// still armed for an earlier deadline fires before the new one, finds it
// ahead, and re-arms itself for what is left. A busy scratch so costs one
// timer run per timeout instead of a stop and a reset per request. Only a
// start whose deadline comes before the armed one (a shorter timeout)
// resets the timer. Once a deadline passed with no decision after it, the
// timer closes Done and stays off.
//
// Whoever receives it must not keep it past the call: the next request
// reuses it, and an idle one expires at its last deadline. The store
// honours that (the Redis store's pipelines copy the deadline of a call they
// may still hold after its caller gave up).
type deadlineCtx struct {
	mu       sync.Mutex
	deadline time.Time
	done     chan struct{}
	expired  bool
	// armed: the timer will run at fireAt (or runs now).
	armed  bool
	fireAt time.Time
	timer  *time.Timer
}

var _ context.Context = (*deadlineCtx)(nil)

func newDeadlineCtx() *deadlineCtx {
	c := &deadlineCtx{done: make(chan struct{})}
	c.timer = time.AfterFunc(time.Hour, c.expire)
	c.timer.Stop()
	return c
}

// start arms the context to expire d after now, the request's start.
func (c *deadlineCtx) start(now time.Time, d time.Duration) {
	c.mu.Lock()
	if c.expired {
		c.done = make(chan struct{})
		c.expired = false
	}
	c.deadline = now.Add(d)
	if !c.armed || c.fireAt.After(c.deadline) {
		c.armed, c.fireAt = true, c.deadline
		c.timer.Reset(d)
	}
	c.mu.Unlock()
}

// expire runs on the timer: it closes Done if the deadline has passed, and
// otherwise (a later decision moved the deadline) runs again at it.
func (c *deadlineCtx) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if left := time.Until(c.deadline); left > 0 {
		c.armed, c.fireAt = true, c.deadline
		c.timer.Reset(left)
		return
	}
	c.armed = false
	if !c.expired {
		c.expired = true
		close(c.done)
	}
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
