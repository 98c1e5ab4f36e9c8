package redisstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/rategate/rategate/limits"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// Resets carries key resets between rategate instances, so that a key
// reset through one instance's admin API is also forgotten by every other
// instance's deny cache (DenyCache): it publishes the reset key on the
// pub/sub channel <prefix>:resets and applies what it hears there.
//
// A message published while an instance's subscription is down is lost, so
// whenever the subscription is (re)established the instance clears its
// whole deny cache: it cannot know which resets it missed. go-redis pings
// the subscription every few seconds and resubscribes after a reconnect.
type Resets struct {
	client  redis.UniversalClient
	channel string
	cache   *limits.DenyCache
	log     zerolog.Logger

	readyOnce sync.Once
	ready     chan struct{} // closed at the first subscription
}

// NewResets returns the reset channel of the given key prefix for
// cache, and makes cache announce its key resets through it. Run must run
// for the instance to hear the others.
func NewResets(client redis.UniversalClient, prefix string, cache *limits.DenyCache, log zerolog.Logger) *Resets {
	r := &Resets{client: client, channel: prefix + ":resets", cache: cache, log: log, ready: make(chan struct{})}
	cache.SetAnnouncer(r)
	return r
}

// Ready is closed once the first subscription is in place.
func (r *Resets) Ready() <-chan struct{} { return r.ready }

// AnnounceReset implements ResetAnnouncer: PUBLISH <prefix>:resets key.
// The publishing instance hears its own message too; forgetting twice is harmless.
func (r *Resets) AnnounceReset(ctx context.Context, key string) error {
	if err := r.client.Publish(ctx, r.channel, key).Err(); err != nil {
		return fmt.Errorf("announce reset on %s: %w", r.channel, err)
	}
	return nil
}

// Run subscribes to the channel and applies the resets it hears until ctx
// ends: each message forgets one key; each (re)subscription clears the
// cache. It returns when ctx ends.
func (r *Resets) Run(ctx context.Context) {
	sub := r.client.Subscribe(ctx, r.channel)
	defer sub.Close()
	ch := sub.ChannelWithSubscriptions()
	subscribed := false
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind != "subscribe" {
					continue
				}
				// Resets published while we were not listening are lost.
				r.cache.Clear()
				if subscribed {
					r.log.Info().Str("channel", r.channel).Msg("key reset channel resubscribed; deny cache cleared in case a reset was missed")
				}
				subscribed = true
				r.readyOnce.Do(func() { close(r.ready) })
			case *redis.Message:
				r.cache.Forget(m.Payload)
			}
		}
	}
}
