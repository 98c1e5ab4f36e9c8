package redisstore

import (
	"context"
	"testing"
	"time"
)

// TestResetsShutdownKeepsQueuedAnnouncements: Resets promises that a refund
// announcement is queued and never lost (one that cannot be sent becomes a
// clear of every instance's cache). But when Run's context ended (App.Close,
// every rolling deploy) the publisher returned at once: the batch it was
// publishing was abandoned (its PUBLISH failed with the cancelled context,
// and a failure under a cancelled context was not escalated) and whatever
// was still queued was dropped (now flush sends both before it returns).
// The refunds behind those announcements were done in Redis, so every
// other instance kept denying the identity from its cache until the cached
// retry time (a whole window for a fixed window), while Redis admitted it. Here the shutting-down instance is 20 ms
// from Redis (replies delayed); a refund's announcement is being
// published and alice's and bob's are queued behind it when the instance
// stops: the other instance still denies both 2 s later.
func TestResetsShutdownKeepsQueuedAnnouncements(t *testing.T) {
	other, far, proxy := twoInstances(t, true, "alice", "bob")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); far.Run(ctx) }()
	select {
	case <-far.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("no subscription within 10 s")
	}
	proxy.DelayReplies(20 * time.Millisecond)

	// The publisher takes the first refund and waits for its reply;
	// alice's and bob's queue behind it.
	far.Announce("rg:{u:carol}:fw2")
	time.Sleep(2 * time.Millisecond)
	far.Announce("rg:{u:alice}:fw2") // refunds of alice's and bob's keys, done in Redis
	far.Announce("rg:{u:bob}:fw2")
	time.Sleep(3 * time.Millisecond)
	cancel() // the instance shuts down
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of its context's end")
	}

	deadline := time.Now().Add(2 * time.Second)
	for other.Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := other.Len(); n != 0 {
		t.Errorf("the other instance still holds %d cached denials 2 s after their refunds were announced by an instance that then shut down: "+
			"the announcements in flight and queued at the shutdown were dropped (no flush, no clearAll), so it denies alice and bob until their retry time (an hour here) while Redis admits them", n)
	}
}
