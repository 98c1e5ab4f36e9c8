package tick

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestEveryCallsUntilTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	done := make(chan struct{})
	start := time.Now()
	var first time.Duration
	go func() {
		defer close(done)
		Every(ctx, 10*time.Millisecond, func() {
			if calls.Add(1) == 1 {
				first = time.Since(start)
			}
			if calls.Load() == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Every did not return after its context ended")
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d calls, want 3 (the third cancels)", n)
	}
	if first < 10*time.Millisecond {
		t.Fatalf("the first call came after %v, want a full period", first)
	}
}

func TestEveryReturnsAtOnceOnAnEndedContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Every(ctx, time.Hour, func() { t.Error("called after the context ended") })
}

// TestEveryNeverCallsAfterTheContextEnds: when a call outlasts the period,
// the next tick is ready by the time the context ends, and select picks
// between the two at random; a call that ended the context must be the
// last. (Without the check after the tick, half of these runs call fn
// once more.)
func TestEveryNeverCallsAfterTheContextEnds(t *testing.T) {
	for range 40 {
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		Every(ctx, time.Microsecond, func() {
			calls++
			time.Sleep(200 * time.Microsecond) // the next tick is due
			cancel()
		})
		if calls != 1 {
			t.Fatalf("%d calls, want 1: called again after the context ended", calls)
		}
	}
}
