package lua

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// TestDecideManyFailingDecisionWritesAsAlone: a decision that fails
// midway (its second key holds a list) leaves what it wrote before its
// error "exactly as the same decision alone would have"
// (decide_many.lua's header). Alone, FCALL of Decide writes the first
// check's count at once (its record is in its window: rg_chain's count
// write) and keeps it when the second check fails. In a batch whose other
// decision names the same key, the call holds that key: the first check
// hands its admission back instead, and the error drops it, so the batch
// leaves the count one lower than the decision alone, and a look after it
// in the batch reports one more remaining than the same look alone.
func TestDecideManyFailingDecisionWritesAsAlone(t *testing.T) {
	client, lib := withLibrary(t) // a fresh library: rg_careful 0
	ctx := context.Background()
	fw := minuteRule("fixed_window", 10)
	look := fw
	look[4] = 0
	for _, sp := range []string{"m", "o"} {
		k := inSpace(sp)
		if err := client.RPush(ctx, k("list"), "x").Err(); err != nil {
			t.Fatal(err)
		}
		// a record in its window: 1 of 10 counted
		if err := client.FCall(ctx, lib.Decide, []string{k("k")}, decideArgv(0, fw)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ds := []manyDecision{
		{[]string{"k", "list"}, decideArgv(0, fw, fw)},
		{[]string{"k"}, decideArgv(0, look)},
	}
	keys, args := manyArgs(inSpace("m"), ds)
	if heldChecks(args) != 2 {
		t.Fatalf("want k held in both decisions: %v", args)
	}
	flat, err := client.FCall(ctx, lib.DecideMany, keys, args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := flat[1].(redis.Error); !ok || !strings.Contains(e.Error(), "WRONGTYPE") {
		t.Fatalf("the batch's first decision answered %v, want WRONGTYPE", flat[1])
	}
	// the same decisions one by one, at the batch's instant
	o := inSpace("o")
	err = client.FCall(ctx, lib.Decide, []string{o("k"), o("list")}, append([]any{flat[0]}, ds[0].argv[1:]...)...).Err()
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("the first decision alone: %v, want WRONGTYPE", err)
	}
	alone, err := client.FCall(ctx, lib.Decide, []string{o("k")}, append([]any{flat[0]}, ds[1].argv[1:]...)...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	m, a := fwCount(t, client, inSpace("m")("k")), fwCount(t, client, o("k"))
	if m != a || flat[2] != alone[3] {
		t.Errorf("after a decision that failed on its second key: the batch left k counting %s and its look reported %v remaining; "+
			"one by one, k counts %s and the look reports %v (records %s and %s)",
			m, flat[2], a, alone[3], testredis.KeyState(t, client, inSpace("m")("k")), testredis.KeyState(t, client, o("k")))
	}
}
