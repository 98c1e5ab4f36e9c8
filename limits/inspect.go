package limits

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"
)

// This file lets operators see a key's stored value as the store holds it
// (the admin API's "raw" field). Each store renders its value in the shape
// the Redis scripts store it, so the answer does not depend on the store.

// RawValue is one key's stored value, for humans. It never drives a decision.
type RawValue struct {
	// Type is the Redis type: "none" (absent), "hash", "zset" or "string".
	Type string `json:"type"`
	// Hash holds a hash's fields (fixed_window: e, n; gcra: t, f, l, p;
	// token_bucket: tokens, ts, l, p, b; see each lua/<algorithm>.lua).
	Hash map[string]string `json:"hash,omitempty"`
	// Record holds a string record's numbers by name, read with the layout
	// of the algorithm its key names (AlgorithmInfo.Record; sliding_window:
	// e, c, p, d); String is then empty.
	Record map[string]string `json:"record,omitempty"`
	// ZSet holds a sorted set's members, lowest score first (sliding_log:
	// score = the request's time in µs, member "<n><K>:<cost>" with K the
	// running total of the costs, n a letter giving K's digit count).
	ZSet []ZMember `json:"zset,omitempty"`
	// String holds a string value that is not a record.
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

// DecodeRecord reads v, the string value of key, as the record of the
// algorithm key names: its numbers by name. ok is false when the key names
// no algorithm with a string record, or v is not one.
func DecodeRecord(key string, v []byte) (map[string]string, bool) {
	info, ok := AlgorithmOfKey(key)
	if !ok {
		return nil, false
	}
	return info.DecodeRecord(v)
}

// DecodeRecord reads v as the algorithm's string record: its numbers by
// name (whole numbers in decimal). ok is false when the algorithm has no
// string record or v is not one.
func (info AlgorithmInfo) DecodeRecord(v []byte) (map[string]string, bool) {
	if len(info.Record) == 0 || len(v) != 8*len(info.Record) {
		return nil, false
	}
	m := make(map[string]string, len(info.Record))
	for i, name := range info.Record {
		f := math.Float64frombits(binary.LittleEndian.Uint64(v[8*i:]))
		m[name] = strconv.FormatFloat(f, 'f', -1, 64)
	}
	return m, true
}
