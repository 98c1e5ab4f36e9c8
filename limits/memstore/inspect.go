package memstore

import (
	"context"
	"strconv"

	"github.com/rategate/rategate/limits"
)

// Raw implements Inspector: the key's state rendered as the Redis scripts
// store it, so both stores answer alike.
func (s *Store) Raw(_ context.Context, key string) (limits.RawValue, error) {
	sh := &s.shards[s.shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	st := s.load(key, now)
	if st.expireUS == 0 {
		return limits.RawValue{Type: "none", TTLMS: -2}, nil
	}
	v := limits.RawValue{Type: "hash", TTLMS: (st.expireUS - now + 999) / 1000}
	i := func(n int64) string { return strconv.FormatInt(n, 10) }
	info, _ := limits.AlgorithmOfKey(key)
	switch {
	case info.Record != nil:
		// the state's numbers in the order of the record's names
		// (AlgorithmInfo.Record); token_bucket keeps its tokens in b, ts in a
		n := [...]int64{st.a, st.b, st.c, st.d, st.e}
		if info.Name == limits.TokenBucket {
			n[0], n[1] = st.b, st.a
		}
		v.Type, v.Record = "string", make(map[string]string, len(info.Record))
		for j, name := range info.Record {
			v.Record[name] = i(n[j])
		}
	case info.Name == limits.SlidingLog:
		// The log is in member order already (time, then running total).
		v.Type = "zset"
		for _, e := range st.log[:min(len(st.log), limits.MaxRawMembers)] {
			v.ZSet = append(v.ZSet, limits.ZMember{Member: slMember(e.k, e.cost), Score: float64(e.at)})
		}
	default:
		v.Hash = map[string]string{"a": i(st.a), "b": i(st.b), "c": i(st.c)}
	}
	return v, nil
}

// slMember is the Redis member of a sliding-log entry (lua/sliding_log.lua's
// sl_member): a letter for the running total's digit count ('a' = 1), the
// total, ':' and the cost. The letter makes members of one µs sort by total.
func slMember(k, cost int64) string {
	d := strconv.FormatInt(k, 10)
	return string(rune('a'+len(d)-1)) + d + ":" + strconv.FormatInt(cost, 10)
}
