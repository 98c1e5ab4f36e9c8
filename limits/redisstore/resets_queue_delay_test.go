package redisstore

import (
	"fmt"
	"testing"
	"time"
)

// TestResetsBurstDoesNotDelayAnnouncements: the publisher sent the queued
// key resets one PUBLISH at a time, each waiting for its reply, so a key
// queued behind n others reached the other instances n round trips late,
// and until then they kept denying an identity Redis admits again. A
// burst of refunds is what a spent global rule makes of a flood on Redis
// Cluster (each request a per-user slot admitted and the global slot
// denied is refunded and announced). Here the publishing instance is one
// millisecond from Redis (a proxy delays each reply by 1 ms, a round trip
// across a network); 1,000 refunds are queued, then alice's: the other
// instance held alice's cached denial 1.4 s. What queued is now sent in
// one round trip (up to 512 keys): about 15 ms.
func TestResetsBurstDoesNotDelayAnnouncements(t *testing.T) {
	other, far, proxy := twoInstances(t, true, "alice")
	runResets(t, far)
	proxy.DelayReplies(time.Millisecond)

	const burst = 1000
	start := time.Now()
	for i := range burst {
		far.Announce(fmt.Sprintf("rg:{u:x%d}:fw2", i))
	}
	far.Announce("rg:{u:alice}:fw2")
	waitLen(t, other, 0, "alice's reset")
	took := time.Since(start)
	t.Logf("alice's reset queued behind %d others (1 ms round trips) reached the other instance after %v; published %d replies through the proxy",
		burst, took.Round(time.Millisecond), proxy.Forwarded())
	if took > 250*time.Millisecond {
		t.Errorf("alice's reset reached the other instance %v after it was queued behind %d others (one PUBLISH round trip each): "+
			"that long it denied her while Redis admitted her; want within 250 ms", took.Round(time.Millisecond), burst)
	}
}
