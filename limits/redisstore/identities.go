package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/lua"
)

// Identities keeps the runtime identity overrides of every rule in
// one hash, <prefix>:{identities} (field "<rule> <identity>", the identity
// as KeyIdentity spells it, value the override's JSON), bounded by the cap
// every set checks. Each change runs lua/identities.lua, which also bumps
// the counter <prefix>:{identities}:version and publishes the change on
// <prefix>:identities, so that every instance applies it as a delta and
// can tell from the counter whether it missed one. The hash tag keeps the
// hash and the counter in one slot on Redis Cluster.
type Identities struct {
	client  redis.UniversalClient
	hash    string
	counter string
	channel string
}

// NewIdentities returns the identity override store of the given key prefix.
func NewIdentities(client redis.UniversalClient, prefix string) *Identities {
	return &Identities{
		client:  client,
		hash:    prefix + ":{identities}",
		counter: prefix + ":{identities}:version",
		channel: prefix + ":identities",
	}
}

// Keys returns the hash, the counter and the channel.
func (s *Identities) Keys() (hash, counter, channel string) { return s.hash, s.counter, s.channel }

// identityScanCount is the HSCAN batch of a full read: a 100,000-entry hash
// is read in 100 steps, none of which keeps Redis busy for long.
const identityScanCount = 1000

// Load reads every stored identity override (rule → identity → JSON) and
// the counter, read first: every change up to it is in what Load returns,
// and a later one is announced after it.
func (s *Identities) Load(ctx context.Context) (uint64, map[string]map[string]string, error) {
	v, err := s.Version(ctx)
	if err != nil {
		return 0, nil, err
	}
	all := map[string]map[string]string{}
	var cursor uint64
	for {
		kvs, next, err := s.client.HScan(ctx, s.hash, cursor, "", identityScanCount).Result()
		if err != nil {
			return 0, nil, fmt.Errorf("read identity overrides from %s: %w", s.hash, err)
		}
		for i := 0; i+1 < len(kvs); i += 2 {
			rule, id, ok := strings.Cut(kvs[i], " ")
			if !ok {
				continue // not ours
			}
			m := all[rule]
			if m == nil {
				m = map[string]string{}
				all[rule] = m
			}
			m[id] = kvs[i+1]
		}
		if next == 0 {
			return v, all, nil
		}
		cursor = next
	}
}

// Version returns the change counter (0 when no change was ever stored, or
// Redis lost it).
func (s *Identities) Version(ctx context.Context) (uint64, error) {
	v, err := s.client.Get(ctx, s.counter).Uint64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", s.counter, err)
	}
	return v, nil
}

// Set stores one override, refused with *limits.IdentityCapError when it is new
// and max are stored already. It returns the counter after the change.
func (s *Identities) Set(ctx context.Context, rule, id, value string, max int) (uint64, error) {
	if value == "" {
		return 0, errors.New("an identity override cannot be empty")
	}
	status, v, err := s.run(ctx, rule, id, value, strconv.Itoa(max))
	if err != nil {
		return 0, err
	}
	if status < 0 {
		return v, &limits.IdentityCapError{Max: max}
	}
	return v, nil
}

// Delete removes one override; with expect != "" only while it still holds
// expect. changed is false when nothing was removed.
func (s *Identities) Delete(ctx context.Context, rule, id, expect string) (version uint64, changed bool, err error) {
	status, v, err := s.run(ctx, rule, id, "", expect)
	return v, status > 0, err
}

// run calls identities.lua and checks its reply: {status, version}.
func (s *Identities) run(ctx context.Context, rule, id, value, arg string) (status int64, version uint64, err error) {
	res, err := lua.IdentitiesScript.Run(ctx, s.client, []string{s.hash, s.counter},
		s.channel, rule+" "+id, value, arg).Result()
	if err != nil {
		return 0, 0, fmt.Errorf("change identity override in %s: %w", s.hash, err)
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != 2 {
		return 0, 0, fmt.Errorf("identities.lua: unexpected reply %v", res)
	}
	st, ok1 := arr[0].(int64)
	ver, ok2 := arr[1].(int64)
	if !ok1 || !ok2 || st < -1 || st > 1 || ver < 0 {
		return 0, 0, fmt.Errorf("identities.lua: unexpected reply %v", res)
	}
	return st, uint64(ver), nil
}

// identityWatchBuffer bounds the changes queued for the listener; past it
// the subscription waits, and go-redis drops what it cannot hand over,
// which the listener notices as a gap in the versions.
const identityWatchBuffer = 4096

// Watch subscribes to the channel and delivers every change it hears, in
// order, plus a Resync at every (re)subscription, until ctx ends. go-redis
// resubscribes by itself after a reconnect.
func (s *Identities) Watch(ctx context.Context) <-chan limits.IdentityChange {
	out := make(chan limits.IdentityChange, identityWatchBuffer)
	sub := s.client.Subscribe(ctx, s.channel)
	go func() {
		defer close(out)
		defer sub.Close()
		ch := sub.ChannelWithSubscriptions(redis.WithChannelSize(identityWatchBuffer))
		for {
			var c limits.IdentityChange
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
					c.Resync = true
				case *redis.Message:
					var ok bool
					if c, ok = parseIdentityChange(m.Payload); !ok {
						continue // not ours; a real gap shows in the versions
					}
				default:
					continue
				}
			}
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// parseIdentityChange reads "<version>\n<rule> <identity>\n<value>".
func parseIdentityChange(p string) (limits.IdentityChange, bool) {
	ver, rest, ok := strings.Cut(p, "\n")
	if !ok {
		return limits.IdentityChange{}, false
	}
	field, value, ok := strings.Cut(rest, "\n")
	if !ok {
		return limits.IdentityChange{}, false
	}
	rule, id, ok := strings.Cut(field, " ")
	if !ok {
		return limits.IdentityChange{}, false
	}
	v, err := strconv.ParseUint(ver, 10, 64)
	if err != nil {
		return limits.IdentityChange{}, false
	}
	return limits.IdentityChange{Version: v, Rule: rule, ID: id, Value: value}, true
}

// Shared reports that every instance sees these overrides.
func (s *Identities) Shared() bool { return true }
