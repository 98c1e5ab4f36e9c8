package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Overrides keeps overrides in the hash <prefix>:overrides (field =
// rule name, value = JSON) and announces changes on the pub/sub channel of
// the same name.
type Overrides struct {
	client redis.UniversalClient
	key    string
}

// NewOverrides returns the override store of the given key prefix.
func NewOverrides(client redis.UniversalClient, prefix string) *Overrides {
	return &Overrides{client: client, key: prefix + ":overrides"}
}

// Key returns the hash key (also the channel name).
func (s *Overrides) Key() string { return s.key }

// Load implements policy.OverrideStore.
func (s *Overrides) Load(ctx context.Context) (map[string]string, error) {
	m, err := s.client.HGetAll(ctx, s.key).Result()
	if err != nil {
		return nil, fmt.Errorf("read overrides from %s: %w", s.key, err)
	}
	return m, nil
}

// Set implements policy.OverrideStore.
func (s *Overrides) Set(ctx context.Context, rule, value string) error {
	if err := s.client.HSet(ctx, s.key, rule, value).Err(); err != nil {
		return fmt.Errorf("store override in %s: %w", s.key, err)
	}
	// A lost announcement only delays the others until their next re-read.
	_ = s.client.Publish(ctx, s.key, rule).Err()
	return nil
}

// Delete implements policy.OverrideStore.
func (s *Overrides) Delete(ctx context.Context, rule string) error {
	if err := s.client.HDel(ctx, s.key, rule).Err(); err != nil {
		return fmt.Errorf("delete override from %s: %w", s.key, err)
	}
	_ = s.client.Publish(ctx, s.key, rule).Err()
	return nil
}

// retireScript deletes field ARGV[1] of hash KEYS[1] only while it holds
// ARGV[2], and then announces it on the channel of the hash's name: 1 when
// it did.
var retireScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
`)

// Retire implements policy.OverrideStore: one script, so that an override
// renewed by another instance between the read and the delete stays.
func (s *Overrides) Retire(ctx context.Context, rule, value string) error {
	if err := retireScript.Run(ctx, s.client, []string{s.key}, rule, value).Err(); err != nil {
		return fmt.Errorf("retire override from %s: %w", s.key, err)
	}
	return nil
}

// Watch implements policy.OverrideStore with SUBSCRIBE; go-redis resubscribes by
// itself after a reconnect.
func (s *Overrides) Watch(ctx context.Context) <-chan struct{} {
	return watchChannel(ctx, s.client, s.key)
}

// watchChannel subscribes to channel and signals out (one pending signal
// at most) on every message, until ctx ends; go-redis resubscribes by
// itself after a reconnect. A signal means "re-read": what changed is read
// from the store, never from the message.
func watchChannel(ctx context.Context, client redis.UniversalClient, channel string) <-chan struct{} {
	out := make(chan struct{}, 1)
	sub := client.Subscribe(ctx, channel)
	go func() {
		defer sub.Close()
		ch := sub.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-ch:
				if !ok {
					return
				}
				select {
				case out <- struct{}{}:
				default: // a re-read is already pending
				}
			}
		}
	}()
	return out
}

// Shared implements policy.OverrideStore.
func (s *Overrides) Shared() bool { return true }
