package lag

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestRecentFollowsCPU: on an idle process the lag is small; with more
// busy goroutines than CPUs for a while it grows past the scheduler's time
// slice, and once they stop it falls back within two windows.
func TestRecentFollowsCPU(t *testing.T) {
	m := Start()
	defer m.Close()
	defer requests(m)()
	time.Sleep(3 * window)
	idle := m.Recent()

	var stop sync.WaitGroup
	quit := make(chan struct{})
	for range 8 * runtime.GOMAXPROCS(0) {
		stop.Add(1)
		go func() {
			defer stop.Done()
			for {
				select {
				case <-quit:
					return
				default:
				}
				for i := 0; i < 1e6; i++ { // a busy stretch between checks
					_ = i * i
				}
			}
		}()
	}
	time.Sleep(4 * window)
	busy := m.Recent()
	close(quit)
	stop.Wait()
	time.Sleep(3 * window)
	after := m.Recent()

	t.Logf("lag idle %v, busy %v, after %v", idle, busy, after)
	if busy < 10*time.Millisecond || busy < 4*idle {
		t.Errorf("lag with %d busy goroutines %v (idle %v), want at least 10ms and 4x idle", 8*runtime.GOMAXPROCS(0), busy, idle)
	}
	if after >= busy/2 {
		t.Errorf("lag %v after the busy goroutines stopped, want well below the %v while they ran", after, busy)
	}
}

// TestRestsWhileIdle: a process nobody asks anything wakes the monitor
// about once a second, not a hundred times (the 100 Hz ticks were most of
// an idle rategate's CPU: 1.35% of a core against 0.3% without them). The
// first request after the rest brings the ticks back at once, and they
// stay while requests come; the lag measured then is that of its ticks,
// not of the rest.
func TestRestsWhileIdle(t *testing.T) {
	m := Start()
	defer m.Close()
	time.Sleep(restAfter + 100*time.Millisecond)
	before := m.wakes.Load()
	time.Sleep(2 * time.Second)
	if n := m.wakes.Load() - before; n > 4 {
		t.Fatalf("%d wake-ups in 2s of an idle process, want at most 4", n)
	}

	before = m.wakes.Load()
	m.Busy()
	deadline := time.Now().Add(time.Second)
	for m.wakes.Load() == before {
		if time.Now().After(deadline) {
			t.Fatal("a request did not wake the resting monitor within 1s")
		}
		time.Sleep(time.Millisecond)
	}
	if woke := time.Until(deadline); woke < 900*time.Millisecond {
		t.Errorf("the monitor woke %v after the request, want within 100ms", time.Second-woke)
	}
	stop := requests(m)
	start := m.wakes.Load()
	time.Sleep(500 * time.Millisecond)
	n := m.wakes.Load() - start
	stop()
	if n < 25 {
		t.Errorf("%d wake-ups in 500ms of requests, want about 50", n)
	}
	if lag := m.Recent(); lag > 100*time.Millisecond {
		t.Errorf("lag %v on an idle machine after a rest, want the ticks' own", lag)
	}
}

// requests calls m.Busy every few milliseconds, as requests would, until
// the returned func is called.
func requests(m *Monitor) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(3 * time.Millisecond):
				m.Busy()
			}
		}
	}()
	return func() { close(quit); <-done }
}
