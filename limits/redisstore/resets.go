package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rategate/rategate/limits"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// Resets carries key resets between rategate instances, so that a key
// reset through one instance's admin API, or a refund that gave units back
// to a key, is also forgotten by every other instance's deny cache
// (DenyCache): it publishes the key on the pub/sub channel <prefix>:resets
// and applies what it hears there.
//
// A message published while an instance's subscription is down is lost, so
// whenever the subscription is (re)established the instance clears its
// whole deny cache: it cannot know which resets it missed. go-redis pings
// the subscription every few seconds and resubscribes after a reconnect.
// A message that cannot be published (the node stalls, the queue of
// announcements overflows) is not dropped either: the publisher sends
// clearAll instead, retried until it is out, and every instance clears its
// cache. So a cached denial a reset or a refund undid outlives it by the
// announcement's delay, never until its own retry time.
type Resets struct {
	client  redis.UniversalClient
	channel string
	cache   *limits.DenyCache
	log     zerolog.Logger

	readyOnce sync.Once
	ready     chan struct{} // closed at the first subscription

	// pending holds the keys Announce queued for the publisher.
	pending chan string
	// escalated counts the times an announcement failed or did not fit in
	// pending; the publisher sends clearAll until it has covered them all.
	escalated atomic.Uint64
	wake      chan struct{}
	// sent counts the keys published, clears the clearAll messages
	// published (ResetStats)
	sent, clears atomic.Uint64
	// stopped is set when the publisher flushes at its end (Announce then
	// publishes itself)
	stopped atomic.Bool
}

// ResetStats counts what the publisher did: keys announced, announcements
// that could not be sent or queued (each made the publisher send
// clearAll), and clearAll messages sent.
type ResetStats struct{ Sent, Failed, Clears uint64 }

// Stats returns the publisher's counts so far.
func (r *Resets) Stats() ResetStats {
	return ResetStats{Sent: r.sent.Load(), Failed: r.escalated.Load(), Clears: r.clears.Load()}
}

// clearAll is the message that makes every instance clear its deny cache:
// no store key is "*" (every key starts with the prefix).
const clearAll = "*"

// maxPendingAnnouncements bounds the announcements queued for the
// publisher; past it, one clearAll stands for them all.
const maxPendingAnnouncements = 4096

// publishTimeout bounds one PUBLISH.
const publishTimeout = time.Second

// NewResets returns the reset channel of the given key prefix for
// cache, and makes cache announce its key resets through it. Run must run
// for the instance to hear the others and to publish what Announce queues.
func NewResets(client redis.UniversalClient, prefix string, cache *limits.DenyCache, log zerolog.Logger) *Resets {
	r := &Resets{client: client, channel: prefix + ":resets", cache: cache, log: log, ready: make(chan struct{}),
		pending: make(chan string, maxPendingAnnouncements), wake: make(chan struct{}, 1)}
	cache.SetAnnouncer(r)
	return r
}

// Ready is closed once the first subscription is in place.
func (r *Resets) Ready() <-chan struct{} { return r.ready }

// AnnounceReset implements ResetAnnouncer: PUBLISH <prefix>:resets key, now.
// When that fails the key is handed to the publisher (Announce) and the
// error returned, for a log line. The publishing instance hears its own
// message too; forgetting twice is harmless.
func (r *Resets) AnnounceReset(ctx context.Context, key string) error {
	if err := r.publish(ctx, key); err != nil {
		r.Announce(key)
		return fmt.Errorf("announce reset on %s (left to the background): %w", r.channel, err)
	}
	r.sent.Add(1)
	return nil
}

// Announce queues key for the publisher, without waiting: the refund path
// calls it from a request. Once the publisher has stopped (the instance is
// shutting down, its last refunds still landing) it publishes at once.
func (r *Resets) Announce(key string) {
	if r.stopped.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
		defer cancel()
		if r.publish(ctx, key) == nil {
			r.sent.Add(1)
		} else {
			r.escalated.Add(1)
		}
		return
	}
	select {
	case r.pending <- key:
	default:
		r.escalate()
	}
}

// escalate makes the publisher send clearAll.
func (r *Resets) escalate() {
	r.escalated.Add(1)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// publish sends msgs on the channel, in one round trip (a pipeline of
// PUBLISH). On a cluster they go to the primary of the channel's slot,
// where every instance's subscription is (go-redis subscribes there): a
// keyless PUBLISH goes to any primary in turn, and a stalled one it
// happened to pick lost the message.
func (r *Resets) publish(ctx context.Context, msgs ...string) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	var c redis.Cmdable = r.client
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, r.channel)
		if err != nil {
			return err
		}
		c = node
	}
	if len(msgs) == 1 {
		return c.Publish(ctx, r.channel, msgs[0]).Err()
	}
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, m := range msgs {
			p.Publish(ctx, r.channel, m)
		}
		return nil
	})
	return err
}

// runPublisher publishes what Announce queued until ctx ends. A failed
// announcement turns into clearAll, sent with growing pauses (50ms to 2s)
// until it is out; it also stands for every key queued meanwhile.
func (r *Resets) runPublisher(ctx context.Context) {
	var keys []string
	var covered uint64 // escalations a published clearAll covered
	pause := 50 * time.Millisecond
	warned := false
	for {
		if esc := r.escalated.Load(); esc != covered {
			for len(r.pending) > 0 { // covered by the clearAll
				<-r.pending
			}
			if err := r.publish(ctx, clearAll); err != nil {
				if !warned {
					warned = true
					r.log.Warn().Err(err).Str("channel", r.channel).
						Msg("cannot announce key resets to the other instances; retrying with a message that clears every instance's deny cache")
				}
				select {
				case <-ctx.Done():
					r.flush(nil, covered)
					return
				case <-time.After(pause):
				}
				pause = min(2*pause, 2*time.Second)
				continue
			}
			covered, pause, warned = esc, 50*time.Millisecond, false
			r.clears.Add(1)
			r.log.Info().Str("channel", r.channel).Msg("announced a deny cache clear to every instance in place of key resets that could not be sent")
			continue
		}
		select {
		case <-ctx.Done():
			r.flush(nil, covered)
			return
		case <-r.wake:
		case key := <-r.pending:
			// What queued meanwhile goes in the same round trip: one at a
			// time, a key behind a burst of refunds would wait a round
			// trip per key before it (4 s behind a full queue at 1 ms).
			keys = append(keys[:0], key)
			for len(keys) < maxBatchAnnouncements && len(r.pending) > 0 {
				keys = append(keys, <-r.pending)
			}
			if err := r.publish(ctx, keys...); err != nil {
				if ctx.Err() != nil {
					r.flush(keys, covered) // cut short by the shutdown
					return
				}
				r.escalate()
			} else {
				r.sent.Add(uint64(len(keys)))
			}
		}
	}
}

// flushTimeout bounds what the publisher still sends at its end.
const flushTimeout = 2 * time.Second

// flush sends, as the publisher ends (the instance shuts down, as on every
// rolling deploy), what it has not sent: unsent (a batch the shutdown cut
// short) and the keys queued, or clearAll when an announcement failed
// since the last one was sent; within flushTimeout. Dropped, they would
// leave the other instances denying those identities until their retry
// while Redis admits them. Afterwards Announce publishes by itself.
func (r *Resets) flush(unsent []string, covered uint64) {
	r.stopped.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	keys := append([]string(nil), unsent...)
	for range 2 { // again for what was queued as stopped was set
		for len(r.pending) > 0 {
			keys = append(keys, <-r.pending)
		}
		if r.escalated.Load() != covered {
			if r.publish(ctx, clearAll) == nil {
				r.clears.Add(1)
				covered = r.escalated.Load()
			}
			keys = keys[:0] // covered by the clear (or lost with it)
			continue
		}
		for len(keys) > 0 {
			n := min(len(keys), maxBatchAnnouncements)
			if err := r.publish(ctx, keys[:n]...); err != nil {
				r.escalated.Add(1) // what this run could not send: the second turn tries clearAll
				break
			}
			r.sent.Add(uint64(n))
			keys = keys[n:]
		}
		keys = keys[:0]
	}
}

// maxBatchAnnouncements bounds the keys one round trip publishes.
const maxBatchAnnouncements = 512

// Run subscribes to the channel and applies the resets it hears until ctx
// ends: each message forgets one key (clearAll: every key); each
// (re)subscription clears the cache. It also runs the publisher. It
// returns when ctx ends.
func (r *Resets) Run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	defer func() { cancel(); <-done }()
	go func() {
		defer close(done)
		r.runPublisher(ctx)
	}()
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
				if m.Payload == clearAll {
					r.cache.Clear()
				} else {
					r.cache.Forget(m.Payload)
				}
			}
		}
	}
}
