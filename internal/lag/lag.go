// Package lag measures how short of CPU this process is: how late a
// goroutine that asked to wake up gets to run. Every request goroutine and
// every runner reading a Redis reply waits in the same queue, so when that
// lag nears the decision budget a timed-out decision says nothing about
// the store: the process itself could not run in time.
package lag

import (
	"sync/atomic"
	"time"
)

// The monitor wakes every tick and keeps the worst lag of each window.
const (
	tick   = 10 * time.Millisecond
	window = 250 * time.Millisecond
)

// Monitor keeps the worst wake-up lag of the last 250 to 500 ms. Its one
// goroutine wakes 100 times a second.
type Monitor struct {
	// worst holds, in ns, the worst lag of the current window and of the
	// one before it; cur (owned by run) says which is current.
	worst [2]atomic.Int64
	// wakes counts the monitor's wake-ups (tests).
	wakes atomic.Uint64
	stop  chan struct{}
	done  chan struct{}
}

// Start starts a Monitor; Close stops it.
func Start() *Monitor {
	m := &Monitor{stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	return m
}

func (m *Monitor) run() {
	defer close(m.done)
	t := time.NewTimer(tick)
	defer t.Stop()
	cur := 0
	began := time.Now()
	for {
		due := time.Now().Add(tick)
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.wakes.Add(1)
		now := time.Now()
		if late := int64(now.Sub(due)); late > m.worst[cur].Load() {
			m.worst[cur].Store(late)
		}
		if now.Sub(began) >= window {
			cur ^= 1
			m.worst[cur].Store(0)
			began = now
		}
		t.Reset(tick)
	}
}

// Recent returns the worst lag of the last 250 to 500 ms.
func (m *Monitor) Recent() time.Duration {
	return time.Duration(max(m.worst[0].Load(), m.worst[1].Load()))
}

// Close stops the monitor.
func (m *Monitor) Close() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
}
