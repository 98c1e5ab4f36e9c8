package limits

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// TestDecisionRunsAtMostOnce: a decision whose connection dies after Redis
// ran its script (the reply is lost) must never be sent again: it may have
// committed, and a second run commits twice. A proxy cuts 10% of the
// connections right after Redis answered; every request goes to a key of
// its own with room to spare, so a key holding more than one unit was
// decided twice. On every topology of one Redis, with coalescing on and off.
func TestDecisionRunsAtMostOnce(t *testing.T) {
	for _, coalesce := range []bool{true, false} {
		t.Run(fmt.Sprintf("coalesce=%v", coalesce), func(t *testing.T) {
			srv := testredis.Start(t)
			px := testredis.StartProxy(t, srv.Addr)
			rs, err := OpenRedis(RedisOptions{URL: "redis://" + px.Addr + "/0", Coalesce: CoalesceOptions{Disabled: !coalesce}})
			if err != nil {
				t.Fatal(err)
			}
			defer rs.Close()
			ctx := context.Background()
			if err := rs.Warm(ctx); err != nil {
				t.Fatal(err)
			}
			px.DropReplies(0.10)
			const n = 500
			admitted, failed := 0, 0
			for i := range n {
				c := Check{Key: "rg:{once:" + strconv.Itoa(i) + "}:fw", Algorithm: FixedWindow, Limit: 100,
					PeriodUS: PeriodUS(time.Hour), Burst: 100, Cost: 1}
				var r [1]Result
				dctx, cancel := context.WithTimeout(ctx, time.Second)
				ok, err := rs.Decide(dctx, &Batch{Checks: []Check{c}}, r[:])
				cancel()
				switch {
				case err != nil:
					failed++
				case ok:
					admitted++
				}
			}
			px.DropReplies(0)
			direct := srv.Client(t)
			stored, twice := 0, 0
			for i := range n {
				v, err := direct.HGet(ctx, "rg:{once:"+strconv.Itoa(i)+"}:fw", "n").Int()
				if err == redis.Nil {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				stored += v
				if v > 1 {
					twice++
				}
			}
			t.Logf("%d requests: %d admitted, %d failed (%d replies dropped); %d units stored, %d keys decided twice",
				n, admitted, failed, px.Dropped(), stored, twice)
			if px.Dropped() == 0 {
				t.Fatal("the proxy dropped nothing: the test tested nothing")
			}
			if twice > 0 {
				t.Errorf("%d keys hold 2 or more units: a decision ran again after its reply was lost", twice)
			}
			if stored > admitted+failed {
				t.Errorf("%d units stored for %d admitted and %d failed requests: more than one run per request", stored, admitted, failed)
			}
		})
	}
}
