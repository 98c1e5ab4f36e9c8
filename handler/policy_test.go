package handler

import (
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

func TestPolicyHeaderSubSecond(t *testing.T) {
	ts := pinned(t, Options{},
		rule("burst", 10, 500*time.Millisecond, limits.KeyIP),
		rule("slow", 7, 1500*time.Millisecond, limits.KeyIP),
		rule("minute", 5, time.Minute, limits.KeyIP),
	)
	r := ts.auth(t, std("192.0.2.1")...)
	equal(t, `"burst";q=20;w=1, "slow";q=14;w=3, "minute";q=5;w=60`, r.headers["ratelimit-policy"])
	// Remaining and limit stay the rule's own numbers.
	equal(t, `"burst";r=9;t=1, "slow";r=6;t=2, "minute";r=4;t=42`, r.headers["ratelimit"])
	equal(t, "4", r.headers["x-ratelimit-remaining"])
}
