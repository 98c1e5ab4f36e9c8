package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

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
// makes a runner that found fewer than MaxBatch calls linger that long for
// more before it sends.
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
	// Wait is how long a runner that found fewer than MaxBatch decisions
	// waits for more before sending. Default 0: send what is there.
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

	reply any
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
	c.reply, c.err = nil, nil
	c.state.Store(callPending)
}

// release returns a finished call to the pool. Only the caller releases,
// and only after it received the reply.
func (c *scriptCall) release() {
	clear(c.keys)
	clear(c.args)
	c.keys, c.args = c.keys[:0], c.args[:0]
	c.ctx, c.reply, c.err = nil, nil, nil
	c.deadline, c.hasDeadline = time.Time{}, false
	if cap(c.keys) > 256 || cap(c.args) > 2048 {
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
	c.mu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default:
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
		if linger != nil && len(batch) > 0 && len(batch) < c.opt.MaxBatch {
			linger.Reset(c.opt.Wait)
			select {
			case <-linger.C:
			case <-c.stop:
				linger.Stop()
			}
			batch = c.take(i, batch)
		}
		if len(batch) == 0 {
			continue
		}
		cmds = c.send(pipe, batch, cmds[:0])
		clear(batch)
		clear(cmds)
		c.mu.Lock()
		c.flying[i] = time.Time{}
		c.mu.Unlock()
		c.wake()
	}
}

// take moves queued calls into runner i's batch, up to MaxBatch in all,
// marks its pipeline in flight, and passes the ready token on if some are
// left for another runner.
func (c *coalescer) take(i int, batch []*scriptCall) []*scriptCall {
	c.mu.Lock()
	return c.takeLocked(i, batch)
}

// takeLocked is take, called with mu held; it unlocks mu.
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
func (c *coalescer) send(pipe redis.Pipeliner, batch []*scriptCall, cmds []*redis.Cmd) []*redis.Cmd {
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
	if len(live) > 1 && c.many.Load() && c.sendMany(ctx, pipe, live) {
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
// decide reply, or its error, from the flat reply (in order; a bare one
// completed with its admitted and the call's instant, as decide.lua
// answers): Redis runs the calls' decisions one after another inside one
// call, so it reads one command, looks up one function and reads TIME
// once for the whole batch. The same replies come back as from one FCALL each at one
// instant, and the same error codes: one decision's error reply is that
// call's alone, and an error of the whole call (a timeout, a lost
// connection) is every call's, an unknown outcome as for any pipeline. It
// reports false, having sent nothing that ran, when the server turned out
// not to run functions (the calls are then sent one by one, as EVALSHA,
// and later batches as DecideManyScript) or to refuse keys of several
// slots in one call.
func (c *coalescer) sendMany(ctx context.Context, pipe redis.Pipeliner, live []*scriptCall) bool {
	keys, args, ok := manyArgs(live)
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
	if err == nil && !manyReplyFits(flat, live) {
		err = fmt.Errorf("redis store: %s answered %d values, not an instant and the replies of %d decisions", c.fn.lib.DecideMany, len(flat), len(live))
	}
	// A bare reply (one check on the Redis clock: its four values) is
	// completed into decide.lua's, in one array for the whole batch.
	var full []any
	if err == nil {
		n := 0
		for _, call := range live {
			if bare(call) {
				n++
			}
		}
		full = make([]any, 0, 6*n)
	}
	p := 1
	for _, call := range live {
		if err != nil {
			c.deliver(call, nil, err)
			continue
		}
		if e, ok := flat[p].(error); ok {
			c.deliver(call, nil, e)
			p++
			continue
		}
		if bare(call) {
			v := flat[p : p+4]
			admitted := int64(0)
			if v[0] == int64(1) || shadowed(call) {
				admitted = 1
			}
			at := len(full)
			full = append(full, admitted, flat[0], v[0], v[1], v[2], v[3])
			c.deliver(call, full[at:at+6:at+6], nil)
			p += 4
			continue
		}
		end := p + 2 + 4*len(call.keys)
		c.deliver(call, flat[p:end:end], nil)
		p = end
	}
	return true
}

// manyReplyFits reports whether DecideMany's flat reply holds its instant,
// then, decision after decision, either one error, or a bare reply of 4
// values, or a decide reply of 2 values and 4 per check, and nothing more.
func manyReplyFits(flat []any, live []*scriptCall) bool {
	if len(flat) == 0 {
		return false
	}
	if _, ok := flat[0].(int64); !ok {
		return false
	}
	p := 1
	for _, call := range live {
		if p >= len(flat) {
			return false
		}
		switch _, isErr := flat[p].(error); {
		case isErr:
			p++
		case bare(call):
			p += 4
		default:
			p += 2 + 4*len(call.keys)
		}
	}
	return p == len(flat)
}

// bare reports a decide call that DecideMany answers bare, without its
// admitted and its instant: one check, on the Redis clock.
func bare(call *scriptCall) bool {
	return len(call.keys) == 1 && onClock(call)
}

// shadowed reports a decide call of one check that only reports: its
// shadow argument, the last, is what go-redis sends as "1", the one value
// decide.lua takes for a shadow (appendCheckArgs gives an int).
func shadowed(call *scriptCall) bool {
	switch v := call.args[len(call.args)-1].(type) {
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

// manyScanShapes is how many distinct shapes manyArgs looks through one
// by one before it indexes them in a map.
const manyScanShapes = 8

// manyArgs is DecideMany's KEYS and ARGV for the decide calls live (see
// lua/decide_many.lua): the distinct check shapes (code, limit, period,
// burst, shadow, cost) once, then each decision as the shapes of its checks:
// one value for a decision of one check on the Redis clock, 1+n for one of
// n checks, 3+n for one at its own instant (a test clock). ok is false when
// a call is not shaped as a decide call.
func manyArgs(live []*scriptCall) (keys []string, args []any, ok bool) {
	// A check's values in a call's decide ARGV (after now): code, limit,
	// period, burst at 0..3, cost at 4, shadow at 5; a shape keeps them in
	// DecideMany's order.
	type shape [6]any
	var shapes []shape
	nk, clock := 0, 0
	for _, call := range live {
		if len(call.args) != 1+6*len(call.keys) || len(call.keys) == 0 {
			return nil, nil, false
		}
		nk += len(call.keys)
		if onClock(call) {
			clock++
		}
	}
	// A batch's checks mostly share a few shapes, found by a scan; past
	// manyScanShapes (identity overrides can give every caller its own
	// numbers) a map keeps the search linear in the batch.
	var byShape map[shape]int
	index := make([]int, 0, nk)
	for _, call := range live {
		for i := range call.keys {
			a := call.args[1+6*i:]
			sh := shape{a[0], a[1], a[2], a[3], a[5], a[4]}
			at, found := -1, false
			if byShape != nil {
				at, found = byShape[sh]
			} else {
				for j := range shapes {
					if shapes[j] == sh {
						at, found = j, true
						break
					}
				}
			}
			if !found {
				at = len(shapes)
				shapes = append(shapes, sh)
				switch {
				case byShape != nil:
					byShape[sh] = at
				case len(shapes) > manyScanShapes:
					byShape = make(map[shape]int, nk)
					for j, s := range shapes {
						byShape[s] = j
					}
				}
			}
			index = append(index, at+1)
		}
	}
	keys = make([]string, 0, nk)
	args = make([]any, 0, 2+6*len(shapes)+len(live)+nk+2*(len(live)-clock))
	args = append(args, len(live), len(shapes))
	for _, sh := range shapes {
		args = append(args, sh[:]...)
	}
	x := 0
	for _, call := range live {
		keys = append(keys, call.keys...)
		n := len(call.keys)
		switch {
		case bare(call):
			// one check on the Redis clock: its shape alone
		case onClock(call):
			args = append(args, -n)
		default:
			args = append(args, 0, n, call.args[0])
		}
		for range n {
			args = append(args, index[x])
			x++
		}
	}
	return keys, args, true
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
