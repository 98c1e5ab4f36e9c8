package lua

import (
	"context"
	_ "embed"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/limits"
)

// slidingLogC712060 is lua/sliding_log.lua as commit c712060 (the last
// build before e299d84 gave sliding_log its running-total members) decides
// with it: members "<time>:<seq>:<cost>", under the key suffix "sl".
//
//go:embed testdata/sliding_log_c712060.lua
var slidingLogC712060 string

// TestSlidingLogBesideOlderBuild: a rolling update from a build of
// c712060 or before to this one, both on one Redis, one sliding_log rule
// (3 per minute per IP), a client whose requests go to either instance in
// turn. The builds write different log layouts; under one key
// ("rg:{rule:ip}:sl", as before e299d84) this build dropped a log holding
// a member of the old layout at its next costing decision, and the old
// build read this build's members (they end in ":<cost>" too) and added
// its own after them: 20 of 20 were admitted at a limit of 3, for as long
// as both builds ran. The layout is in the suffix now ("sl2", as fw2,
// sw2, gc2, tb2): each build counts on its own key, 3 each at most.
func TestSlidingLogBesideOlderBuild(t *testing.T) {
	client, lib := withLibrary(t)
	ctx := context.Background()
	old := redis.NewScript(slidingLogC712060)
	const limit, period = 3, int64(60_000_000)
	ip := "203.0.113.9"
	// the key each build names: the old one's as c712060 builds it
	oldKey := "rg:{login-per-ip:" + ip + "}:sl"
	rule := &limits.Rule{Name: "login-per-ip", Algorithm: limits.SlidingLog, Limit: limit, Period: time.Minute, Burst: limit, Cost: 1}
	newKey := string(limits.AppendKey(nil, "rg", rule, []byte(ip)))
	check := [5]int64{int64(Code("sliding_log")), limit, period, limit, 1}
	now := time.Now().UnixMicro()
	admitted, sent := 0, 0
	var trace []byte
	for i := 0; i < 10; i++ {
		now += 1000
		a, err := old.Run(ctx, client, []string{oldKey}, now, limit, period, limit, 1).Int64Slice()
		if err != nil {
			t.Fatalf("old build: %v", err)
		}
		sent++
		admitted += int(a[0])
		now += 1000
		b, err := client.FCall(ctx, lib.Decide, []string{newKey}, decideArgv(now, check)...).Int64Slice()
		if err != nil {
			t.Fatalf("this build: %v", err)
		}
		sent++
		admitted += int(b[0])
		trace = fmt.Appendf(trace, " old %d new %d", a[0], b[0])
	}
	if admitted > 2*limit {
		t.Errorf("%d of %d admitted within %d ms at %d per minute, alternating between a c712060 build and this one (keys %s and %s); "+
			"at most %d (each build its own limit) should pass:%s", admitted, sent, sent, limit, oldKey, newKey, 2*limit, trace)
	}
}
