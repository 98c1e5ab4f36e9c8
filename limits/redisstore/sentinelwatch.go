package redisstore

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/tick"
)

// go-redis follows a Sentinel switch through one subscription to
// +switch-master, on one sentinel: the first that answered. With that
// sentinel down (one of three: the others still have their quorum and fail
// over) the switch is never heard, and the client goes on writing to the
// old primary until the sentinels demote it (about 10 s), whose writes are
// then thrown away: a planned failover lost 13 s of admitted decisions
// instead of about one. go-redis only asks the sentinels again when it
// dials, and then switches (closing its connections to the old primary).
//
// So the store asks every sentinel itself, every sentinelWatchInterval.
// When one of them names a primary other than the one it named before, it
// makes the client dial once (a pub/sub connection, closed at once), which
// asks the sentinels and switches if they say so (a dial to the same
// primary changes nothing); again at every look for 10 s, in case the
// sentinel the client asks was behind the one that answered.

// sentinelWatchInterval is how often the store asks the sentinels.
const sentinelWatchInterval = 500 * time.Millisecond

// sentinelSwitchNudges is how many looks in a row dial after a change:
// 10 s of them. The sentinel go-redis asks (the first that answers) may
// name the old primary for a few seconds more than the one that saw the
// change first (sentinels learn a switch from each other's hello
// messages, every 2 s; longer on a loaded machine), and a dial then
// changes nothing; by 10 s the old primary is demoted, and a write to it
// fails and redials anyway.
const sentinelSwitchNudges = 20

type sentinelWatch struct {
	client    *redis.Client
	master    string
	sentinels []*redis.SentinelClient
	// named is the primary each sentinel named at its last answer.
	named  []string
	nudges int
	onNew  func(addr string)
}

func newSentinelWatch(client *redis.Client, fo *redis.FailoverOptions, onNew func(string)) *sentinelWatch {
	w := &sentinelWatch{client: client, master: fo.MasterName, onNew: onNew, named: make([]string, len(fo.SentinelAddrs))}
	for _, a := range fo.SentinelAddrs {
		w.sentinels = append(w.sentinels, redis.NewSentinelClient(&redis.Options{
			Addr: a, Username: fo.SentinelUsername, Password: fo.SentinelPassword,
			TLSConfig: fo.TLSConfig, Dialer: fo.Dialer, PoolSize: 1, MaxRetries: noRetries,
			DialTimeout: sentinelWatchInterval, ReadTimeout: sentinelWatchInterval, WriteTimeout: sentinelWatchInterval,
		}))
	}
	return w
}

// run looks every sentinelWatchInterval until ctx ends, then closes the
// sentinel clients.
func (w *sentinelWatch) run(ctx context.Context) {
	defer w.close()
	tick.Every(ctx, sentinelWatchInterval, func() { w.look(ctx) })
}

func (w *sentinelWatch) close() {
	for _, sc := range w.sentinels {
		sc.Close()
	}
}

// look asks the sentinels once and nudges the client after a change.
func (w *sentinelWatch) look(ctx context.Context) {
	askCtx, cancel := context.WithTimeout(ctx, sentinelWatchInterval)
	names := make([]string, len(w.sentinels))
	var wg sync.WaitGroup
	for i, sc := range w.sentinels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := sc.GetMasterAddrByName(askCtx, w.master).Result(); err == nil && len(v) == 2 {
				names[i] = net.JoinHostPort(v[0], v[1])
			}
		}()
	}
	wg.Wait()
	cancel()
	for i, n := range names {
		if n == "" {
			continue
		}
		if w.named[i] != "" && n != w.named[i] {
			if w.nudges == 0 && w.onNew != nil {
				w.onNew(n)
			}
			w.nudges = sentinelSwitchNudges
		}
		w.named[i] = n
	}
	if w.nudges > 0 {
		w.nudges--
		w.nudge(ctx)
	}
}

// nudge makes the client dial: go-redis's dialer asks the sentinels for
// the primary and, when it changed, closes the connections to the old one.
func (w *sentinelWatch) nudge(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*sentinelWatchInterval)
	defer cancel()
	ps := w.client.Subscribe(ctx)
	_ = ps.Ping(ctx)
	_ = ps.Close()
}
