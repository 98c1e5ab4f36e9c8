package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// clusterThreeUserRulesYAML: three per-user rules (each in its own slot:
// the rule name is in the hash tag) and a global rule on /g. A request to
// /g that global denies after u1, u2 and u3 admitted is refunded in three
// slots: three refund jobs, three announcements on <prefix>:resets.
const clusterThreeUserRulesYAML = `rules:
  - name: u1
    key: [user]
    algorithm: fixed_window
    limit: 2
    period: 1h
  - name: u2
    key: [user]
    algorithm: fixed_window
    limit: 2
    period: 1h
  - name: u3
    key: [user]
    algorithm: fixed_window
    limit: 2
    period: 1h
  - name: global
    match: {path: /g}
    key: []
    algorithm: fixed_window
    limit: 3
    period: 1h
`

// TestDenyCacheOnClusterRefundAnnouncementSurvivesAStalledPrimary: a
// refund's announcement (PUBLISH <prefix>:resets key) is a keyless command,
// which go-redis's ClusterClient sends to the next primary in round robin,
// whichever it is: one that the refund, the request and the subscribers
// never needed. When that primary was stalled (frozen here; a partition or
// an overloaded node alike), the PUBLISH timed out at the background
// deadline (1 s) and the announcement was dropped (nothing retried or fell
// back). The other instances' subscriptions, on a healthy primary, never
// broke, so nothing cleared their caches: they kept denying the refunded
// identity until the cached retry (13 minutes, the hour's end) while Redis
// admitted it. Announcements now go to the channel's own primary, and one
// that fails becomes a clear of every cache, retried until it is out.
//
// Layout: global's key on primary X; the reset channel and carol's u1, u2
// and u3 keys on primary Z; the third primary Y only ever sees the
// announcements round robin sends it. Steps as in
// TestDenyCacheOnClusterForgetsARefund: B's request to /g commits carol's
// units in u1..u3 and waits on X (frozen); A caches carol's denial of all
// three; Y freezes, X thaws, global denies B's request, B refunds u1..u3
// and announces three keys, one of them through Y.
func TestDenyCacheOnClusterRefundAnnouncementSurvivesAStalledPrimary(t *testing.T) {
	c := testredis.StartCluster(t)
	primaries, err := c.Primaries()
	if err != nil || len(primaries) != 3 {
		t.Fatalf("primaries: %v %v", primaries, err)
	}
	owner := func(key string) string { return slotOwner(t, c, key) }
	x := owner("p:{global:}:fw") // the slot is the tag's, whatever the prefix
	var prefix, z string
	for i := range 200 {
		p := fmt.Sprintf("%s%d", uniquePrefix(t), i)
		if o := owner(p + ":resets"); o != x {
			prefix, z = p, o
			break
		}
	}
	if prefix == "" {
		t.Fatal("no prefix whose reset channel is on another primary than global's")
	}
	y := ""
	for _, p := range primaries {
		if p.Addr != x && p.Addr != z {
			y = p.Addr
		}
	}
	user := ""
	for i := range 5000 {
		u := fmt.Sprintf("carol%d", i)
		if owner(prefix+":{u1:"+u+"}:fw") == z && owner(prefix+":{u2:"+u+"}:fw") == z && owner(prefix+":{u3:"+u+"}:fw") == z {
			user = u
			break
		}
	}
	if user == "" {
		t.Fatal("no user whose three keys are on the reset channel's primary")
	}

	p := newClusterPair(t, c, clusterThreeUserRulesYAML, prefix)
	done, thawX := p.holdAtGlobal(user, x, "u1", "u2", "u3")
	p.must(p.a, user, "/other", false, "carol at A while B's units are held")
	if d := p.must(p.a, user, "/other", false, "carol at A again"); !d.Cached {
		t.Fatal("instance A did not cache carol's denial")
	}
	if n := p.aCache.Len(); n != 3 {
		t.Fatalf("instance A caches %d denials of carol, want 3 (u1, u2, u3)", n)
	}

	thawY := p.freeze(y)
	thawX()
	p.deniedByGlobal(<-done)
	refunded := time.Now()
	// An announcement that arrives arrives within milliseconds; one sent
	// to Y gave up after 1 s. Wait 2 s (Y is failed over after ~4 s).
	for p.aCache.Len() != 0 && time.Since(refunded) < 2*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	left := p.aCache.Len()
	var rem [3]int64
	for i, r := range []string{"u1", "u2", "u3"} {
		rem[i] = p.remaining(r, user)
	}
	d, err := p.decide(context.Background(), p.a, user, "/other")
	thawY()
	if left != 0 {
		t.Fatalf("%v after B's refund (Redis: carol has %v left in u1, u2, u3), instance A still caches %d of carol's 3 denials and answers her request admitted=%v cached=%v err %v, retry %v: the announcement sent to the frozen primary %s was lost, and A denies her until the hour's end",
			time.Since(refunded).Round(time.Millisecond), rem, left, d.Admitted, d.Cached, err, retryOf(d).Round(time.Second), y)
	}
}

// retryOf is the denying verdict's retry, or 0.
func retryOf(d limits.Decision) time.Duration {
	if d.Denier < 0 || d.Denier >= len(d.Verdicts) {
		return 0
	}
	return time.Duration(d.Verdicts[d.Denier].Result.RetryUS) * time.Microsecond
}
