package limits

import "context"

// This file lets operators see a key's stored value as the store holds it
// (the admin API's "raw" field). Each store renders its value in the shape
// the Redis scripts store it, so the answer does not depend on the store.

// RawValue is one key's stored value, for humans. It never drives a decision.
type RawValue struct {
	// Type is the Redis type: "none" (absent), "hash", "zset" or "string".
	Type string `json:"type"`
	// Hash holds a hash's fields (fixed_window: e, n; sliding_window: e, c,
	// p, d; gcra: t, f, l, p; token_bucket: tokens, ts, l, p, b; see each
	// lua/<algorithm>.lua).
	Hash map[string]string `json:"hash,omitempty"`
	// ZSet holds a sorted set's members, lowest score first (sliding_log:
	// score = the request's time in µs, member "<n><K>:<cost>" with K the
	// running total of the costs, n a letter giving K's digit count).
	ZSet []ZMember `json:"zset,omitempty"`
	// String holds a string value.
	String string `json:"string,omitempty"`
	// TTLMS is the time to live in milliseconds; -1 = no expiry, -2 = absent.
	TTLMS int64 `json:"ttl_ms"`
}

// ZMember is one sorted-set member.
type ZMember struct {
	Member string  `json:"member"`
	Score  float64 `json:"score"`
}

// Inspector is implemented by stores that can show a key's raw value. It is
// optional: the admin API shows the raw value only when the store has it.
type Inspector interface {
	Raw(ctx context.Context, key string) (RawValue, error)
}

// MaxRawMembers bounds the sorted-set members a RawValue shows (a sliding
// log holds up to limit members).
const MaxRawMembers = 1000
