package metrics

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisInfo is the Redis health rategate exports, read from INFO. On Redis
// Cluster the values are summed over the masters.
type RedisInfo struct {
	// Up is false when the last INFO failed; the other fields then keep
	// their last known values.
	Up               bool
	UsedMemory       int64
	MaxMemory        int64
	ConnectedClients int64
	OpsPerSec        int64
	EvictedKeys      int64
	ExpiredKeys      int64
}

// infoFields maps INFO fields to where they go.
var infoFields = map[string]func(*RedisInfo) *int64{
	"used_memory":               func(r *RedisInfo) *int64 { return &r.UsedMemory },
	"maxmemory":                 func(r *RedisInfo) *int64 { return &r.MaxMemory },
	"connected_clients":         func(r *RedisInfo) *int64 { return &r.ConnectedClients },
	"instantaneous_ops_per_sec": func(r *RedisInfo) *int64 { return &r.OpsPerSec },
	"evicted_keys":              func(r *RedisInfo) *int64 { return &r.EvictedKeys },
	"expired_keys":              func(r *RedisInfo) *int64 { return &r.ExpiredKeys },
}

// ParseInfo adds the fields rategate exports from one INFO reply to r.
func ParseInfo(text string, r *RedisInfo) {
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		f := infoFields[k]
		if f == nil {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			*f(r) += n
		}
	}
}

// ReadRedisInfo runs INFO memory clients stats (on every master of a
// cluster client) and returns the parsed values.
func ReadRedisInfo(ctx context.Context, c redis.UniversalClient) (RedisInfo, error) {
	var info RedisInfo
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			text, err := n.Info(ctx, "memory", "clients", "stats").Result()
			if err != nil {
				return err
			}
			mu.Lock()
			ParseInfo(text, &info)
			mu.Unlock()
			return nil
		})
		if err != nil {
			return RedisInfo{}, err
		}
		info.Up = true
		return info, nil
	}
	text, err := c.Info(ctx, "memory", "clients", "stats").Result()
	if err != nil {
		return RedisInfo{}, err
	}
	ParseInfo(text, &info)
	info.Up = true
	return info, nil
}

// PollRedis reads INFO from c now and then every interval until ctx ends,
// and exports the result as the rategate_redis_* gauges. Each read has its
// own deadline of timeout.
func (m *Metrics) PollRedis(ctx context.Context, c redis.UniversalClient, every, timeout time.Duration) {
	m.redisPolled.Store(true)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		m.pollOnce(ctx, c, timeout)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Metrics) pollOnce(ctx context.Context, c redis.UniversalClient, timeout time.Duration) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	info, err := ReadRedisInfo(rctx, c)
	cancel()
	if err != nil {
		last := RedisInfo{}
		if p := m.redis.Load(); p != nil {
			last = *p
		}
		last.Up = false
		m.redis.Store(&last)
		return
	}
	m.redis.Store(&info)
}
