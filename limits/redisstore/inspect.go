package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/rategate/rategate/limits"

	"github.com/redis/go-redis/v9"
)

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

// Raw implements Inspector with TYPE, then HGETALL, ZRANGE WITHSCORES or GET
// (a record decoded by its algorithm's layout), then PTTL. The reads are not atomic with each other; the value is for
// display only.
func (s *Store) Raw(ctx context.Context, key string) (limits.RawValue, error) {
	rr, ok := s.client.(rawReader)
	if !ok {
		return limits.RawValue{}, errNoRaw
	}
	typ, err := rr.Type(ctx, key).Result()
	if err != nil {
		return limits.RawValue{}, fmt.Errorf("redis store: TYPE %q: %w", key, err)
	}
	v := limits.RawValue{Type: typ, TTLMS: -2}
	switch typ {
	case "none":
		return v, nil
	case "hash":
		if v.Hash, err = rr.HGetAll(ctx, key).Result(); err != nil {
			return limits.RawValue{}, fmt.Errorf("redis store: HGETALL %q: %w", key, err)
		}
	case "zset":
		zs, err := rr.ZRangeWithScores(ctx, key, 0, limits.MaxRawMembers-1).Result()
		if err != nil {
			return limits.RawValue{}, fmt.Errorf("redis store: ZRANGE %q: %w", key, err)
		}
		v.ZSet = make([]limits.ZMember, len(zs))
		for i, z := range zs {
			m, _ := z.Member.(string)
			v.ZSet[i] = limits.ZMember{Member: m, Score: z.Score}
		}
	case "string":
		if v.String, err = rr.Get(ctx, key).Result(); err != nil && !errors.Is(err, redis.Nil) {
			return limits.RawValue{}, fmt.Errorf("redis store: GET %q: %w", key, err)
		}
		if rec, ok := limits.DecodeRecord(key, []byte(v.String)); ok {
			v.Record, v.String = rec, ""
		}
	}
	ttl, err := rr.PTTL(ctx, key).Result()
	if err != nil {
		return limits.RawValue{}, fmt.Errorf("redis store: PTTL %q: %w", key, err)
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
