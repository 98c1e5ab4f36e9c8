package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/lua"
)

// Adaptive keeps the adaptive records and leases of policy's
// adaptive limits (docs/adaptive.md) in Redis:
//
//	<prefix>:{adaptive}               hash: field = rule name, value = the record (JSON)
//	<prefix>:{adaptive}:lease:<rule>  string: the holder's instance name, with the lease's TTL
//
// and announces changed records on the pub/sub channel <prefix>:adaptive.
// The hash tag puts every key in one slot, so on Redis Cluster too the
// write is checked against the lease in one script (lua/adaptive_write.lua).
type Adaptive struct {
	client  redis.UniversalClient
	prefix  string
	hash    string
	channel string
	lead    *redis.Script
	write   *redis.Script
	release *redis.Script
}

// NewAdaptive returns the adaptive store of the given key prefix.
func NewAdaptive(client redis.UniversalClient, prefix string) (*Adaptive, error) {
	s := &Adaptive{client: client, prefix: prefix, hash: prefix + ":{adaptive}", channel: prefix + ":adaptive"}
	for _, sc := range []struct {
		file string
		dst  **redis.Script
	}{{"adaptive_lead.lua", &s.lead}, {"adaptive_write.lua", &s.write}, {"adaptive_release.lua", &s.release}} {
		src, err := lua.Source(sc.file)
		if err != nil {
			return nil, err
		}
		*sc.dst = redis.NewScript(src)
	}
	return s, nil
}

// Key returns the records' hash key.
func (s *Adaptive) Key() string { return s.hash }

// LeaseKey returns the key of rule's lease.
func (s *Adaptive) LeaseKey(rule string) string { return s.hash + ":lease:" + rule }

// Load implements policy.AdaptiveStore.
func (s *Adaptive) Load(ctx context.Context) (map[string]string, error) {
	m, err := s.client.HGetAll(ctx, s.hash).Result()
	if err != nil {
		return nil, fmt.Errorf("read adaptive factors from %s: %w", s.hash, err)
	}
	return m, nil
}

// Lead implements policy.AdaptiveStore.
func (s *Adaptive) Lead(ctx context.Context, rule, instance string, ttl time.Duration) (bool, error) {
	n, err := s.lead.Run(ctx, s.client, []string{s.LeaseKey(rule)}, instance, max(ttl.Milliseconds(), 1)).Int64()
	if err != nil {
		return false, fmt.Errorf("take the adaptive lease %s: %w", s.LeaseKey(rule), err)
	}
	return n == 1, nil
}

// Write implements policy.AdaptiveStore.
func (s *Adaptive) Write(ctx context.Context, rule, instance, value string, announce bool) (bool, error) {
	n, err := s.write.Run(ctx, s.client, []string{s.LeaseKey(rule), s.hash}, instance, rule, value).Int64()
	if err != nil {
		return false, fmt.Errorf("store the adaptive factor in %s: %w", s.hash, err)
	}
	if n != 1 {
		return false, nil
	}
	if announce {
		// A lost announcement only delays the others until their next re-read.
		_ = s.client.Publish(ctx, s.channel, rule).Err()
	}
	return true, nil
}

// Release implements policy.AdaptiveStore.
func (s *Adaptive) Release(ctx context.Context, rule, instance string) error {
	if err := s.release.Run(ctx, s.client, []string{s.LeaseKey(rule)}, instance).Err(); err != nil {
		return fmt.Errorf("release the adaptive lease %s: %w", s.LeaseKey(rule), err)
	}
	return nil
}

// Watch implements policy.AdaptiveStore with SUBSCRIBE; go-redis
// resubscribes by itself after a reconnect.
func (s *Adaptive) Watch(ctx context.Context) <-chan struct{} {
	return watchChannel(ctx, s.client, s.channel)
}

// Shared implements policy.AdaptiveStore.
func (s *Adaptive) Shared() bool { return true }
