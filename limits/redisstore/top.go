package redisstore

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Top is where instances share their top-denied summaries
// (top.Shared): the hash <prefix>:top:<rule>, one field per instance,
// expiring a little after the sketch's window.
type Top struct {
	client redis.UniversalClient
	prefix string
}

// NewTop returns the top-denied share of the given key prefix.
func NewTop(client redis.UniversalClient, prefix string) *Top {
	return &Top{client: client, prefix: prefix}
}

func (s *Top) key(rule string) string { return s.prefix + ":top:" + rule }

// Publish implements top.Shared.
func (s *Top) Publish(ctx context.Context, rule, instance string, summary []byte, ttl time.Duration) error {
	key := s.key(rule)
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, instance, summary)
		p.Expire(ctx, key, ttl)
		return nil
	})
	return err
}

// Remove implements top.Shared.
func (s *Top) Remove(ctx context.Context, rule string, instances []string) error {
	return s.client.HDel(ctx, s.key(rule), instances...).Err()
}

// Load implements top.Shared.
func (s *Top) Load(ctx context.Context, rule string) (map[string]string, error) {
	return s.client.HGetAll(ctx, s.key(rule)).Result()
}

// Rules implements top.Shared with SCAN (on every primary of a cluster),
// bounded by max.
func (s *Top) Rules(ctx context.Context, max int) ([]string, error) {
	pattern := s.prefix + ":top:*"
	var mu sync.Mutex
	var names []string
	collect := func(ctx context.Context, c redis.UniversalClient) error {
		iter := c.Scan(ctx, 0, pattern, 100).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			full := len(names) >= max
			if !full {
				names = append(names, strings.TrimPrefix(iter.Val(), s.prefix+":top:"))
			}
			mu.Unlock()
			if full {
				break
			}
		}
		return iter.Err()
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return collect(ctx, c) })
		return names, err
	}
	return names, collect(ctx, s.client)
}
