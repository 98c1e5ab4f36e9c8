// Package redisstore is the Redis store: one server, Sentinel or Redis
// Cluster (per-primary routing, cross-slot commits and refunds), decisions
// coalesced into pipelines of the scripts in package lua, late replies and
// their refunds, readiness, INFO, and the Redis-backed shared state of the
// admin side (overrides, resets, top sketches, the data-loss epoch).
package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rategate/rategate/limits"
	"github.com/rs/zerolog"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/lua"
)

// Client is what the Redis store needs from go-redis: scripts, plus
// PING and DEL for readiness and resets. *redis.Client (plain or Sentinel
// failover), *redis.ClusterClient and redis.UniversalClient all satisfy it.
type Client interface {
	redis.Scripter
	loader
	Ping(ctx context.Context) *redis.StatusCmd
	Del(ctx context.Context, keys ...string) *redis.IntCmd
	Pipeline() redis.Pipeliner
	Process(ctx context.Context, cmd redis.Cmder) error
	Close() error
}

// Topology is how the Redis store reaches Redis.
type Topology string

// The three topologies. A store's behaviour differs only where it must: on
// a cluster, a request whose rules live in several hash slots is decided one
// slot at a time (see cluster.go); readiness checks every primary.
const (
	Standalone Topology = "standalone"
	Cluster    Topology = "cluster"
	Sentinel   Topology = "sentinel"
)

// Store decides batches with the multi-rule script (lua/decide.lua):
// one EVALSHA per request on a single Redis or a Sentinel-managed primary
// (EVAL when Redis answers NOSCRIPT, e.g. after a restart or failover), one
// per hash slot on Redis Cluster, sent to the slot's primary. Concurrent
// decisions share pipelines (coalesce.go) unless that is turned off. A
// decision is never sent twice unless Redis said it did not run it, and
// one whose caller gave up before the reply came is given back if it
// committed (lateReply).
type Store struct {
	client   Client
	topology Topology
	script   *redis.Script
	// refund undoes commits: those of slots that admitted a request
	// another slot denied (cluster), and those whose caller gave up before
	// their reply arrived (lua/refund.lua).
	refund *redis.Script
	// name describes the store; Ping refreshes it with what it learnt
	// (the primaries of a cluster, the current Sentinel primary).
	name atomic.Pointer[string]
	// master is the Sentinel master name (Sentinel only).
	master string
	bg     background
	coOpt  CoalesceOptions
	log    atomic.Pointer[zerolog.Logger]
	// co runs the script runs of a single server (standalone, Sentinel);
	// nodes those of a cluster, one coalescer per primary.
	co    *coalescer
	nodes *clusterNodes
	late  lateStats
	// refunded, when set, is told each key a refund gave units back to
	// (OnRefund).
	refunded atomic.Pointer[func(ctx context.Context, key string)]
	// denied: the keys denied lately (a cluster's slot order).
	denied recentDenials
}

// OnRefund makes the store call f with each key a refund gave units back
// to, once it has: the refund of a cluster decision that one slot denied
// after others admitted, and the late refund of a decision whose caller
// gave up. A denial Redis made between the commit and its refund counted
// units that are back now, so whoever cached it (the deny cache, on every
// instance) must forget it. f must not wait: it may run on a request's
// path (Resets.Announce queues).
func (s *Store) OnRefund(f func(ctx context.Context, key string)) {
	s.refunded.Store(&f)
}

// announceRefund tells OnRefund's f the keys j gave units back to.
func (s *Store) announceRefund(ctx context.Context, j *refundJob) {
	if f := s.refunded.Load(); f != nil {
		for _, key := range j.refunded() {
			(*f)(ctx, key)
		}
	}
}

// lateStats counts the calls whose caller gave up before their reply.
type lateStats struct {
	// refunded: the reply came, it had committed, and a refund was
	// started (its outcome is counted with the refunds); clean: the reply
	// came and had committed nothing (denied, or never sent); unknown: no
	// reply came within the late grace, so the call may have committed.
	refunded, clean, unknown atomic.Int64
}

// LateCounts counts the decisions whose caller gave up before Redis
// answered them.
type LateCounts struct {
	// Refunded had committed and were given back (see Refunds for how
	// the refunds went); Clean had committed nothing; Unknown never got a
	// reply within the late grace: they may hold units until their
	// window or bucket passes (stricter than exact, never looser).
	Refunded, Clean, Unknown int64
}

// Late returns the store's late-reply counters.
func (s *Store) Late() LateCounts {
	return LateCounts{Refunded: s.late.refunded.Load(), Clean: s.late.clean.Load(), Unknown: s.late.unknown.Load()}
}

// New returns a store over client; name describes it in logs. A
// *redis.ClusterClient is used as a cluster; anything else as one Redis
// (a Sentinel failover client included; Open names it as such).
// Decisions are coalesced into pipelines with the default options, or with
// co when given.
func New(client Client, name string, co ...CoalesceOptions) (*Store, error) {
	topo := Standalone
	if _, ok := client.(*redis.ClusterClient); ok {
		topo = Cluster
	}
	var o CoalesceOptions
	if len(co) > 0 {
		o = co[0]
	}
	return newRedisStore(client, topo, name, o, nil)
}

// starved is Options.Starved.
func newRedisStore(client Client, topo Topology, name string, co CoalesceOptions, starved func() bool) (*Store, error) {
	s := &Store{client: client, topology: topo, script: lua.DecideScript, refund: lua.RefundScript, coOpt: co}
	s.bg.init()
	s.name.Store(&name)
	nop := zerolog.Nop()
	s.log.Store(&nop)
	newCo := func(p pipeliner, server func() string, many bool) *coalescer {
		fn := newFunctions(co.EvalOnly, func(err error) { s.functionsUnavailable(server(), err) })
		return newCoalescer(s.bg.ctx, p, s.script, fn, co, many, s.lateReply)
	}
	if cc, ok := client.(*redis.ClusterClient); ok && topo == Cluster {
		// A cluster node's pipeline holds keys of many slots, and one
		// call's keys must share one: one call per decision there.
		s.nodes = newClusterNodes(cc, func(c *redis.Client) *coalescer {
			addr := c.Options().Addr
			return newCo(c, func() string { return "redis " + addr }, false)
		}, limits.BreakerOptions{
			ProbeTimeout: co.withDefaults().Budget, IsFailure: IsStoreFailure, Starved: starved, IsTimeout: IsTimeout,
		})
		s.bg.goRun(s.nodes.run)
	} else {
		s.co = newCo(client, s.Name, true)
	}
	return s, nil
}

// functionsUnavailable logs, once per server, that it decides with
// EVALSHA because it would not run rategate's function library.
func (s *Store) functionsUnavailable(server string, err error) {
	s.log.Load().Warn().Err(err).Str("store", server).
		Msg("Redis Functions are not available on this server (Redis >= 7.0 with FCALL and FUNCTION LOAD allowed by the ACL); deciding with EVALSHA, which costs Redis more per decision")
}

// SetLogger sets the logger the store reports to (zerolog.Nop until then).
func (s *Store) SetLogger(log zerolog.Logger) { s.log.Store(&log) }

// Options says how to reach Redis: exactly one of URL, ClusterAddrs and
// SentinelMaster. The other fields apply to whichever is used, unless the URL
// already sets them.
type Options struct {
	// URL is redis://[user:pass@]host:port/db or rediss://… (TLS). go-redis's
	// multi-node forms select the other topologies:
	//   redis://h1:7000?addr=h2:7000&addr=h3:7000           Redis Cluster (seed nodes)
	//   redis://[suser:spass@]s1:26379?addr=s2:26379&master_name=mymaster&password=p
	//                                                       Sentinel (sentinel addresses)
	URL string
	// ClusterAddrs are Redis Cluster seed nodes, host:port.
	ClusterAddrs []string
	// SentinelMaster is the name the sentinels monitor; SentinelAddrs are
	// the sentinels. SentinelUsername and SentinelPassword authenticate to
	// the sentinels themselves.
	SentinelMaster   string
	SentinelAddrs    []string
	SentinelUsername string
	SentinelPassword string
	// Username and Password authenticate to the Redis servers (ACL user or
	// requirepass).
	Username string
	Password string
	// TLS, when not nil, encrypts every connection (servers and sentinels).
	TLS *tls.Config
	// Dialer, when set, opens every connection (tests put a fault-injecting
	// proxy in between with it).
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
	// Coalesce says how concurrent decisions share pipelines.
	Coalesce CoalesceOptions
	// Starved is given to each Redis Cluster primary's breaker
	// (limits.BreakerOptions.Starved); nil: none.
	Starved func() bool
}

// Open connects a Redis store of the topology o describes. It does not
// wait for Redis: a store whose Redis is down answers errors until it is up.
// Every call honours its context's deadline (ContextTimeoutEnabled), cluster
// redirections and retries included.
func Open(o Options) (*Store, error) {
	switch {
	case o.URL != "":
		return openRedisURL(o)
	case len(o.ClusterAddrs) > 0:
		return openCluster(&redis.ClusterOptions{Addrs: o.ClusterAddrs}, o,
			"redis cluster via "+strings.Join(o.ClusterAddrs, ","))
	case o.SentinelMaster != "":
		return openSentinel(&redis.FailoverOptions{MasterName: o.SentinelMaster, SentinelAddrs: o.SentinelAddrs}, o)
	}
	return nil, errors.New("redis: no url, cluster_addrs or sentinel master given")
}

// openRedisURL picks the parser by the URL's query: master_name= is a
// Sentinel URL, addr= (more nodes) a cluster URL, anything else one server.
func openRedisURL(o Options) (*Store, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", redactURLError(err))
	}
	q := u.Query()
	switch {
	case q.Has("master_name"):
		fo, err := redis.ParseFailoverURL(o.URL)
		if err != nil {
			return nil, fmt.Errorf("redis sentinel url: %w", err)
		}
		return openSentinel(fo, o)
	case q.Has("addr"):
		co, err := redis.ParseClusterURL(o.URL)
		if err != nil {
			return nil, fmt.Errorf("redis cluster url: %w", err)
		}
		return openCluster(co, o, "redis cluster via "+strings.Join(co.Addrs, ","))
	}
	opt, err := redis.ParseURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	o.Coalesce = o.shared(clientFields{&opt.Username, &opt.Password, &opt.TLSConfig, &opt.Dialer,
		&opt.ContextTimeoutEnabled, &opt.PoolSize, &opt.MaxRetries})
	client := redis.NewClient(opt)
	s, err := newRedisStore(client, Standalone, "redis "+opt.Addr, o.Coalesce, o.Starved)
	if err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

func openCluster(co *redis.ClusterOptions, o Options, name string) (*Store, error) {
	o.Coalesce = o.shared(clientFields{&co.Username, &co.Password, &co.TLSConfig, &co.Dialer,
		&co.ContextTimeoutEnabled, &co.PoolSize, &co.MaxRetries})
	// Writes go to primaries only: a replica's counter may lag.
	co.ReadOnly, co.RouteByLatency, co.RouteRandomly = false, false, false
	if co.DialerRetries == 0 {
		// One dial per attempt: a dead node refuses at once, and loading
		// the slot map (which tries known nodes in random order, a dead
		// primary among them after a failover) must move on to the next
		// node instead of retrying the dead one until the deadline.
		co.DialerRetries = 1
	}
	client := redis.NewClusterClient(co)
	s, err := newRedisStore(client, Cluster, name, o.Coalesce, o.Starved)
	if err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

func openSentinel(fo *redis.FailoverOptions, o Options) (*Store, error) {
	fo.SentinelUsername = firstNonEmpty(fo.SentinelUsername, o.SentinelUsername)
	fo.SentinelPassword = firstNonEmpty(fo.SentinelPassword, o.SentinelPassword)
	o.Coalesce = o.shared(clientFields{&fo.Username, &fo.Password, &fo.TLSConfig, &fo.Dialer,
		&fo.ContextTimeoutEnabled, &fo.PoolSize, &fo.MaxRetries})
	fo.ReplicaOnly, fo.RouteByLatency, fo.RouteRandomly = false, false, false
	client := redis.NewFailoverClient(fo)
	s, err := newRedisStore(client, Sentinel, fmt.Sprintf("redis sentinel %s via %s", fo.MasterName, strings.Join(fo.SentinelAddrs, ",")), o.Coalesce, o.Starved)
	if err != nil {
		client.Close()
		return nil, err
	}
	s.master = fo.MasterName
	w := newSentinelWatch(client, fo, func(addr string) {
		s.log.Load().Info().Str("master", fo.MasterName).Str("primary", addr).Msg("the sentinels name a new primary; following it")
	})
	if !s.bg.goRun(w.run) {
		w.close()
	}
	return s, nil
}

// noRetries turns off go-redis's own resending. A decision is not
// idempotent: go-redis resends a command whose connection died before the
// reply (EOF), and a script Redis already ran would then run twice and
// commit twice. A failed decision is instead decided by the limiter's
// fallback; the store never sends a decision again unless Redis said it
// did not run it (NOSCRIPT, MOVED, ASK, TRYAGAIN).
const noRetries = -1

// clientFields are the go-redis option fields every topology (Options,
// ClusterOptions, FailoverOptions) sets the same way.
type clientFields struct {
	username, password *string
	tls                **tls.Config
	dialer             *func(ctx context.Context, network, addr string) (net.Conn, error)
	contextTimeout     *bool
	poolSize           *int
	maxRetries         *int
}

// shared fills f from o: credentials and TLS where the URL gave none, the
// test dialer, deadlines from the context, the pool sized for the
// pipelines, no go-redis retries (see noRetries). It returns o's coalescing
// options, with one runner per connection when coalescing is off.
func (o Options) shared(f clientFields) CoalesceOptions {
	*f.username = firstNonEmpty(*f.username, o.Username)
	*f.password = firstNonEmpty(*f.password, o.Password)
	if *f.tls == nil {
		*f.tls = o.TLS
	}
	if o.Dialer != nil {
		*f.dialer = o.Dialer
	}
	*f.contextTimeout = true
	*f.poolSize = poolSize(*f.poolSize, o.Coalesce)
	*f.maxRetries = noRetries
	co := o.Coalesce
	if co.Disabled && co.Pipelines <= 0 {
		co.Pipelines = *f.poolSize
	}
	return co
}

// poolSize is the connection pool per server: go-redis's default (10 per
// CPU) or what the URL asked for, but always room for every pipeline plus
// the other users of the client (peeks, resets, refunds, overrides), so
// that runners never wait for a connection behind each other.
func poolSize(size int, co CoalesceOptions) int {
	if size <= 0 {
		size = 10 * runtime.GOMAXPROCS(0)
	}
	if co.Disabled {
		return size // one runner per connection (see withDefaults)
	}
	return max(size, co.withDefaults().Pipelines+10)
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// redactURLError drops the URL (which may hold a password) from a parse error.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// Name implements Store: "redis 127.0.0.1:6379", "redis cluster (3
// primaries: …)", "redis sentinel mymaster (primary 10.0.0.5:6379, 1 replica)".
func (s *Store) Name() string { return *s.name.Load() }

// Topology returns how the store reaches Redis.
func (s *Store) Topology() Topology { return s.topology }

// Client returns the go-redis client, for other users of the same Redis
// (runtime overrides, INFO metrics); nil if it is not a UniversalClient.
func (s *Store) Client() redis.UniversalClient {
	c, _ := s.client.(redis.UniversalClient)
	return c
}

// Ping implements Store. On one Redis it is PING. On a cluster every
// primary must answer and every slot must have a primary; on Sentinel the
// server the client reaches must be the primary. Ping also refreshes Name
// with what it found, so /readyz shows the topology.
func (s *Store) Ping(ctx context.Context) error {
	switch s.topology {
	case Cluster:
		if cc, ok := s.client.(*redis.ClusterClient); ok {
			return s.pingCluster(ctx, cc)
		}
	case Sentinel:
		if c, ok := s.client.(*redis.Client); ok {
			return s.pingSentinel(ctx, c)
		}
	}
	return s.client.Ping(ctx).Err()
}

// Close stops the pipelines and the background refunds and closes the
// clients.
func (s *Store) Close() error {
	s.bg.stop()
	if s.co != nil {
		s.co.close()
	}
	if s.nodes != nil {
		s.nodes.close()
	}
	s.bg.close()
	return s.client.Close()
}

// Decide implements Store.
func (s *Store) Decide(ctx context.Context, b *limits.Batch, results []limits.Result) (bool, error) {
	n := len(b.Checks)
	if len(results) < n {
		return false, limits.ErrShortResults
	}
	if s.topology == Cluster && n > 1 {
		return s.decideSlots(ctx, b, results[:n])
	}
	return s.decideAll(ctx, b, results[:n])
}

// decideAll decides every check of b with one run of decide.lua: the whole
// request is atomic. results has len(b.Checks).
func (s *Store) decideAll(ctx context.Context, b *limits.Batch, results []limits.Result) (bool, error) {
	call := newCall(ctx)
	call.args = append(call.args, b.NowUS)
	for i := range b.Checks {
		c := &b.Checks[i]
		var err error
		if call.args, err = appendCheckArgs(call.args, c); err != nil {
			call.release()
			return false, err
		}
		call.keys = append(call.keys, c.Key)
	}
	admitted, _, err := s.decideCall(call, results)
	if err != nil {
		s.noteError(err)
		return false, fmt.Errorf("redis store: decide: %w", err)
	}
	return admitted == 1, nil
}

// decideCall runs decide.lua with call's keys and arguments, through the
// pipelines of the server that holds them, fills results from its reply
// (see callResults), and disposes of call. It returns the decision's
// admitted and instant.
func (s *Store) decideCall(call *scriptCall, results []limits.Result) (admitted, at int64, err error) {
	reply, err, owned := s.run(call)
	if err == nil {
		admitted, at, err = callResults(call, reply, results)
	}
	if owned {
		call.release()
	}
	return admitted, at, err
}

// callResults fills results from the decision of call, whose reply came:
// from call.vals when a batch's runner decoded it there (reply nil), else
// from reply, decide.lua's reply as go-redis gave it. It returns the
// decision's admitted and instant.
func callResults(call *scriptCall, reply any, results []limits.Result) (admitted, at int64, err error) {
	if reply == nil && len(call.vals) > 0 {
		return parseVals(call.vals, results)
	}
	return parseReply(reply, 2, results)
}

// parseVals reads a decision as numbers (admitted, now, then four per
// result), as a batch's runner leaves it in a call.
func parseVals(vals []int64, results []limits.Result) (admitted, at int64, err error) {
	if len(vals) != 2+4*len(results) {
		return 0, 0, fmt.Errorf("redis store: reply has %d values, want %d", len(vals), 2+4*len(results))
	}
	for i := range results {
		v := vals[2+4*i:]
		results[i] = limits.Result{Allowed: v[0] == 1, Remaining: v[1], ResetUS: v[2], RetryUS: v[3]}
	}
	return vals[0], vals[1], nil
}

// primaryDown is a decision refused at once because its cluster primary's
// own breaker is open. One primary failing is not the store being down:
// the error neither matches limits.ErrBreakerOpen nor counts as a store
// failure (IsStoreFailure), so the limiter decides the request by its local
// fallback, as any call that failed while the store is up, and the store's
// breaker stays closed for the primaries that answer. Once every primary's
// breaker is open (all), it is the store's outage: the error then matches
// ErrBreakerOpen (failure_mode answers) and counts as a failure.
type primaryDown struct {
	addr  string
	cause error
	all   bool
}

func (e *primaryDown) Is(target error) bool { return e.all && target == limits.ErrBreakerOpen }

// NotSent: the decision never went to Redis (limits.NotSent).
func (e *primaryDown) NotSent() bool { return true }

func (e *primaryDown) Error() string {
	return "redis cluster primary " + e.addr + ": " + e.cause.Error()
}

// run sends call to the server that holds its keys and waits for the
// reply. On a cluster it follows MOVED and ASK and tries TRYAGAIN again,
// within the call's deadline: those replies say the script did not run.
// owned is false when the caller gave up and a runner took the call over.
func (s *Store) run(call *scriptCall) (reply any, err error, owned bool) {
	if s.nodes == nil {
		return s.co.do(call)
	}
	slot := KeySlot(call.keys[0])
	nd, err := s.nodes.forSlot(call.ctx, slot)
	for attempt := 0; err == nil; attempt++ {
		var t limits.Ticket
		if t, err = nd.gate.Allow(); err != nil {
			return nil, &primaryDown{addr: nd.addr, cause: err, all: s.nodes.allRefusing()}, true
		}
		reply, err, owned = nd.co.do(call)
		if !owned {
			// The runner owns call now and may have released it (its ctx
			// cleared) already: err is the caller's ctx.Err().
			nd.gate.Done(t, err)
			return reply, err, false
		}
		if notRun(err) {
			nd.gate.Done(t, nil) // the primary answers; the slot is elsewhere
		} else {
			nd.gate.Done(t, err)
		}
		if err == nil || !notRun(err) || attempt >= 4 || call.ctx.Err() != nil {
			if err != nil && IsStoreFailure(err) {
				s.nodes.reloadSoon()
			}
			return reply, err, true
		}
		var ask bool
		if nd, ask, err = s.nodes.next(call.ctx, slot, attempt, err); err == nil {
			if ask {
				return s.asking(call, nd)
			}
			call.rearm()
		}
	}
	return nil, err, true
}

// asking sends call to nd after ASKING (its slot is being migrated there)
// and waits for the reply as a coalesced call's caller does: no longer
// than the caller's context, while the send itself waits the late grace
// past the caller's deadline and hands a reply that comes after the
// caller gave up to lateReply, which gives back what it committed. owned
// is false when the caller gave up: the sender then releases the call.
func (s *Store) asking(call *scriptCall, nd *clusterNode) (reply any, err error, owned bool) {
	var ctx context.Context
	var cancel context.CancelFunc
	if call.hasDeadline {
		ctx, cancel = context.WithDeadline(context.Background(), call.deadline.Add(nd.co.opt.LateGrace))
	} else {
		ctx, cancel = context.WithCancel(context.Background())
	}
	call.rearm()
	go func() {
		defer cancel()
		reply, err := askingEval(ctx, nd, s.script, call)
		if !call.finish(reply, err) {
			s.lateReply(call, reply, err)
			call.release()
		}
	}()
	return call.wait()
}

// lateReply is told about a decide.lua run whose caller gave up before
// its reply came: the caller was answered without it (failure mode or the
// local fallback), so whatever it committed is given back.
func (s *Store) lateReply(call *scriptCall, reply any, err error) {
	if err != nil {
		if errors.Is(err, errCoalescerClosed) || notRun(err) || isNoScript(err) || isNoFunction(err) {
			s.late.clean.Add(1)
			return
		}
		// Timed out past the grace, or the connection died: it may have
		// run. Its units stay consumed until the window passes.
		s.late.unknown.Add(1)
		return
	}
	j := lateRefundJob(call, reply)
	if j == nil {
		s.late.clean.Add(1)
		return
	}
	s.late.refunded.Add(1)
	s.refundLater(j)
}

// appendCheckArgs appends decide.lua's six ARGV of one check.
func appendCheckArgs(args []any, c *limits.Check) ([]any, error) {
	code := c.Algorithm.Code()
	if code == 0 {
		return args, fmt.Errorf("redis store: algorithm %q not implemented", c.Algorithm)
	}
	shadow := 0
	if c.Shadow {
		shadow = 1
	}
	return append(args, code, boxInt(c.Limit), boxInt(c.PeriodUS), boxInt(c.Burst), c.Cost, shadow), nil
}

// boxes holds the interface values of rule values in script arguments:
// limits, periods and bursts come from a few rules, and boxing each anew
// cost an allocation per argument per decision. Request values (a cost
// from a header, a test clock) are boxed directly: they would only churn
// the table. Copy on write: reads take no lock; once full (rules changed
// very often) new values are boxed without being kept.
var (
	boxes   atomic.Pointer[map[int64]any]
	boxesMu sync.Mutex
)

const maxBoxes = 1024

func init() { boxes.Store(&map[int64]any{}) }

// boxInt returns v as an interface value, allocating only the first time a
// value is seen (and never for 0..255, which Go boxes without allocating).
func boxInt(v int64) any {
	if v >= 0 && v < 256 {
		return v
	}
	if b, ok := (*boxes.Load())[v]; ok {
		return b
	}
	b := any(v)
	boxesMu.Lock()
	defer boxesMu.Unlock()
	old := *boxes.Load()
	if len(old) >= maxBoxes {
		return b
	}
	m := make(map[int64]any, len(old)+1)
	for k, x := range old {
		m[k] = x
	}
	m[v] = b
	boxes.Store(&m)
	return b
}

// parseReply reads a reply of head integers followed by four per result
// (allowed, remaining, reset_us, retry_us), and returns the first two heads
// (decide.lua: admitted, now_us; refund.lua: now_us).
func parseReply(reply any, head int, results []limits.Result) (h0, h1 int64, err error) {
	arr, ok := reply.([]any)
	if !ok {
		return 0, 0, fmt.Errorf("redis store: reply is %T, want array", reply)
	}
	if len(arr) != head+4*len(results) {
		return 0, 0, fmt.Errorf("redis store: reply has %d items, want %d", len(arr), head+4*len(results))
	}
	var heads [2]int64
	for i := 0; i < head && i < 2; i++ {
		if heads[i], err = replyInt(arr[i]); err != nil {
			return 0, 0, err
		}
	}
	var ints [4]int64
	for i := range results {
		for j := range ints {
			if ints[j], err = replyInt(arr[head+4*i+j]); err != nil {
				return 0, 0, err
			}
		}
		results[i] = limits.Result{Allowed: ints[0] == 1, Remaining: ints[1], ResetUS: ints[2], RetryUS: ints[3]}
	}
	return heads[0], heads[1], nil
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
func (s *Store) Peek(ctx context.Context, c limits.Check) (limits.Result, error) {
	return s.PeekAt(ctx, c, 0)
}

// PeekAt is Peek with the clock replaced by nowUS when non-zero. Tests only.
func (s *Store) PeekAt(ctx context.Context, c limits.Check, nowUS int64) (limits.Result, error) {
	c.Cost = 0
	c.Shadow = false
	var r [1]limits.Result
	if _, err := s.Decide(ctx, &limits.Batch{Checks: []limits.Check{c}, NowUS: nowUS}, r[:]); err != nil {
		return limits.Result{}, err
	}
	return r[0], nil
}

// resetScript deletes a key and stamps the time of the reset beside it
// (lua/reset.lua), so that no refund of a commit it erased lowers the
// record rebuilt after it.
var resetScript = func() *redis.Script {
	src, err := lua.Source("reset.lua")
	if err != nil {
		panic(err)
	}
	return redis.NewScript(src)
}()

// Reset implements Store.
func (s *Store) Reset(ctx context.Context, c limits.Check) error {
	s.denied.forget(c.Key)
	if err := resetScript.Run(ctx, s.client, []string{c.Key}, limits.ResetStampKey(c.Key)).Err(); err != nil && !errors.Is(err, redis.Nil) {
		s.noteError(err)
		return fmt.Errorf("redis store: reset %q: %w", c.Key, err)
	}
	return nil
}

// background runs the refunds that could not finish within their request
// (see cluster.go): bounded in number, each with its own deadline, all
// stopped and waited for by Close.
type background struct {
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
	slots  chan struct{}
	stats  refundStats
}

func (b *background) init() {
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.slots = make(chan struct{}, maxBackgroundRefunds)
}

// goRun runs fn in a goroutine unless the store is closed or
// maxBackgroundRefunds are already running; it reports whether it did.
func (b *background) goRun(fn func(ctx context.Context)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	select {
	case b.slots <- struct{}{}:
	default:
		return false
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer func() { <-b.slots }()
		fn(b.ctx)
	}()
	return true
}

// stop ends the store's context: pipelines in flight give up.
func (b *background) stop() { b.cancel() }

func (b *background) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
}

// IsTimeout reports a store error that is a deadline passing (ErrorKind's
// timeout: the context's, an I/O deadline, go-redis's pool timeout).
func IsTimeout(err error) bool { return ErrorKind(err) == limits.KindTimeout }

// IsStoreFailure is the failure test a breaker in front of a Redis store
// uses (BreakerOptions.IsFailure). It reports whether err means the store
// cannot decide right now: a timeout, a connection error, or a Redis reply
// saying the server is not usable (LOADING, BUSY, MASTERDOWN, READONLY,
// MISCONF, NOAUTH, WRONGPASS, NOPERM, CLUSTERDOWN, TRYAGAIN, NOREPLICAS,
// max clients). Other Redis replies (a script error, NOSCRIPT, WRONGTYPE)
// prove the server answers and are not failures; nor is context.Canceled
// (the caller gave up). Nor is OOM: a Redis at maxmemory with noeviction
// answers, and clients can fill it (every new address or route of a rule
// keyed on one is a key); taken for down, it would hand every request to
// failure_mode. Each decision it refuses is the local fallback's instead.
func IsStoreFailure(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, redis.Nil) {
		return false
	}
	if pd, ok := errors.AsType[*primaryDown](err); ok {
		return pd.all
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return true
	}
	msg := re.Error()
	word, _, _ := strings.Cut(msg, " ")
	switch word {
	case "LOADING", "BUSY", "MASTERDOWN", "READONLY", "MISCONF",
		"NOAUTH", "WRONGPASS", "NOPERM", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS":
		return true
	}
	return strings.HasPrefix(msg, "ERR max number of clients reached")
}
