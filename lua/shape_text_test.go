package lua

import (
	"context"
	"testing"
)

// TestShapeCacheSpacedNumbers: decide.lua's shape cache (rg_shapes) keys
// a check's six arguments by their text, and tonumber takes a number with
// a space at either end. Joined with single spaces, cost "1" and shadow
// " 1" (not a shadow: the flag is the text "1") gave the same text as cost
// "1 " and shadow "1" (a shadow), and once the first was cached, Decide
// took the second for it: a shadow check over its limit denied the
// request, which the script (a cache of its own per call) and DecideMany
// (no cache) admit. (rategate sends whole numbers; joined by '|' now, no
// two argument lists give one text.)
func TestShapeCacheSpacedNumbers(t *testing.T) {
	client, lib := withLibrary(t)
	ctx := context.Background()
	fw := Code("fixed_window")
	spent := inSpace("spaced")("spent")
	// limit 1, spent
	if err := client.FCall(ctx, lib.Decide, []string{spent}, decideArgv(0, [5]int64{int64(fw), 1, 60_000_000, 1, 1})...).Err(); err != nil {
		t.Fatal(err)
	}
	shadow := []any{0, fw, "1", "60000000", "1", "1 ", "1"} // cost "1 ", a shadow
	notShadow := []any{0, fw, "1", "60000000", "1", "1", " 1"}
	// a request on another key with the lookalike numbers caches its shape
	if err := client.FCall(ctx, lib.Decide, []string{inSpace("spaced")("other")}, notShadow...).Err(); err != nil {
		t.Fatal(err)
	}
	script, err := DecideScript.Run(ctx, client, []string{spent}, shadow...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	ds := []manyDecision{{[]string{"spent"}, shadow}}
	keys, args := manyArgs(inSpace("spaced"), ds)
	many, err := client.FCall(ctx, lib.DecideMany, keys, args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	r, err := client.FCall(ctx, lib.Decide, []string{spent}, shadow...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	// DecideMany's reply: a denied check is three values, admitted (a shadow)
	if r[0] != script[0] || r[0] != 1 {
		t.Errorf("the shadow check after a lookalike shape: Decide admitted %d (%v); the script admitted %d, DecideMany answered %v (its check denied, the shadow admitted)",
			r[0], r, script[0], many)
	}
}
