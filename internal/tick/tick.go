// Package tick runs a background task on a fixed period.
package tick

import (
	"context"
	"time"
)

// Every calls fn every d until ctx ends, the first time d after it is
// called, and never once ctx has ended. A call that takes longer than d
// delays the next one; missed ticks are dropped, not queued (time.Ticker).
func Every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if ctx.Err() != nil {
				return
			}
			fn()
		}
	}
}
