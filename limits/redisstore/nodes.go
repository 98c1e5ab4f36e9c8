package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rategate/rategate/internal/tick"
	"github.com/rategate/rategate/limits"

	"github.com/redis/go-redis/v9"
)

// Decisions on Redis Cluster go straight to the primary that owns their
// slot, each primary with its own connections, pipelines and breaker. The
// cluster client's own routing is not used for them, for two reasons:
//
//   - A go-redis cluster pipeline returns only when every node it touches
//     has answered, so one frozen primary held up the decisions of the
//     healthy ones that shared its pipeline.
//   - The cluster client resends a command whose connection died before
//     the reply (it retries on EOF even with MaxRetries off), and a script
//     Redis already ran would run twice.
//
// So the store keeps its own slot map (CLUSTER SLOTS, reloaded on MOVED, on
// node failures and every few seconds) and one plain client per primary
// with go-redis's retries off. It follows MOVED and ASK itself and resends
// only what Redis said it did not run (MOVED, ASK, TRYAGAIN, NOSCRIPT). A
// primary that keeps failing gets its own breaker: its slots' decisions
// fail at once (primaryDown: the limiter answers them by its local
// fallback) while every other slot is decided as usual; once every
// primary's breaker is open, failure_mode answers.

// slotMapReloadEvery is how often the slot map is read again without a
// reason: a failover that no decision noticed is seen within it.
const slotMapReloadEvery = 5 * time.Second

// clusterNode is one primary.
type clusterNode struct {
	addr   string
	client *redis.Client
	co     *coalescer
	gate   *limits.Breaker
}

// clusterNodes is a cluster store's slot map and its primaries.
type clusterNodes struct {
	cc      *redis.ClusterClient
	options func(addr string) *redis.Options
	newCo   func(client *redis.Client) *coalescer
	gateOpt limits.BreakerOptions

	mu     sync.RWMutex
	slots  []*clusterNode // by slot; nil: unknown
	byAddr map[string]*clusterNode
	closed bool

	reloading  atomic.Bool
	lastReload atomic.Int64 // UnixNano of the last reload started
	reloads    atomic.Int64
}

func newClusterNodes(cc *redis.ClusterClient, newCo func(*redis.Client) *coalescer, gate limits.BreakerOptions) *clusterNodes {
	return &clusterNodes{
		cc:      cc,
		options: nodeOptions(cc.Options()),
		newCo:   newCo,
		gateOpt: gate,
		slots:   make([]*clusterNode, NumSlots),
		byAddr:  map[string]*clusterNode{},
	}
}

// nodeOptions derives the options of one primary's client from the
// cluster's: same credentials, TLS (with the node's own server name),
// timeouts and pool, go-redis's retries off.
func nodeOptions(co *redis.ClusterOptions) func(addr string) *redis.Options {
	return func(addr string) *redis.Options {
		o := &redis.Options{
			Addr:                  addr,
			Protocol:              co.Protocol,
			Username:              co.Username,
			Password:              co.Password,
			CredentialsProvider:   co.CredentialsProvider,
			Dialer:                co.Dialer,
			DialTimeout:           co.DialTimeout,
			DialerRetries:         co.DialerRetries,
			ReadTimeout:           co.ReadTimeout,
			WriteTimeout:          co.WriteTimeout,
			ContextTimeoutEnabled: true,
			PoolSize:              co.PoolSize,
			MaxRetries:            noRetries,
		}
		if co.TLSConfig != nil {
			o.TLSConfig = co.TLSConfig.Clone()
			if o.TLSConfig.ServerName == "" {
				if host, _, err := net.SplitHostPort(addr); err == nil {
					o.TLSConfig.ServerName = host
				}
			}
		}
		return o
	}
}

// node returns the primary at addr, creating its client, pipelines and
// breaker on first use.
func (n *clusterNodes) node(addr string) (*clusterNode, error) {
	n.mu.RLock()
	nd := n.byAddr[addr]
	closed := n.closed
	n.mu.RUnlock()
	if closed {
		return nil, errCoalescerClosed
	}
	if nd != nil {
		return nd, nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errCoalescerClosed
	}
	if nd = n.byAddr[addr]; nd != nil {
		return nd, nil
	}
	c := redis.NewClient(n.options(addr))
	nd = &clusterNode{addr: addr, client: c, co: n.newCo(c)}
	nd.gate = limits.NewBreaker(func(ctx context.Context) error { return c.Ping(ctx).Err() }, "redis "+addr, n.gateOpt)
	n.byAddr[addr] = nd
	return nd, nil
}

// forSlot returns the primary that owns slot, reading the slot map first
// when it does not know.
func (n *clusterNodes) forSlot(ctx context.Context, slot int) (*clusterNode, error) {
	n.mu.RLock()
	nd := n.slots[slot]
	n.mu.RUnlock()
	if nd != nil {
		return nd, nil
	}
	if err := n.reload(ctx); err != nil {
		return nil, err
	}
	n.mu.RLock()
	nd = n.slots[slot]
	n.mu.RUnlock()
	if nd == nil {
		return nil, fmt.Errorf("redis cluster: no primary serves slot %d", slot)
	}
	return nd, nil
}

// moved records that slot now lives at addr (a MOVED reply) and returns
// that primary; the whole map is read again in the background.
func (n *clusterNodes) moved(slot int, addr string) (*clusterNode, error) {
	nd, err := n.node(addr)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.slots[slot] = nd
	n.mu.Unlock()
	n.reloadSoon()
	return nd, nil
}

// reload reads CLUSTER SLOTS and rebuilds the slot map.
func (n *clusterNodes) reload(ctx context.Context) error {
	n.lastReload.Store(time.Now().UnixNano())
	n.reloads.Add(1)
	ranges, err := n.cc.ClusterSlots(ctx).Result()
	if err != nil {
		return fmt.Errorf("redis cluster: read the slot map: %w", err)
	}
	next := make([]*clusterNode, NumSlots)
	for _, r := range ranges {
		if len(r.Nodes) == 0 || r.Nodes[0].Addr == "" {
			continue
		}
		nd, err := n.node(r.Nodes[0].Addr)
		if err != nil {
			return err
		}
		for s := max(r.Start, 0); s <= r.End && s < NumSlots; s++ {
			next[s] = nd
		}
	}
	n.mu.Lock()
	n.slots = next
	n.mu.Unlock()
	return nil
}

// reloadSoon reads the slot map again in the background, at most every
// 200 ms, one reload at a time.
func (n *clusterNodes) reloadSoon() {
	if time.Now().UnixNano()-n.lastReload.Load() < int64(200*time.Millisecond) {
		return
	}
	if !n.reloading.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer n.reloading.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = n.reload(ctx)
	}()
}

// run reloads the slot map every slotMapReloadEvery until ctx ends.
func (n *clusterNodes) run(ctx context.Context) {
	tick.Every(ctx, slotMapReloadEvery, func() {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = n.reload(rctx)
		cancel()
	})
}

// allRefusing reports whether every primary known so far has its breaker
// open (or half-open, its trial taken): the cluster decides nothing.
func (n *clusterNodes) allRefusing() bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, nd := range n.byAddr {
		if nd.gate.State() == limits.BreakerClosed {
			return false
		}
	}
	return len(n.byAddr) > 0
}

// all returns every primary known so far.
func (n *clusterNodes) all() []*clusterNode {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out := make([]*clusterNode, 0, len(n.byAddr))
	for _, nd := range n.byAddr {
		out = append(out, nd)
	}
	return out
}

// close stops every primary's pipelines and breaker and closes its client.
func (n *clusterNodes) close() {
	n.mu.Lock()
	n.closed = true
	nodes := n.byAddr
	n.byAddr = map[string]*clusterNode{}
	n.mu.Unlock()
	for _, nd := range nodes {
		nd.co.close()
		nd.gate.Close()
		nd.client.Close()
	}
}

// redirect reads a MOVED or ASK reply: "MOVED 3999 127.0.0.1:6381".
func redirect(err error) (kind string, slot int, addr string, ok bool) {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return "", 0, "", false
	}
	f := strings.Fields(re.Error())
	if len(f) != 3 || (f[0] != "MOVED" && f[0] != "ASK") {
		return "", 0, "", false
	}
	s, perr := strconv.Atoi(f[1])
	if perr != nil {
		return "", 0, "", false
	}
	return f[0], s, f[2], true
}

// notRun reports whether a reply error says Redis did not run the script,
// so that sending it again cannot run it twice: a redirect, or the cluster
// asking to try again.
func notRun(err error) bool {
	if _, _, _, ok := redirect(err); ok {
		return true
	}
	word := errWord(err)
	return word == "TRYAGAIN" || word == "CLUSTERDOWN"
}

// errWord returns the first word of err when it is a reply Redis sent
// ("TRYAGAIN", "CLUSTERDOWN", "NOSCRIPT"...), "" otherwise.
func errWord(err error) string {
	var re redis.Error
	if !errors.As(err, &re) {
		return ""
	}
	word, _, _ := strings.Cut(re.Error(), " ")
	return word
}

// isTryAgain reports whether err is Redis's TRYAGAIN: a multi-key command
// on a slot being migrated whose keys are not all on one side.
func isTryAgain(err error) bool { return errWord(err) == "TRYAGAIN" }

// askingEval runs one call on addr after ASKING (a slot being migrated),
// as one pipeline: ASKING, then EVALSHA (EVAL when the node lacks the
// script).
func askingEval(ctx context.Context, nd *clusterNode, script *redis.Script, call *scriptCall) (any, error) {
	for attempt := 0; attempt < 2; attempt++ {
		pipe := nd.client.Pipeline()
		pipe.Do(ctx, "asking")
		var cmd *redis.Cmd
		if attempt == 0 {
			cmd = script.EvalSha(ctx, pipe, call.keys, call.args...)
		} else {
			cmd = script.Eval(ctx, pipe, call.keys, call.args...)
		}
		_, _ = pipe.Exec(ctx)
		if attempt == 0 && isNoScript(cmd.Err()) {
			continue
		}
		return cmd.Result()
	}
	return nil, errors.New("redis cluster: ASK: unreachable")
}

// runOnce runs script on keys (one slot) at most once, as decisions are
// run: through the store's client on a single server or Sentinel (go-redis
// retries off), and on Redis Cluster through the slot's primary's own
// client, following MOVED, ASK and TRYAGAIN itself and sending again only
// what Redis said it did not run. (The cluster client would resend a
// script whose connection died after Redis ran it.) For scripts that
// commit outside the coalesced decisions: lease takes and returns.
func (s *Store) runOnce(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	if s.nodes == nil {
		return script.Run(ctx, s.client, keys, args...).Result()
	}
	slot := KeySlot(keys[0])
	nd, err := s.nodes.forSlot(ctx, slot)
	for attempt := 0; err == nil; attempt++ {
		var reply any
		reply, err = script.Run(ctx, nd.client, keys, args...).Result()
		if err == nil || !notRun(err) || attempt >= 4 || ctx.Err() != nil {
			if err != nil && IsStoreFailure(err) {
				s.nodes.reloadSoon()
			}
			return reply, err
		}
		var ask bool
		if nd, ask, err = s.nodes.next(ctx, slot, attempt, err); err == nil && ask {
			return askingEval(ctx, nd, script, &scriptCall{keys: keys, args: args})
		}
	}
	return nil, err
}

// next is where a call on slot goes after Redis said it did not run it
// (notRun(err)), at its attempt-th try: the ASK target (ask true: send it
// there after ASKING, once), the slot's new primary after MOVED, or, after
// TRYAGAIN or CLUSTERDOWN and a short wait, the slot's primary as the map
// now says; an error when there is none, or ctx ended while waiting.
func (n *clusterNodes) next(ctx context.Context, slot, attempt int, err error) (nd *clusterNode, ask bool, _ error) {
	kind, _, addr, isRedirect := redirect(err)
	switch {
	case isRedirect && kind == "ASK":
		nd, err = n.node(addr)
		return nd, err == nil, err
	case isRedirect:
		nd, err = n.moved(slot, addr)
		return nd, false, err
	}
	// TRYAGAIN (a slot mid-migration), CLUSTERDOWN: wait a little.
	n.reloadSoon()
	select {
	case <-ctx.Done():
		return nil, false, err
	case <-time.After(time.Duration(attempt+1) * 10 * time.Millisecond):
	}
	nd, err = n.forSlot(ctx, slot)
	return nd, false, err
}
