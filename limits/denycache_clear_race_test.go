package limits

import (
	"sync"
	"testing"
	"time"
)

// TestDenyCacheConcurrentClearsKeepTheLatest: Clear does
// cleared.Store(gen.Add(1)), and two Clears at once (a "*" from the reset
// channel while a reload or an adaptive factor installs rules, a
// resubscription, the epoch watcher) can store their generations in the
// other order, leaving cleared at the older one. A decision that read the
// generation between the two bumps, so before the second Clear, is then
// let in after both: its denial, computed under what the second Clear
// undid (the old rules, a refund everyone was told to forget), stays
// cached until its retry. (Forget takes the max of its shard's
// generation; Clear does not.) The interleaving is rare, so the test
// tries Clear pairs for up to 2 s (on a 2-core machine it appeared a few
// times a second).
func TestDenyCacheConcurrentClearsKeepTheLatest(t *testing.T) {
	c := NewDenyCache(1000)
	r := &Rule{Name: "u", Algorithm: FixedWindow, Limit: 1, Period: time.Hour, Burst: 1, Cost: 1}
	deadline := time.Now().Add(2 * time.Second)
	tries := 0
	for time.Now().Before(deadline) {
		tries++
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		for range 2 {
			go func() { defer wg.Done(); <-start; c.Clear() }()
		}
		close(start)
		wg.Wait()
		cleared, gen := c.cleared.Load(), c.gen.Load()
		if cleared == gen {
			continue
		}
		// A decision read gen == cleared: after the first Clear's bump,
		// before the second's. It must not insert after the second.
		c.put(cleared, &Verdict{Rule: r, Key: "rg:{u:alice}:fw2", Cost: 1, Result: Result{RetryUS: 3_600_000_000}}, nil, 1, 1, true)
		if c.Len() != 0 {
			t.Fatalf("after %d pairs of concurrent Clears: cleared is %d, the generation %d (the first Clear's store landed last), "+
				"and a decision that read generation %d, before the second Clear, cached its denial after both (Len %d): "+
				"it outlives the Clear until its retry (1 h here)", tries, cleared, gen, cleared, c.Len())
		}
		c.Clear()
	}
	t.Logf("no reordered Clear pair in %d tries", tries)
}
