package limits

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file gathers concurrent decisions into Redis pipelines.
//
// Sending one EVALSHA per request and waiting for its reply leaves Redis
// mostly idle and costs the client a write and a read system call, a pool
// checkout and a goroutine wake-up per decision. A pipeline carries many
// EVALSHAs in one write and brings their replies back in one read; Redis
// still runs each script on its own, atomically, exactly once per decision.
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
// Deadlines: a caller waits for its reply no longer than its own context
// allows; a pipeline's deadline is the latest of its callers'. A slow
// pipeline holds one runner; the others go on, and a caller still queued
// when its deadline passes gives up without being sent. A call abandoned
// after it was sent may still be executed by Redis, as with any timed-out
// command.

// CoalesceOptions configures how a Redis store gathers decisions into
// pipelines. The zero value of a field means its default.
type CoalesceOptions struct {
	// Disabled sends one EVALSHA per decision, each on its own connection.
	Disabled bool
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
	// Timeout bounds a pipeline whose callers set no deadline. Default
	// DefaultCoalesceTimeout.
	Timeout time.Duration
}

// Defaults of CoalesceOptions, chosen with make bench (README, Performance).
const (
	DefaultPipelines       = 4
	DefaultMaxBatch        = 128
	DefaultCoalesceTimeout = 3 * time.Second
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
	return o
}

// errCoalescerClosed answers calls made after the store was closed.
var errCoalescerClosed = errors.New("redis store closed")

// scriptCall is one script execution: its keys and arguments, filled by the
// caller, and its reply, filled by a runner. Calls are pooled; the keys and
// args buffers belong to the call, so a caller that gives up (deadline)
// simply drops the call, and the runner that may still hold it never
// touches memory the caller reuses.
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
}

var callPool = sync.Pool{New: func() any { return &scriptCall{done: make(chan struct{}, 1)} }}

// newCall returns an empty call for ctx.
func newCall(ctx context.Context) *scriptCall {
	c := callPool.Get().(*scriptCall)
	c.ctx = ctx
	c.deadline, c.hasDeadline = ctx.Deadline()
	return c
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

// finish hands the reply to the caller.
func (c *scriptCall) finish(reply any, err error) {
	c.reply, c.err = reply, err
	c.done <- struct{}{}
}

// wait blocks until the call's reply or its context's end. On the latter
// the call is abandoned: the caller must not touch or release it.
func (c *scriptCall) wait() (any, error, bool) {
	select {
	case <-c.done:
		return c.reply, c.err, true
	case <-c.ctx.Done():
		// Both may be ready at once, and select picks at random: a reply
		// that arrived is a decision Redis made (and, if admitted,
		// committed), so it wins over the deadline.
		select {
		case <-c.done:
			return c.reply, c.err, true
		default:
		}
		return nil, c.ctx.Err(), false
	}
}

// pipeliner is what the coalescer needs from a go-redis client.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// coalescer runs the store's decide script for many callers per pipeline.
type coalescer struct {
	client pipeliner
	script *redis.Script
	opt    CoalesceOptions

	mu     sync.Mutex
	queue  []*scriptCall
	closed bool
	// ready holds a token while the queue may be non-empty: enqueue puts
	// one, a runner that leaves calls behind puts it back.
	ready chan struct{}
	stop  chan struct{}
	wg    sync.WaitGroup

	pipelines atomic.Uint64 // pipelines sent
	sent      atomic.Uint64 // calls sent in them
	expired   atomic.Uint64 // calls whose caller gave up before they were sent
	taken     atomic.Uint64 // calls runners took from the queue
}

// CoalesceStats counts what the pipelines carried.
type CoalesceStats struct {
	// Pipelines is the number of pipelines sent; Calls the script runs
	// they carried (Calls/Pipelines is the mean batch). Expired counts the
	// calls not sent because their deadline had passed in the queue.
	Pipelines, Calls, Expired uint64
}

// Coalescing returns the pipeline counts, and false when the store does
// not coalesce.
func (s *RedisStore) Coalescing() (CoalesceStats, bool) {
	if s.co == nil {
		return CoalesceStats{}, false
	}
	return CoalesceStats{Pipelines: s.co.pipelines.Load(), Calls: s.co.sent.Load(), Expired: s.co.expired.Load()}, true
}

func newCoalescer(client pipeliner, script *redis.Script, o CoalesceOptions) *coalescer {
	o = o.withDefaults()
	c := &coalescer{
		client: client,
		script: script,
		opt:    o,
		queue:  make([]*scriptCall, 0, o.MaxBatch),
		ready:  make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
	c.wg.Add(o.Pipelines)
	for range o.Pipelines {
		go c.run()
	}
	return c
}

// do runs call's script and returns its reply. It owns call afterwards:
// released when the reply arrived, dropped when the caller's context
// ended first.
func (c *coalescer) do(call *scriptCall) (any, error) {
	if !c.enqueue(call) {
		call.release()
		return nil, errCoalescerClosed
	}
	reply, err, ok := call.wait()
	if ok {
		call.release()
	}
	return reply, err
}

// enqueue queues call for the next pipeline; false once closed.
func (c *coalescer) enqueue(call *scriptCall) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.queue = append(c.queue, call)
	c.mu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default:
	}
	return true
}

// run is one runner: take a batch, send it, repeat until closed.
func (c *coalescer) run() {
	defer c.wg.Done()
	pipe := c.client.Pipeline()
	batch := make([]*scriptCall, 0, c.opt.MaxBatch)
	cmds := make([]*redis.Cmd, 0, c.opt.MaxBatch)
	var linger *time.Timer
	if c.opt.Wait > 0 {
		linger = time.NewTimer(time.Hour)
		linger.Stop()
	}
	for {
		select {
		case <-c.ready:
		case <-c.stop:
			return
		}
		batch = c.take(batch[:0])
		if linger != nil && len(batch) > 0 && len(batch) < c.opt.MaxBatch {
			linger.Reset(c.opt.Wait)
			select {
			case <-linger.C:
			case <-c.stop:
				linger.Stop()
			}
			batch = c.take(batch)
		}
		if len(batch) == 0 {
			continue
		}
		cmds = c.send(pipe, batch, cmds[:0])
		clear(batch)
		clear(cmds)
	}
}

// take moves queued calls into batch, up to MaxBatch in all, and passes
// the ready token on if some are left for another runner.
func (c *coalescer) take(batch []*scriptCall) []*scriptCall {
	c.mu.Lock()
	n := min(len(c.queue), c.opt.MaxBatch-len(batch))
	batch = append(batch, c.queue[:n]...)
	rest := copy(c.queue, c.queue[n:])
	clear(c.queue[rest:])
	c.queue = c.queue[:rest]
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

// send runs batch as one pipeline (one per node on a cluster) and finishes
// every call in it. A call whose caller already gave up is not sent.
func (c *coalescer) send(pipe redis.Pipeliner, batch []*scriptCall, cmds []*redis.Cmd) []*redis.Cmd {
	var deadline time.Time
	now := time.Now()
	live := batch[:0]
	for _, call := range batch {
		if err := call.expiredAt(now); err != nil {
			c.expired.Add(1)
			call.finish(nil, err)
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
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	for _, call := range live {
		cmds = append(cmds, c.script.EvalSha(ctx, pipe, call.keys, call.args...))
	}
	_, _ = pipe.Exec(ctx)
	c.pipelines.Add(1)
	c.sent.Add(uint64(len(live)))

	// A server without the script (restarted, failed over, flushed)
	// answers NOSCRIPT; EVAL sends the source, which also caches it.
	retry := false
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			cmds[i] = c.script.Eval(ctx, pipe, live[i].keys, live[i].args...)
			retry = true
		}
	}
	if retry {
		_, _ = pipe.Exec(ctx)
	}
	for i, call := range live {
		call.finish(cmds[i].Result())
	}
	return cmds
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
		call.finish(nil, errCoalescerClosed)
	}
	close(c.stop)
	c.wg.Wait()
}
