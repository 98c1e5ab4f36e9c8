package lua_test

import (
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// TestGCRARefundAcrossASmallerBurst: a refund in flight while a decision
// under a smaller burst (a reload or override lowering it, the rate kept)
// reads the key. That decision used to cap the backlog at its own burst,
// dropping units already used, the refunded one among them; the refund
// then gave that unit back a second time, and under the old burst 9 were
// admitted where 1 was owed. The TAT now stands under a smaller burst, so
// the refund gives back exactly its unit.
func TestGCRARefundAcrossASmallerBurst(t *testing.T) {
	client, decide, refund := refundScripts(t)
	ctx := testredis.Ctx(t)
	code := limits.GCRA.Code()
	p := limits.PeriodUS(time.Hour)
	const limit = 10
	T := p / limit
	t0 := time.Now().UnixMicro()
	key := "rg:{refund-burst}:gc2"
	ask := func(burst, at int64) bool {
		t.Helper()
		r, err := decide.Run(ctx, client, []string{key}, at, code, limit, p, burst, 1, 0).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return r[0] == 1
	}
	for i := 0; i < 10; i++ {
		if !ask(10, t0) {
			t.Fatalf("admission %d of the burst of 10 denied", i+1)
		}
	}
	// the burst lowered to 2 on another instance: denied, the backlog stands
	if ask(2, t0+1) {
		t.Fatal("burst 2 admitted with 10 used")
	}
	// the last commit (at t0, nothing left, reset 10 T) is refunded
	if _, err := refund.Run(ctx, client, []string{key, key + ":refund:1"}, t0+2, 60000, code, limit, p, 10, 1, t0, 0, 10*T).Result(); err != nil {
		t.Fatal(err)
	}
	if ask(2, t0+3) {
		t.Fatal("burst 2 admitted with 9 used after the refund")
	}
	admitted := 0
	for i := 0; i < 10; i++ {
		if ask(10, t0+4) {
			admitted++
		}
	}
	if admitted != 1 {
		t.Fatalf("under burst 10 after the refund of one unit: %d admitted, want 1", admitted)
	}
}
