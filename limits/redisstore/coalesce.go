package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/lua"
)

// This file gathers concurrent decisions into Redis pipelines.
//
// Sending one EVALSHA per request and waiting for its reply leaves Redis
// mostly idle and costs the client a write and a read system call, a pool
// checkout and a goroutine wake-up per decision. A pipeline carries many
// decisions in one write and brings their replies back in one read: on a
// single server as one FCALL of DecideMany (see sendMany), or one EVALSHA
// of its twin script where the server does not run functions; on a Redis
// Cluster node as one script call each. Redis still decides each on its
// own, atomically, exactly once.
//
// How it gathers: callers append to one queue; a fixed number of runners
// (Pipelines) each take everything queued (up to MaxBatch), send it as one
// pipeline on one connection and hand every caller its reply. While the
// runners are busy the queue fills, so the batch grows with the load by
// itself: an idle service sends each decision at once, alone, and a busy
// one sends as many as arrived during the last round trip. Wait, when set,
// makes a runner that found fewer calls than its recent pipelines carried
// linger for more, at most that long, while the batches show load (two
// decisions or more on average): a round trip then carries more
// decisions, and Redis and rategate pay less per decision, for at most
// Wait more on each. The linger ends as soon as the batch is as full as
// the recent ones: with few callers in a closed loop (each waits for its
// answer before it asks again) the calls that can come have come well
// before Wait, and the rest of it would only be idle time on every
// decision. An idle service still sends each decision at once.
//
// One pipeline at a time, while it is quick: once batches carry two
// decisions or more, a runner sends while another pipeline is in flight
// only once that one has waited Overlap (a stalled connection) or a full
// batch is queued. Redis decides one call after another either way; a
// pipeline that waits for the one before it carries twice as many
// decisions, and every call of decide_many costs Redis several µs whatever
// it holds. The other pipelines are there for when a round trip stalls;
// when two have stalled, the server is slow, and none joins them (see
// overlapWait).
//
// Deadlines: a caller waits for its reply no longer than its own context
// allows. A caller still queued when its deadline passes gives up without
// being sent. A call abandoned after it was sent may still be run by
// Redis; so the runner keeps waiting for its reply a little longer than
// any caller (the late grace, on top of the latest caller's deadline), and
// hands a reply that arrives after its caller gave up to the store, which
// gives back what it committed (a refund): the caller was answered without
// it, so it must not count. A reply that never comes is an unknown outcome
// (counted: its units stay consumed until the window passes, never the
// other way round). A slow pipeline holds one runner; after Overlap the
// others go on.

// CoalesceOptions configures how a Redis store gathers decisions into
// pipelines. The zero value of a field means its default.
type CoalesceOptions struct {
	// Disabled sends one decision per round trip, each on its own
	// connection.
	Disabled bool
	// EvalOnly decides with EVALSHA even on servers that run Redis
	// Functions (see functions.go).
	EvalOnly bool
	// Pipelines is how many pipelines may be in flight at once, each on its
	// own connection; on Redis Cluster each pipeline is split into one per
	// node. Default DefaultPipelines.
	Pipelines int
	// MaxBatch is the most decisions one pipeline carries. Default
	// DefaultMaxBatch.
	MaxBatch int
	// Wait is how long, at most, a runner that found fewer decisions than
	// its recent pipelines carried waits for more before sending, under
	// load only: while the last batches carried two decisions or more on
	// average (an idle service sends each decision at once). 0: send what
	// is there. The zero value of CoalesceOptions means 0; config's
	// default is 50µs, or less where redis.timeout and overlap_after leave
	// less (config/validate.go).
	Wait time.Duration
	// Overlap is how long every pipeline in flight must have waited before
	// a runner sends another alongside (overlapWait says when it need not
	// wait, and when it waits longer). Default DefaultOverlap; negative: at
	// once, as many as Pipelines.
	Overlap time.Duration
	// Timeout bounds a pipeline whose callers set no deadline. Default
	// DefaultCoalesceTimeout.
	Timeout time.Duration
	// LateGrace is how long a runner waits for replies past the latest
	// caller's deadline, so that a commit whose caller gave up can be
	// given back. Default DefaultLateGrace.
	LateGrace time.Duration
	// Budget is a decision's deadline (redis.timeout); a cluster primary's
	// breaker probes with it. Default DefaultBudget.
	Budget time.Duration
}

// Defaults of CoalesceOptions, chosen with make bench (README, Performance).
const (
	DefaultPipelines       = 2
	DefaultMaxBatch        = 128
	DefaultCoalesceTimeout = 3 * time.Second
	DefaultLateGrace       = 2 * time.Second
	DefaultBudget          = 50 * time.Millisecond
	DefaultOverlap         = time.Millisecond
)

func (o CoalesceOptions) withDefaults() CoalesceOptions {
	if o.Pipelines <= 0 {
		o.Pipelines = DefaultPipelines
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultCoalesceTimeout
	}
	if o.LateGrace <= 0 {
		o.LateGrace = DefaultLateGrace
	}
	if o.Budget <= 0 {
		o.Budget = DefaultBudget
	}
	if o.Overlap == 0 {
		o.Overlap = DefaultOverlap
	}
	if o.Disabled {
		// One script run per round trip, each on its own connection, as
		// many at once as the pool allows (Open sets Pipelines to
		// the pool size): the same runners, late replies and refunds as
		// with coalescing, none of the sharing (and no holding back).
		o.MaxBatch = 1
		o.Overlap = -1
		if o.Pipelines == DefaultPipelines {
			o.Pipelines = 10 * runtime.GOMAXPROCS(0)
		}
	}
	return o
}

// errCoalescerClosed answers calls made after the store was closed.
var errCoalescerClosed = errors.New("redis store closed")

// scriptCall is one script execution: its keys and arguments, filled by the
// caller, and its reply, filled by a runner. Calls are pooled; the keys and
// args buffers belong to the call. Whoever ends with the call releases it:
// the caller once it received the reply, or the runner when the caller gave
// up first (state abandoned) — then the runner hands the reply to the
// store's late handler and releases the call itself.
type scriptCall struct {
	ctx context.Context
	// deadline is ctx's, copied when the call is made: a runner may hold
	// the call after its caller gave up, when ctx may already serve another
	// request (the handler reuses its contexts).
	deadline    time.Time
	hasDeadline bool
	keys        []string
	args        []any

	// reply is the call's reply as go-redis gave it; a batch's runner
	// leaves it nil and puts the decision in vals instead, as numbers in
	// decide.lua's reply's order (admitted, now, then allowed, remaining,
	// reset_us, retry_us per check: see callResults).
	reply any
	vals  []int64
	err   error
	done  chan struct{} // one send per use, by the runner
	state atomic.Int32  // callPending, callAbandoned, callDelivered
}

// The states of a call: a pending call ends delivered (the caller has the
// reply) or abandoned (the caller gave up; the runner owns the call).
const (
	callPending int32 = iota
	callAbandoned
	callDelivered
)

var callPool = sync.Pool{New: func() any { return &scriptCall{done: make(chan struct{}, 1)} }}

// newCall returns an empty call for ctx.
func newCall(ctx context.Context) *scriptCall {
	c := callPool.Get().(*scriptCall)
	c.ctx = ctx
	c.deadline, c.hasDeadline = ctx.Deadline()
	c.state.Store(callPending)
	return c
}

// rearm makes a call that was delivered an error (a redirect: Redis did not
// run it) ready to be sent again.
func (c *scriptCall) rearm() {
	c.reply, c.err, c.vals = nil, nil, c.vals[:0]
	c.state.Store(callPending)
}

// release returns a finished call to the pool. Only the caller releases,
// and only after it received the reply.
func (c *scriptCall) release() {
	clear(c.keys)
	clear(c.args)
	c.keys, c.args, c.vals = c.keys[:0], c.args[:0], c.vals[:0]
	c.ctx, c.reply, c.err = nil, nil, nil
	c.deadline, c.hasDeadline = time.Time{}, false
	if cap(c.keys) > 256 || cap(c.args) > 2048 || cap(c.vals) > 1024 {
		return
	}
	callPool.Put(c)
}

// expiredAt returns why the call's caller has given up by now, or nil.
// The copied deadline catches a call abandoned on a context that another
// request reuses by now; ctx.Err catches a cancelled one. (Skipping an
// abandoned call is always right; only sending it would be wrong.)
func (c *scriptCall) expiredAt(now time.Time) error {
	if c.hasDeadline && !now.Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return c.ctx.Err()
}

// finish hands the reply to the caller. It reports false when the caller
// gave up first: the runner then owns the call.
func (c *scriptCall) finish(reply any, err error) bool {
	c.reply, c.err = reply, err
	if c.state.CompareAndSwap(callPending, callDelivered) {
		c.done <- struct{}{}
		return true
	}
	return false
}

// wait blocks until the call's reply or its context's end. On the latter
// the call is abandoned: the caller must not touch or release it.
func (c *scriptCall) wait() (any, error, bool) {
	// ctx is read once, before the call may change hands: once abandoned,
	// the runner owns the call and may release (and clear) it at any time.
	ctx := c.ctx
	select {
	case <-c.done:
		return c.reply, c.err, true
	case <-ctx.Done():
		if c.state.CompareAndSwap(callPending, callAbandoned) {
			return nil, ctx.Err(), false
		}
		// Delivered at the same moment: a reply that arrived is a
		// decision Redis made (and, if admitted, committed), so it wins
		// over the deadline.
		<-c.done
		return c.reply, c.err, true
	}
}

// pipeliner is what the coalescer needs from a go-redis client: pipelines,
// and loading the function library.
type pipeliner interface {
	Pipeline() redis.Pipeliner
	loader
}

// coalescer runs the store's decide script for many callers per pipeline,
// on one server (one per primary on a cluster).
type coalescer struct {
	client pipeliner
	script *redis.Script
	// fn says whether the server decides with FCALL or EVALSHA.
	fn *functions
	// many: a batch goes as one FCALL of DecideMany (see sendMany);
	// cleared for good when the server refuses calls across slots.
	many atomic.Bool
	opt  CoalesceOptions
	// parent ends with the store: pipelines in flight give up at Close.
	parent context.Context
	// late is handed every reply (or error) whose caller gave up, and the
	// call with it; it must not keep the call.
	late func(call *scriptCall, reply any, err error)

	mu     sync.Mutex
	queue  []*scriptCall
	closed bool
	// ready holds a token while the queue may be non-empty: enqueue puts
	// one, a runner that leaves calls behind puts it back.
	ready chan struct{}
	// flying[i] is when runner i took the batch it lingers over or waits
	// on, zero while it has none (guarded by mu).
	flying []time.Time
	// batchMean is the mean size of the last batches taken (a moving
	// average, guarded by mu).
	batchMean float64
	// sentMean is the mean size of the last pipelines sent, lingers
	// included (a moving average, guarded by mu): how full a lingering
	// runner waits for its batch to be.
	sentMean float64
	// want, while a runner lingers, is how many queued calls end its
	// linger (0: none lingers; guarded by mu); enqueue then signals
	// filled.
	want   int
	filled chan struct{}
	// landed wakes a runner held back by overlapWait: a pipeline came
	// back, or a full batch is queued. (With more than two runners, others
	// held back look again when their timer fires.)
	landed chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup

	pipelines atomic.Uint64 // pipelines sent
	sent      atomic.Uint64 // calls sent in them
	expired   atomic.Uint64 // calls whose caller gave up before they were sent
	taken     atomic.Uint64 // calls runners took from the queue
}

// CoalesceStats counts what the pipelines carried.
type CoalesceStats struct {
	// Pipelines is the number of pipelines sent; Calls the decisions they
	// carried (Calls/Pipelines is the mean batch). Expired counts the
	// calls not sent because their deadline had passed in the queue.
	Pipelines, Calls, Expired uint64
}

// Coalescing returns the pipeline counts (summed over the primaries of a
// cluster), and false when the store does not coalesce.
func (s *Store) Coalescing() (CoalesceStats, bool) {
	var st CoalesceStats
	add := func(c *coalescer) {
		st.Pipelines += c.pipelines.Load()
		st.Calls += c.sent.Load()
		st.Expired += c.expired.Load()
	}
	if s.co != nil {
		add(s.co)
	}
	if s.nodes != nil {
		for _, nd := range s.nodes.all() {
			add(nd.co)
		}
	}
	return st, !s.coOpt.Disabled
}

// newCoalescer starts the runners of one server. many says that one call
// may carry keys of any slot (not a Redis Cluster node), so that a batch
// can be sent as one call of the library's DecideMany.
func newCoalescer(parent context.Context, client pipeliner, script *redis.Script, fn *functions, o CoalesceOptions,
	many bool, late func(call *scriptCall, reply any, err error)) *coalescer {
	o = o.withDefaults()
	c := &coalescer{
		client: client,
		script: script,
		fn:     fn,
		opt:    o,
		parent: parent,
		late:   late,
		queue:  make([]*scriptCall, 0, o.MaxBatch),
		ready:  make(chan struct{}, 1),
		flying: make([]time.Time, o.Pipelines),
		// as if the last batches were single calls: no holding back
		// until the load shows that batches grow
		batchMean: 1,
		sentMean:  1,
		filled:    make(chan struct{}, 1),
		landed:    make(chan struct{}, 1),
		stop:      make(chan struct{}),
	}
	c.many.Store(many)
	c.wg.Add(o.Pipelines)
	for i := range o.Pipelines {
		go c.run(i)
	}
	return c
}

// do runs call's script and returns its reply. owned reports whether the
// caller still owns call (and must release it): false when its context
// ended first and the runner took it over.
func (c *coalescer) do(call *scriptCall) (reply any, err error, owned bool) {
	if !c.enqueue(call) {
		return nil, errCoalescerClosed, true
	}
	return call.wait()
}

// enqueue queues call for the next pipeline; false once closed.
func (c *coalescer) enqueue(call *scriptCall) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.queue = append(c.queue, call)
	full := len(c.queue) == c.opt.MaxBatch
	filled := c.want > 0 && len(c.queue) >= c.want
	if filled {
		c.want = 0
	}
	c.mu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default:
	}
	if filled {
		select {
		case c.filled <- struct{}{}:
		default:
		}
	}
	if full {
		c.wake()
	}
	return true
}

// wake tells a runner held back by overlapWait to look again.
func (c *coalescer) wake() {
	select {
	case c.landed <- struct{}{}:
	default:
	}
}

// overlapWait is how long, from now, a runner holding calls must still
// hold back because another pipeline is in flight (see Overlap); 0: send.
// Once two pipelines in flight have waited Overlap, the server is slow,
// not one connection: nothing joins them (each call sent would end past
// its deadline, a late reply to refund) until one comes back. Otherwise
// it sends when none is in flight, when a full batch is queued, when the
// last batches carried fewer than two decisions on average (waiting would
// only delay each call by a round trip: with so few callers the batch
// does not grow), and once every pipeline in flight has waited Overlap.
// Called with mu held.
func (c *coalescer) overlapWait(now time.Time) time.Duration {
	if c.opt.Overlap < 0 {
		return 0
	}
	var youngest time.Time
	stalled := 0
	for _, t := range c.flying {
		if t.IsZero() {
			continue
		}
		if t.After(youngest) {
			youngest = t
		}
		if now.Sub(t) >= c.opt.Overlap {
			stalled++
		}
	}
	switch {
	case youngest.IsZero():
		return 0
	case stalled >= 2:
		return c.opt.Overlap // until one comes back (landed), looking again now and then
	case len(c.queue) >= c.opt.MaxBatch, c.batchMean < 2:
		return 0
	}
	return max(youngest.Add(c.opt.Overlap).Sub(now), 0)
}

// takeWhenFree takes runner i's batch (see take) once overlapWait lets
// it, checked and taken under one lock, so that two runners cannot both
// find the way clear; false when the coalescer stops meanwhile.
func (c *coalescer) takeWhenFree(i int, timer *time.Timer, batch []*scriptCall) ([]*scriptCall, bool) {
	for {
		c.mu.Lock()
		wait := c.overlapWait(time.Now())
		if wait == 0 {
			return c.takeLocked(i, batch), true
		}
		c.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-c.landed:
		case <-timer.C:
		case <-c.stop:
			timer.Stop()
			return batch, false
		}
		timer.Stop()
	}
}

// run is runner i: take a batch, send it, repeat until closed.
func (c *coalescer) run(i int) {
	defer c.wg.Done()
	pipe := c.client.Pipeline()
	var many manyScratch
	batch := make([]*scriptCall, 0, c.opt.MaxBatch)
	cmds := make([]*redis.Cmd, 0, c.opt.MaxBatch)
	var linger *time.Timer
	if c.opt.Wait > 0 {
		linger = time.NewTimer(time.Hour)
		linger.Stop()
	}
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	for {
		select {
		case <-c.ready:
		case <-c.stop:
			return
		}
		var ok bool
		if batch, ok = c.takeWhenFree(i, hold, batch[:0]); !ok {
			return
		}
		if linger != nil && len(batch) > 0 && len(batch) < c.opt.MaxBatch && c.lingerFor(len(batch)) {
			linger.Reset(c.opt.Wait)
			select {
			case <-linger.C:
			case <-c.filled:
				linger.Stop()
			case <-c.stop:
				linger.Stop()
			}
			c.mu.Lock()
			c.want = 0
			batch = c.takeLocked(i, batch)
		}
		if len(batch) == 0 {
			continue
		}
		n := len(batch)
		cmds = c.send(pipe, batch, cmds[:0], &many)
		clear(batch)
		clear(cmds)
		c.mu.Lock()
		c.flying[i] = time.Time{}
		c.sentMean += (float64(n) - c.sentMean) / 8
		c.mu.Unlock()
		c.wake()
	}
}

// lingerFor reports whether a runner holding a batch of n calls lingers
// for more (Wait), and if so arms filled for when the queue holds what it
// lacks: only while the last batches carried two decisions or more on
// average (decisions arrive faster than round trips, so a linger gathers
// more of them per round trip), and only until the batch is as full as
// the recent pipelines (sentMean).
func (c *coalescer) lingerFor(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	need := int(c.sentMean+0.5) - n
	if c.batchMean < 2 || need <= 0 {
		return false
	}
	// a signal left from a linger that ended on its timer is stale
	select {
	case <-c.filled:
	default:
	}
	if len(c.queue) >= need {
		select { // already there: take them at once
		case c.filled <- struct{}{}:
		default: // an enqueue just signalled
		}
		return true
	}
	c.want = need
	return true
}

// takeLocked moves queued calls into runner i's batch, up to MaxBatch in
// all, marks its pipeline in flight, and passes the ready token on if
// some are left for another runner. Called with mu held; it unlocks mu.
func (c *coalescer) takeLocked(i int, batch []*scriptCall) []*scriptCall {
	n := min(len(c.queue), c.opt.MaxBatch-len(batch))
	batch = append(batch, c.queue[:n]...)
	rest := copy(c.queue, c.queue[n:])
	clear(c.queue[rest:])
	c.queue = c.queue[:rest]
	if len(batch) > 0 && c.flying[i].IsZero() {
		c.flying[i] = time.Now()
		c.batchMean += (float64(len(batch)) - c.batchMean) / 8
	}
	c.mu.Unlock()
	c.taken.Add(uint64(n))
	if rest > 0 {
		select {
		case c.ready <- struct{}{}:
		default:
		}
	}
	return batch
}

// send runs batch as one pipeline and finishes every call in it. A call
// whose caller already gave up is not sent.
func (c *coalescer) send(pipe redis.Pipeliner, batch []*scriptCall, cmds []*redis.Cmd, many *manyScratch) []*redis.Cmd {
	var deadline time.Time
	now := time.Now()
	live := batch[:0]
	for _, call := range batch {
		if err := call.expiredAt(now); err != nil {
			c.expired.Add(1)
			if !call.finish(nil, err) {
				call.release() // abandoned before it was sent: nothing ran
			}
			continue
		}
		d := call.deadline
		if !call.hasDeadline {
			d = now.Add(c.opt.Timeout)
		}
		if d.After(deadline) {
			deadline = d
		}
		live = append(live, call)
	}
	if len(live) == 0 {
		return cmds
	}
	// Past the latest caller's deadline the runner keeps waiting, for
	// LateGrace: a reply that comes late is a commit to give back.
	ctx, cancel := context.WithDeadline(c.parent, deadline.Add(c.opt.LateGrace))
	defer cancel()
	c.pipelines.Add(1)
	c.sent.Add(uint64(len(live)))
	if len(live) > 1 && c.many.Load() && c.sendMany(ctx, pipe, live, many) {
		return cmds
	}
	for _, call := range live {
		cmds = append(cmds, c.fn.decide(ctx, pipe, c.script, call.keys, call.args))
	}
	_, _ = pipe.Exec(ctx)

	// What may be sent again, because Redis said it never ran it: an FCALL
	// of a function the server lacks (restarted, flushed, failed over),
	// after loading the library; an FCALL the server will not run (too old,
	// the ACL), as EVALSHA from then on; an EVALSHA of a script the server
	// lacks, as EVAL, which sends the source and caches it; and a pipeline
	// that could not even be written (no connection could be dialed: a
	// Sentinel primary just switched), once.
	for attempt := 0; attempt < 3; attempt++ {
		missing := false
		for _, cmd := range cmds {
			if isFCall(cmd) && isNoFunction(cmd.Err()) {
				missing = true
				break
			}
		}
		if missing {
			if err := c.fn.load(ctx, c.client); err != nil {
				break // the server is gone: the calls keep their errors
			}
		}
		retry := false
		for i, cmd := range cmds {
			switch err := cmd.Err(); {
			case err == nil:
			case isFCall(cmd) && (isNoFunction(err) || functionsUnavailable(err)):
				if functionsUnavailable(err) {
					c.fn.useEval(err)
				}
				cmds[i] = c.fn.decide(ctx, pipe, c.script, live[i].keys, live[i].args)
				retry = true
			case isNoScript(err):
				cmds[i] = c.script.Eval(ctx, pipe, live[i].keys, live[i].args...)
				retry = true
			case attempt == 0 && notSent(err) && ctx.Err() == nil:
				cmds[i] = c.fn.decide(ctx, pipe, c.script, live[i].keys, live[i].args)
				retry = true
			}
		}
		if !retry {
			break
		}
		_, _ = pipe.Exec(ctx)
	}
	for i, call := range live {
		reply, err := cmds[i].Result()
		c.deliver(call, reply, err)
	}
	return cmds
}

// deliver hands a sent call its reply, or, when its caller gave up, hands
// the reply to the late handler and releases the call.
func (c *coalescer) deliver(call *scriptCall, reply any, err error) {
	if !call.finish(reply, err) {
		if c.late != nil {
			c.late(call, reply, err)
		}
		call.release()
	}
}

// sendMany sends live as one FCALL of the library's DecideMany
// (lua/decide_many.lua), or as one EVALSHA of its twin DecideManyScript on
// a server that does not run functions, and delivers to every call its
// decision, or its error: Redis runs the calls' decisions one after another
// inside one call, so it reads one command, looks up one function and reads
// TIME once for the whole batch, and reads and writes once a key that
// several decisions name. The same decisions come back as from one FCALL
// each at one instant, and the same error codes: one decision's error reply
// is that call's alone, and an error of the whole call (a timeout, a lost
// connection) is every call's, an unknown outcome as for any pipeline. It
// reports false, having sent nothing that ran, when the server turned out
// not to run functions (the calls are then sent one by one, as EVALSHA,
// and later batches as DecideManyScript) or to refuse keys of several
// slots in one call.
func (c *coalescer) sendMany(ctx context.Context, pipe redis.Pipeliner, live []*scriptCall, m *manyScratch) bool {
	keys, args, ok := m.args(live)
	if !ok {
		return false // not a decide call's shape: send them as they are
	}
	// As in send: a missing library is loaded and the call sent again, a
	// server that will not run functions is left to EVALSHA, a script the
	// server lacks is sent as EVAL (which caches it), and a call that
	// could not be written is sent once more. A server that refuses keys
	// of several slots in one call (a Redis Cluster node reached as a
	// single server) gets one call per decision from then on. None of
	// these ran anything.
	var cmd *redis.Cmd
	noScript := false
	for attempt := 0; ; attempt++ {
		switch {
		case !c.fn.eval.Load():
			cmd = pipe.FCall(ctx, c.fn.lib.DecideMany, keys, args...)
		case noScript:
			cmd = lua.DecideManyScript.Eval(ctx, pipe, keys, args...)
		default:
			cmd = lua.DecideManyScript.EvalSha(ctx, pipe, keys, args...)
		}
		_, _ = pipe.Exec(ctx)
		err := cmd.Err()
		if err == nil {
			break
		}
		if functionsUnavailable(err) {
			c.fn.useEval(err)
			return false
		}
		if isCrossSlot(err) {
			c.many.Store(false)
			return false
		}
		if attempt == 2 {
			break
		}
		if isNoScript(err) {
			noScript = true
			continue
		}
		if isNoFunction(err) {
			if c.fn.load(ctx, c.client) != nil {
				break // the server is gone: the calls get the error
			}
			if c.fn.eval.Load() {
				return false // the load found functions unavailable
			}
			continue
		}
		if !(attempt == 0 && notSent(err) && ctx.Err() == nil) {
			break
		}
	}
	flat, err := cmd.Slice()
	if err == nil {
		err = readMany(flat, live)
	}
	for _, call := range live {
		switch {
		case err != nil:
			c.deliver(call, nil, err)
		case call.err != nil:
			c.deliver(call, nil, call.err)
		default:
			c.deliver(call, nil, nil) // its decision is in call.vals
		}
	}
	return true
}

// readMany reads DecideMany's flat reply: the call's instant, then each
// call's decision, per check two values when it allowed (remaining, reset)
// and three when it denied (-remaining - 1, reset, retry), or one error.
// Each call gets its decision in vals, in decide.lua's reply's order, or
// its error in err. A reply that does not fit the calls, to the last value
// (or says a reset below 0, a retry below -1), is an error for all of them.
func readMany(flat []any, live []*scriptCall) error {
	// The error is only formatted when the reply is short: every batch
	// comes through here.
	short := func() error {
		return fmt.Errorf("redis store: DecideMany answered %d values, not an instant and the decisions of %d calls", len(flat), len(live))
	}
	clock, ok := at(flat, 0)
	if !ok {
		return short()
	}
	p := 1
	for _, call := range live {
		call.vals, call.err = call.vals[:0], nil
		if p >= len(flat) {
			return short()
		}
		if e, isErr := flat[p].(error); isErr {
			call.err = e
			p++
			continue
		}
		now := clock
		if !onClock(call) {
			now, _ = call.args[0].(int64)
		}
		call.vals = append(call.vals, 1, now)
		for i := range call.keys {
			v, ok := at(flat, p)
			if !ok {
				return short()
			}
			reset, ok := at(flat, p+1)
			if !ok || reset < 0 {
				return short()
			}
			if v >= 0 {
				call.vals = append(call.vals, 1, v, reset, 0)
				p += 2
				continue
			}
			retry, ok := at(flat, p+2)
			if !ok || retry < -1 {
				return short()
			}
			call.vals = append(call.vals, 0, -v-1, reset, retry)
			p += 3
			if !isOne(call.args[1+6*i+5]) {
				call.vals[0] = 0 // a check that is not a shadow denied
			}
		}
	}
	if p != len(flat) {
		return short()
	}
	return nil
}

// at returns flat[i] when it is an integer.
func at(flat []any, i int) (int64, bool) {
	if i >= len(flat) {
		return 0, false
	}
	v, ok := flat[i].(int64)
	return v, ok
}

// isOne reports a shadow argument of a decide call: what go-redis sends as
// "1", the one value decide.lua takes for a shadow (appendCheckArgs gives
// an int).
func isOne(v any) bool {
	switch v := v.(type) {
	case int:
		return v == 1
	case int64:
		return v == 1
	case bool:
		return v
	case string:
		return v == "1"
	}
	return false
}

// manyScanShapes is how many distinct shapes (and combinations) a
// manyScratch looks through one by one before it indexes them in a map.
const manyScanShapes = 8

// maxCombinations is how many distinct combinations one DecideMany call
// names at most: a decision's number holds its combination in 16 bits.
// (Past that, a batch is sent as one call per decision.)
const maxCombinations = 65535

// maxHeldChecks is how many checks of a decision may have their key held:
// DecideMany takes the checks' bits above a combination's 16 in one
// number, which a double holds exactly up to 2^53.
const maxHeldChecks = 30

// A check's values in a call's decide ARGV (after now): code, limit,
// period, burst at 0..3, cost at 4, shadow at 5; a shape keeps them in
// DecideMany's order (shadow before cost).
type shape [6]any

// manyScratch is a runner's reusable space for building DecideMany's
// arguments: one per runner, so building a batch's allocates little.
type manyScratch struct {
	shapes  []shape
	byShape map[shape]int
	// combos holds each combination's shape numbers (1-based) one after
	// another, starts where each begins (and one past the last).
	combos []int
	starts []int
	// byCombo finds a combination once there are many: entries of
	// earlier batches stay (an entry counts for generation gen only), so a
	// combination that recurs costs no allocation
	byCombo map[string]*comboAt
	gen     uint64
	key     []byte // comboKey's
	// each call's combination (1-based) and, for each check, its shape
	// number
	callCombo []int
	index     []int
	// occurrences of each key among the decisions on the Redis clock
	seen map[string]int
	// the last call's KEYS and ARGV (go-redis copies them into its
	// command, so the next batch may reuse them)
	keys []string
	argv []any
}

// args is DecideMany's KEYS and ARGV for the decide calls live (see
// lua/decide_many.lua): the distinct check shapes (code, limit, period,
// burst, shadow, cost) once, the distinct combinations of shapes once,
// then each decision as its combination, with the bits of its checks
// whose key another decision of the batch names too, so that Redis holds
// those keys for the call (none when a decision is at its own instant,
// and never a sliding_log key); or, for one at its own instant (a test
// clock), the negated combination and the instant. A key is held for
// every decision that names it or for none. ok is false when a call is not
// shaped as a decide call, or the batch has more combinations than a
// decision's number holds. keys and args are m's: valid until its next
// call.
func (m *manyScratch) args(live []*scriptCall) (keys []string, args []any, ok bool) {
	nk, clock := 0, true
	for _, call := range live {
		if len(call.args) != 1+6*len(call.keys) || len(call.keys) == 0 {
			return nil, nil, false
		}
		nk += len(call.keys)
		if !onClock(call) {
			clock = false
		}
	}
	m.shapes, m.combos, m.starts = m.shapes[:0], m.combos[:0], m.starts[:0]
	m.callCombo, m.index = m.callCombo[:0], m.index[:0]
	clear(m.byShape)
	m.gen++
	if len(m.byCombo) > maxComboKeys {
		clear(m.byCombo)
	}
	m.starts = append(m.starts, 0)
	for _, call := range live {
		from := len(m.index)
		for i := range call.keys {
			a := call.args[1+6*i:]
			m.index = append(m.index, m.shapeOf(shape{a[0], a[1], a[2], a[3], a[5], a[4]})+1)
		}
		m.callCombo = append(m.callCombo, m.comboOf(m.index[from:])+1)
	}
	// Keys named more than once, counted where a decision could hold them.
	holds := clock && len(live) > 1
	if holds {
		if m.seen == nil {
			m.seen = make(map[string]int, nk)
		}
		clear(m.seen)
		for _, call := range live {
			for i, k := range call.keys {
				if i < maxHeldChecks && !isSlidingLog(call.args[1+6*i]) {
					if n := m.seen[k]; n >= 0 {
						m.seen[k] = n + 1
					}
				} else {
					// A check that reads and writes Redis itself (past the
					// bits a decision's number has, or sliding_log): its
					// key is held for no decision of the batch, or one
					// would not see what the others counted.
					m.seen[k] = -1
				}
			}
		}
	}
	if len(m.starts)-1 > maxCombinations {
		return nil, nil, false // a decision's number holds 16 bits of combination
	}
	keys, args = m.keys[:0], m.argv[:0]
	args = append(args, len(live), len(m.shapes), len(m.starts)-1)
	for _, sh := range m.shapes {
		args = append(args, sh[:]...)
	}
	for j := 1; j < len(m.starts); j++ {
		args = append(args, m.starts[j]-m.starts[j-1])
		for _, x := range m.combos[m.starts[j-1]:m.starts[j]] {
			args = append(args, x)
		}
	}
	for j, call := range live {
		keys = append(keys, call.keys...)
		x := int64(m.callCombo[j])
		if !onClock(call) {
			args = append(args, -x, call.args[0])
			continue
		}
		if holds {
			for i, k := range call.keys {
				if i < maxHeldChecks && m.seen[k] > 1 {
					x |= 1 << (16 + i)
				}
			}
		}
		// a batch's decisions share a few numbers: boxed once each
		args = append(args, boxInt(x))
	}
	m.keys, m.argv = keys, args
	return keys, args, true
}

// shapeOf returns sh's index among the batch's shapes, adding it: a scan
// while they are few, a map once identity overrides give many callers
// numbers of their own.
func (m *manyScratch) shapeOf(sh shape) int {
	if m.byShape != nil && len(m.shapes) > manyScanShapes {
		if at, ok := m.byShape[sh]; ok {
			return at
		}
	} else {
		for j := range m.shapes {
			if m.shapes[j] == sh {
				return j
			}
		}
	}
	m.shapes = append(m.shapes, sh)
	at := len(m.shapes) - 1
	switch {
	case len(m.shapes) > manyScanShapes+1:
		m.byShape[sh] = at
	case len(m.shapes) == manyScanShapes+1:
		if m.byShape == nil {
			m.byShape = make(map[shape]int)
		}
		for j, s := range m.shapes {
			m.byShape[s] = j
		}
	}
	return at
}

// comboOf returns the index of the combination of shape numbers idx among
// the batch's, adding it (a copy): a scan while they are few, a map past
// that.
func (m *manyScratch) comboOf(idx []int) int {
	n := len(m.starts) - 1
	var e *comboAt // idx's entry from an earlier batch, once the map is used
	if m.byCombo != nil && n > manyScanShapes {
		if e = m.byCombo[string(m.comboKey(idx))]; e != nil && e.gen == m.gen {
			return e.at
		}
	} else {
		for j := range n {
			if slices.Equal(m.combos[m.starts[j]:m.starts[j+1]], idx) {
				return j
			}
		}
	}
	m.combos = append(m.combos, idx...)
	m.starts = append(m.starts, len(m.combos))
	at := n
	switch {
	case n > manyScanShapes && e != nil:
		e.gen, e.at = m.gen, at
	case n > manyScanShapes:
		// m.key is still idx's, from the look-up above
		m.byCombo[string(m.key)] = &comboAt{gen: m.gen, at: at}
	case n == manyScanShapes:
		if m.byCombo == nil {
			m.byCombo = make(map[string]*comboAt)
		}
		for j := 0; j <= n; j++ {
			m.indexCombo(m.combos[m.starts[j]:m.starts[j+1]], j)
		}
	}
	return at
}

// comboAt is where a combination stands in the batch of generation gen.
type comboAt struct {
	gen uint64
	at  int
}

// maxComboKeys bounds the combinations a manyScratch remembers across
// batches (their entries are reused, not made anew, while they recur).
const maxComboKeys = 4096

// indexCombo enters combination idx at position at for this batch.
func (m *manyScratch) indexCombo(idx []int, at int) {
	if e := m.byCombo[string(m.comboKey(idx))]; e != nil {
		e.gen, e.at = m.gen, at
		return
	}
	m.byCombo[string(m.key)] = &comboAt{gen: m.gen, at: at}
}

// comboKey writes the map key of a combination of shape numbers into the
// scratch's buffer (a look-up by string(key) allocates nothing; only a new
// entry copies it).
func (m *manyScratch) comboKey(idx []int) []byte {
	m.key = m.key[:0]
	for _, x := range idx {
		m.key = binary.AppendUvarint(m.key, uint64(x))
	}
	return m.key
}

// isSlidingLog reports a check's algorithm code argument for sliding_log,
// whose sorted set DecideMany never holds.
func isSlidingLog(code any) bool {
	c, ok := code.(int)
	return ok && c == limits.SlidingLog.Code()
}

// onClock reports a decide call on the Redis clock (now 0).
func onClock(call *scriptCall) bool {
	now, ok := call.args[0].(int64)
	return ok && now == 0
}

// notSent reports an error that proves the command never left rategate:
// no connection could be dialed, or none could be had from the pool.
func notSent(err error) bool {
	if err == nil {
		return false
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial" || errors.Is(err, redis.ErrPoolTimeout)
}

// isCrossSlot reports a CROSSSLOT error reply: the server refused a call
// whose keys are in several slots, before running it.
func isCrossSlot(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "CROSSSLOT")
}

// isNoScript reports a NOSCRIPT error reply.
func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// close fails the calls still queued and calls made afterwards with
// errCoalescerClosed, and waits for the runners to finish the pipelines
// in flight.
func (c *coalescer) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	left := c.queue
	c.queue = nil
	c.mu.Unlock()
	for _, call := range left {
		if !call.finish(nil, errCoalescerClosed) {
			call.release()
		}
	}
	close(c.stop)
	c.wg.Wait()
}
