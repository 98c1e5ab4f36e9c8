package limits

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// This file lets operators see a key's stored value as the store holds it
// (the admin API's "raw" field): the Redis store reads it with a few plain
// commands, the memory store renders its state in the same shape, so the
// answer does not depend on the store.

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

// rawReader is the part of go-redis the Redis store uses to read a raw
// value; *redis.Client and *redis.ClusterClient have it.
type rawReader interface {
	Type(ctx context.Context, key string) *redis.StatusCmd
	HGetAll(ctx context.Context, key string) *redis.MapStringStringCmd
	ZRangeWithScores(ctx context.Context, key string, start, stop int64) *redis.ZSliceCmd
	Get(ctx context.Context, key string) *redis.StringCmd
	PTTL(ctx context.Context, key string) *redis.DurationCmd
}

// errNoRaw is returned when the Redis client cannot run plain commands.
var errNoRaw = errors.New("redis store: this client cannot read raw values")

// maxRawMembers bounds the sorted-set members shown (a sliding log holds up
// to limit members).
const maxRawMembers = 1000

// Raw implements Inspector with TYPE, then HGETALL, ZRANGE WITHSCORES or GET,
// then PTTL. The reads are not atomic with each other; the value is for
// display only.
func (s *RedisStore) Raw(ctx context.Context, key string) (RawValue, error) {
	rr, ok := s.client.(rawReader)
	if !ok {
		return RawValue{}, errNoRaw
	}
	typ, err := rr.Type(ctx, key).Result()
	if err != nil {
		return RawValue{}, fmt.Errorf("redis store: TYPE %q: %w", key, err)
	}
	v := RawValue{Type: typ, TTLMS: -2}
	switch typ {
	case "none":
		return v, nil
	case "hash":
		if v.Hash, err = rr.HGetAll(ctx, key).Result(); err != nil {
			return RawValue{}, fmt.Errorf("redis store: HGETALL %q: %w", key, err)
		}
	case "zset":
		zs, err := rr.ZRangeWithScores(ctx, key, 0, maxRawMembers-1).Result()
		if err != nil {
			return RawValue{}, fmt.Errorf("redis store: ZRANGE %q: %w", key, err)
		}
		v.ZSet = make([]ZMember, len(zs))
		for i, z := range zs {
			m, _ := z.Member.(string)
			v.ZSet[i] = ZMember{Member: m, Score: z.Score}
		}
	case "string":
		if v.String, err = rr.Get(ctx, key).Result(); err != nil && !errors.Is(err, redis.Nil) {
			return RawValue{}, fmt.Errorf("redis store: GET %q: %w", key, err)
		}
	}
	ttl, err := rr.PTTL(ctx, key).Result()
	if err != nil {
		return RawValue{}, fmt.Errorf("redis store: PTTL %q: %w", key, err)
	}
	switch {
	case ttl == -1:
		v.TTLMS = -1
	case ttl < 0:
		v.TTLMS = -2
	default:
		v.TTLMS = ttl.Milliseconds()
	}
	return v, nil
}

// Raw implements Inspector: the key's state rendered as the Redis scripts
// store it, so both stores answer alike.
func (s *MemoryStore) Raw(_ context.Context, key string) (RawValue, error) {
	sh := &s.shards[s.shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	st := s.load(key, now)
	if st.expireUS == 0 {
		return RawValue{Type: "none", TTLMS: -2}, nil
	}
	v := RawValue{Type: "hash", TTLMS: (st.expireUS - now + 999) / 1000}
	i := func(n int64) string { return strconv.FormatInt(n, 10) }
	switch {
	case strings.HasSuffix(key, ":"+FixedWindow.Suffix()):
		v.Hash = map[string]string{"e": i(st.a), "n": i(st.b)}
	case strings.HasSuffix(key, ":"+SlidingWindow.Suffix()):
		v.Hash = map[string]string{"e": i(st.a), "c": i(st.b), "p": i(st.c), "d": i(st.d)}
	case strings.HasSuffix(key, ":"+GCRA.Suffix()):
		v.Hash = map[string]string{"t": i(st.a), "f": i(st.b), "l": i(st.c), "p": i(st.d)}
	case strings.HasSuffix(key, ":"+TokenBucket.Suffix()):
		v.Hash = map[string]string{"tokens": i(st.b), "ts": i(st.a), "l": i(st.c), "p": i(st.d), "b": i(st.e)}
	case strings.HasSuffix(key, ":"+SlidingLog.Suffix()):
		// The log is in member order already (time, then running total).
		v.Type = "zset"
		for _, e := range st.log[:min(len(st.log), maxRawMembers)] {
			v.ZSet = append(v.ZSet, ZMember{Member: slMember(e.k, e.cost), Score: float64(e.at)})
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
