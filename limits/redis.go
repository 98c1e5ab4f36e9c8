package limits

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/lua"
)

// RedisClient is what the Redis store needs from go-redis: scripts, plus
// PING and DEL for readiness and resets. *redis.Client, *redis.ClusterClient
// and redis.UniversalClient all satisfy it.
type RedisClient interface {
	redis.Scripter
	Ping(ctx context.Context) *redis.StatusCmd
	Del(ctx context.Context, keys ...string) *redis.IntCmd
	Close() error
}

// RedisStore decides batches with one EVALSHA of the multi-rule script
// (EVAL when Redis answers NOSCRIPT, e.g. after a restart).
type RedisStore struct {
	client RedisClient
	name   string
	script *redis.Script
}

// NewRedisStore returns a store over client; name describes it in logs.
func NewRedisStore(client RedisClient, name string) (*RedisStore, error) {
	src, err := lua.Decide()
	if err != nil {
		return nil, err
	}
	return &RedisStore{client: client, name: name, script: redis.NewScript(src)}, nil
}

// Name implements Store.
func (s *RedisStore) Name() string { return s.name }

// Ping implements Store.
func (s *RedisStore) Ping(ctx context.Context) error { return s.client.Ping(ctx).Err() }

// Close closes the client.
func (s *RedisStore) Close() error { return s.client.Close() }

// Decide implements Store.
func (s *RedisStore) Decide(ctx context.Context, b *Batch, results []Result) (bool, error) {
	n := len(b.Checks)
	if len(results) < n {
		return false, errNoChecks
	}
	keys := make([]string, n)
	args := make([]any, 1, 1+6*n)
	args[0] = b.NowUS
	for i := range b.Checks {
		c := &b.Checks[i]
		code := lua.Code(string(c.Algorithm))
		if code == 0 {
			return false, fmt.Errorf("redis store: algorithm %q not implemented", c.Algorithm)
		}
		keys[i] = c.Key
		shadow := 0
		if c.Shadow {
			shadow = 1
		}
		args = append(args, code, c.Limit, c.PeriodUS, c.Burst, c.Cost, shadow)
	}
	reply, err := s.script.Run(ctx, s.client, keys, args...).Result()
	if err != nil {
		return false, fmt.Errorf("redis store: decide: %w", err)
	}
	return parseDecideReply(reply, results[:n])
}

// parseDecideReply turns decide.lua's reply into results. Any surprise in the
// reply's shape is an error, never a panic.
func parseDecideReply(reply any, results []Result) (bool, error) {
	arr, ok := reply.([]any)
	if !ok {
		return false, fmt.Errorf("redis store: reply is %T, want array", reply)
	}
	if len(arr) != 2+4*len(results) {
		return false, fmt.Errorf("redis store: reply has %d items, want %d", len(arr), 2+4*len(results))
	}
	var ints [4]int64
	admitted, err := replyInt(arr[0])
	if err != nil {
		return false, err
	}
	for i := range results {
		for j := range ints {
			if ints[j], err = replyInt(arr[2+4*i+j]); err != nil {
				return false, err
			}
		}
		results[i] = Result{Allowed: ints[0] == 1, Remaining: ints[1], ResetUS: ints[2], RetryUS: ints[3]}
	}
	return admitted == 1, nil
}

func replyInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("redis store: reply item %q is not an integer", x)
		}
		return n, nil
	}
	return 0, fmt.Errorf("redis store: reply item is %T, want integer", v)
}

// Peek implements Store: a zero-cost decision, which no algorithm writes.
func (s *RedisStore) Peek(ctx context.Context, c Check) (Result, error) {
	return s.PeekAt(ctx, c, 0)
}

// PeekAt is Peek with the clock replaced by nowUS when non-zero. Tests only.
func (s *RedisStore) PeekAt(ctx context.Context, c Check, nowUS int64) (Result, error) {
	c.Cost = 0
	c.Shadow = false
	var r [1]Result
	if _, err := s.Decide(ctx, &Batch{Checks: []Check{c}, NowUS: nowUS}, r[:]); err != nil {
		return Result{}, err
	}
	return r[0], nil
}

// Reset implements Store.
func (s *RedisStore) Reset(ctx context.Context, c Check) error {
	if err := s.client.Del(ctx, c.Key).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("redis store: reset %q: %w", c.Key, err)
	}
	return nil
}
