package lua

import (
	"context"
	_ "embed"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// tokenBucketDed676e is lua/token_bucket.lua as commit ded676e (the build
// before 3d013ba) has it: a burst changed at the same rate caps what was
// used at the reader's burst and rewrites the record even on a denial.
//
//go:embed testdata/token_bucket_ded676e.lua
var tokenBucketDed676e string

// TestReviewBurstChangeBesideOlderBuild: 3d013ba makes a token_bucket
// burst changed at the same rate safe while instances disagree, and drops
// the reload warning for it (CHANGELOG: "a fleet where some instances
// still run the old burst admits no more than the looser one alone").
// That holds only when every instance runs this build. A rollout that
// brings this build and a new burst together (a Deployment's new pods
// start with the new config, its old pods keep the old build and the old
// burst) is the mixed fleet: 1 a second, the old build on burst 1, this
// build on burst 10, a client alternating every 60 ms for 2 s. The looser
// rule alone admits 12; both builds of this commit 11 (docs/algorithms.md).
func TestReviewBurstChangeBesideOlderBuild(t *testing.T) {
	client := testredis.Start(t).Client(t)
	ctx := context.Background()
	src, err := Source("token_bucket.lua")
	if err != nil {
		t.Fatal(err)
	}
	type side struct {
		script *redis.Script
		burst  int64
	}
	run := func(key string, a, b side) (admitted int) {
		t0 := int64(1_700_000_000_000_000)
		for i := int64(0); i < 34; i++ {
			s := a
			if i%2 == 1 {
				s = b
			}
			r, err := s.script.Run(ctx, client, []string{key}, t0+i*60_000, 1, 1_000_000, s.burst, 1).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			admitted += int(r[0])
		}
		return admitted
	}
	newer, older := redis.NewScript(src), redis.NewScript(tokenBucketDed676e)
	same := run("rg:{mixed:new}:tb2", side{newer, 1}, side{newer, 10})
	mixed := run("rg:{mixed:old}:tb2", side{older, 1}, side{newer, 10})
	t.Logf("1/s, bursts 1 and 10, 34 requests alternating in 2 s: this build on both sides %d admitted; the old build (burst 1) beside this one (burst 10) %d; the looser rule alone 12", same, mixed)
	if mixed > 12 {
		t.Errorf("an older build on the old burst beside this build on the new one admitted %d, the looser rule alone 12: "+
			"the burst change is not safe during a rollout to this build, and no reload warning says so any more", mixed)
	}
}
