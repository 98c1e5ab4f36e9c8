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
// After restAfter without a request (Busy) it wakes every rest instead,
// until the next request: an idle process has no decision whose timeout
// the lag could explain, and 100 wake-ups a second were most of an idle
// rategate's CPU.
const (
	tick      = 10 * time.Millisecond
	window    = 250 * time.Millisecond
	restAfter = 2 * time.Second
	rest      = time.Second
)

// Monitor keeps the worst wake-up lag of the last 250 to 500 ms (while
// resting, of its last two wake-ups). Its one goroutine wakes 100 times a
// second while requests come.
type Monitor struct {
	// worst holds, in ns, the worst lag of the current window and of the
	// one before it; cur (owned by run) says which is current.
	worst [2]atomic.Int64
	// seen is set by Busy and cleared by each wake-up: whether a request
	// came since the last one.
	seen atomic.Bool
	// kick wakes a resting monitor: Busy sends on it when it sets seen.
	// While ticking the monitor does not listen, and a kick left from then
	// is dropped when it goes to rest.
	kick chan struct{}
	// wakes counts the monitor's wake-ups (tests).
	wakes atomic.Uint64
	stop  chan struct{}
	done  chan struct{}
}

// Start starts a Monitor; Close stops it.
func Start() *Monitor {
	m := &Monitor{kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	return m
}

// Busy tells the monitor a decision was asked for: call it for each one.
// It costs an atomic load, and once per tick a store and a send that
// never blocks.
func (m *Monitor) Busy() {
	if m.seen.Load() {
		return
	}
	m.seen.Store(true)
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func (m *Monitor) run() {
	defer close(m.done)
	t := time.NewTimer(tick)
	defer t.Stop()
	cur, quiet := 0, time.Duration(0)
	began := time.Now()
	every := tick
	for {
		due := time.Now().Add(every)
		var kick chan struct{} // nil while ticking
		if every == rest {
			kick = m.kick
		}
		kicked := false
		select {
		case <-m.stop:
			return
		case <-t.C:
		case <-kick:
			kicked = true
			t.Stop()
		}
		m.wakes.Add(1)
		now := time.Now()
		// a kicked wake-up is early: it measures nothing
		if late := int64(now.Sub(due)); !kicked && late > m.worst[cur].Load() {
			m.worst[cur].Store(late)
		}
		if now.Sub(began) >= window {
			cur ^= 1
			m.worst[cur].Store(0)
			began = now
		}
		if m.seen.Swap(false) || kicked {
			quiet = 0
		} else if every == tick {
			quiet += tick
		}
		next := tick
		if quiet >= restAfter {
			next = rest
			if every == tick {
				// Going to rest: drop a kick sent while ticking, then look
				// at seen once more (a request between the Swap above and
				// the drain kicked into it).
				select {
				case <-m.kick:
				default:
				}
				if m.seen.Load() {
					next, quiet = tick, 0
				}
			}
		}
		every = next
		t.Reset(every)
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
