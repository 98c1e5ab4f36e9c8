package lua

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestDecideManyFailingDecisionKeepsAtMostItsAdmissions: a decision that
// fails midway (its second key holds a list) may keep what a check before
// its error admitted, or not (decide_many.lua's header): alone, FCALL of
// Decide writes the first check's count at once and keeps it; in a batch
// whose other decision names the same key, the call holds that key, the
// first check hands its admission back, and the error drops it. Either
// way it keeps at most its own admission, and the batch's later decision
// on that key sees what it kept, as it would one by one.
func TestDecideManyFailingDecisionKeepsAtMostItsAdmissions(t *testing.T) {
	client, lib := withLibrary(t) // a fresh library: rg_careful 0
	ctx := context.Background()
	fw := steadyRule("fixed_window", 10)
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
	m, a := fwCount(t, client, inSpace("m")("k")), fwCount(t, client, o("k"))
	if a != "2" {
		t.Errorf("one by one, k counts %s after the failed decision, want 2 (its first check written at once)", a)
	}
	if m != "1" && m != "2" {
		t.Errorf("the batch left k counting %s, want 1 (before the failed decision) or 2 (its admission kept)", m)
	}
	if rem, ok := flat[2].(int64); !ok || strconv.FormatInt(10-rem, 10) != m {
		t.Errorf("the batch's look on k reported %v remaining with k counting %s: the look did not see what the failed decision left", flat[2], m)
	}
}
