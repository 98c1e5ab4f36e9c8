package limits

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// This file holds the circuit breaker in front of the shared store. Without
// it a dead or frozen Redis costs every request the whole decision budget
// (redis.timeout) before the failure mode answers — the failure
// envoyproxy/ratelimit#462 describes. With it, after a few consecutive
// failures requests stop waiting for Redis at all: they get ErrBreakerOpen
// in microseconds, the limiter's local fallback or the handler's
// failure_mode answers, and one background goroutine probes Redis until it
// answers again.
//
//	closed ──FailureThreshold consecutive failures,──► open
//	         lasting at least OpenAfter
//	open ──────a probe PING answers─────────────────► half-open
//	half-open ──HalfOpenTrials successes in a row───► closed
//	half-open ──a trial call fails──────────────────► open (probing again)
//
// Why a probe and not a trial request after a pause: a request that tries a
// dead store waits the whole budget, and a frozen Redis would cost one such
// request per pause forever. The probe waits instead, off the request path.
// Why half-open at all: PING can answer while decisions cannot (Redis
// MISCONF, READONLY after a failover), so one real call
// confirms before every call goes back to the store.

// BreakerState is the state of a Breaker. Its numeric value is what a gauge
// exports: 0 closed, 1 open, 2 half-open.
type BreakerState int32

// The breaker states.
const (
	// BreakerClosed: every call goes to the store; failures are counted.
	BreakerClosed BreakerState = 0
	// BreakerOpen: no call goes to the store; calls fail at once with
	// ErrBreakerOpen while a background probe pings the store.
	BreakerOpen BreakerState = 1
	// BreakerHalfOpen: a probe succeeded; up to HalfOpenTrials calls try the
	// store, the others fail at once. Successes close the breaker, a failure
	// opens it again.
	BreakerHalfOpen BreakerState = 2
)

// String returns closed, open or half_open (a metric label value).
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half_open"
	}
	return "unknown"
}

// ErrBreakerOpen is returned, wrapped with the failure that opened the
// breaker, by every call a Breaker refuses. Test with errors.Is.
var ErrBreakerOpen = errors.New("store circuit breaker open")

// NotSent reports whether err says a store call was refused before it
// reached the store: a Redis Cluster primary whose own breaker is open
// refuses its decisions at once (the error has a method NotSent() bool
// that returns true). Such a call took none of the store's time, so its
// duration says nothing about the store.
func NotSent(err error) bool {
	var ns interface{ NotSent() bool }
	return errors.As(err, &ns) && ns.NotSent()
}

// Defaults of BreakerOptions.
const (
	DefaultFailureThreshold = 5
	DefaultProbeInterval    = 200 * time.Millisecond
	DefaultProbeTimeout     = 50 * time.Millisecond
	DefaultHalfOpenTrials   = 1
)

// BreakerOptions configures a Breaker. The zero value of every field means
// its default.
type BreakerOptions struct {
	// FailureThreshold is the number of consecutive failed calls that,
	// lasting at least OpenAfter, opens the breaker (default 5). Any
	// success resets the count.
	FailureThreshold int
	// OpenAfter is how long the consecutive failures must have lasted,
	// from the first, before they open the breaker (default ProbeTimeout,
	// the decision budget). A stall shorter than one budget (a fork for
	// BGSAVE, a long GC pause) fails only the requests it caught, however
	// many were in flight, instead of opening the breaker for a probe
	// interval; a store that is gone keeps failing past it. Negative: no
	// minimum, the count alone decides.
	OpenAfter time.Duration
	// ProbeInterval is the pause between two pings of an open breaker
	// (default 200ms): the longest a recovered store waits to be used again,
	// on top of the client's own reconnect delay.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe ping (default 50ms). Give it the
	// decision budget (redis.timeout): a store that answers a ping only
	// slower than that cannot decide in time either.
	ProbeTimeout time.Duration
	// HalfOpenTrials is how many calls may try the store at once after a
	// successful probe, and how many successes in a row close the breaker
	// (default 1). Calls beyond it fail at once.
	HalfOpenTrials int
	// IsFailure says whether an error means the store is unavailable;
	// default: any error but context.Canceled. The Redis store has a
	// sharper one (redis.IsStoreFailure). Errors it rejects count as
	// answers.
	IsFailure func(error) bool
	// Starved, when set, reports whether this process has lately been too
	// short of CPU for a timeout to say anything about the store (a
	// goroutine waited a good part of the decision budget to run). While
	// it does, timed-out calls neither open the breaker nor open it again
	// from half-open, for a second at most from the first such excuse
	// since the last success or transition: an overloaded rategate is not
	// a dead Redis, and the failure mode is for a store that fails on its
	// own, but a Redis that froze meanwhile is still taken for down. Those
	// calls still fail, and the limiter decides them as any failed call
	// (the local fallback). Other failures count as ever.
	Starved func() bool
	// IsTimeout says which failures are timeouts, for Starved; nil: a
	// context or I/O deadline that passed (redisstore.IsTimeout adds
	// go-redis's pool timeout).
	IsTimeout func(error) bool
	// OnStateChange, when set, is called on every transition, in order,
	// with the breaker's lock held: it must be quick and must not call the
	// breaker's store methods (State is fine). A gauge can be kept from
	// it, or read State at each scrape.
	OnStateChange func(from, to BreakerState)
	// Logger receives one line when the breaker opens (warn) and one when
	// it closes again (info); the probe's half-open attempts in between are
	// logged at debug. The zero Logger discards everything.
	Logger zerolog.Logger
}

// Breaker is a circuit breaker for a shared store (Redis): the limiter asks
// it before every store call (Allow) and tells it the outcome (Done). It is
// an option of the limiter, not a wrapper of the store. It is safe for
// concurrent use; in the closed state Allow and Done are a few atomic
// operations and allocate nothing, and refusing a call while open
// allocates nothing either.
type Breaker struct {
	ping func(context.Context) error
	name string
	opts BreakerOptions

	// sg packs the generation (bumped on every transition) and the state:
	// gen<<2 | state. A call remembers the value it started under, so that
	// a late result from an earlier period changes nothing.
	sg atomic.Uint64
	// fails counts consecutive failures while closed; since is when the
	// first of them was seen (UnixNano), 0 when there is none.
	fails atomic.Int64
	since atomic.Int64
	// starved counts failures that would have opened the breaker but
	// were timeouts while the process was short of CPU (Starved);
	// starvedSince is when the first of them since the last success or
	// transition was excused, starvedLog when that was last logged
	// (UnixNano).
	starved      atomic.Uint64
	starvedSince atomic.Int64
	starvedLog   atomic.Int64
	// trials counts calls in flight in the half-open state; successes the
	// half-open successes of the current generation.
	trials    atomic.Int32
	successes atomic.Int32
	// openErr is what refused calls return: ErrBreakerOpen plus the failure
	// that opened the breaker. Built once per opening, so refusing a call
	// allocates nothing.
	openErr atomic.Pointer[openError]

	mu       sync.Mutex // serializes transitions and the fields below
	openedAt time.Time  // start of the current outage (first opening)
	reopens  int        // half-open trials that failed during this outage
	closed   bool

	ctx    context.Context // canceled by Close; parent of every probe
	cancel context.CancelFunc
	wg     sync.WaitGroup // the prober
	once   sync.Once
}

// Ticket is what Allow hands out and Done takes back: the state a call
// started under.
type Ticket struct {
	v     uint64
	trial bool
}

// NewBreaker returns a closed breaker for the store that ping reaches (the
// probe of an open breaker calls it); name describes the store in logs.
func NewBreaker(ping func(context.Context) error, name string, opts BreakerOptions) *Breaker {
	if opts.FailureThreshold <= 0 {
		opts.FailureThreshold = DefaultFailureThreshold
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = DefaultProbeInterval
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = DefaultProbeTimeout
	}
	switch {
	case opts.OpenAfter == 0:
		opts.OpenAfter = opts.ProbeTimeout
	case opts.OpenAfter < 0:
		opts.OpenAfter = 0
	}
	if opts.HalfOpenTrials <= 0 {
		opts.HalfOpenTrials = DefaultHalfOpenTrials
	}
	if opts.IsTimeout == nil {
		opts.IsTimeout = isTimeout
	}
	if opts.IsFailure == nil {
		opts.IsFailure = isFailure
	}
	b := &Breaker{ping: ping, name: name, opts: opts}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.openErr.Store(&openError{msg: ErrBreakerOpen.Error()})
	return b
}

// isFailure is the default failure test: any error but a caller that gave
// up (context.Canceled).
func isFailure(err error) bool {
	return err != nil && !errors.Is(err, context.Canceled)
}

// openError is ErrBreakerOpen with the failure that opened the breaker.
type openError struct{ msg string }

func (e *openError) Error() string        { return e.msg }
func (e *openError) Is(target error) bool { return target == ErrBreakerOpen }

func pack(gen uint64, s BreakerState) uint64 { return gen<<2 | uint64(s) }
func stateOf(v uint64) BreakerState          { return BreakerState(v & 3) }

// State returns the current state.
func (b *Breaker) State() BreakerState { return stateOf(b.sg.Load()) }

// Open reports whether calls are refused now (open, or half-open with
// every trial taken is not counted: a half-open breaker is trying).
func (b *Breaker) Open() bool { return b.State() == BreakerOpen }

// OpenError returns the error refused calls get while open, nil otherwise.
func (b *Breaker) OpenError() error {
	if b.State() == BreakerOpen {
		return b.openErr.Load()
	}
	return nil
}

// Close stops the probe. It may be called more than once.
func (b *Breaker) Close() {
	b.once.Do(func() {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
		b.cancel()
		b.wg.Wait()
	})
}

// Allow decides whether a call may go to the store now. When it may, the
// caller must pass the ticket and the call's error to Done; when not, the
// error (wrapping ErrBreakerOpen) says why.
func (b *Breaker) Allow() (Ticket, error) {
	v, trial, err := b.admit()
	return Ticket{v: v, trial: trial}, err
}

// Done records the outcome of a call Allow let through.
func (b *Breaker) Done(t Ticket, err error) { b.record(t.v, t.trial, err) }

// admit decides whether a call may go to the store. It returns the state
// word the call runs under and whether it is a half-open trial.
func (b *Breaker) admit() (v uint64, trial bool, err error) {
	v = b.sg.Load()
	switch stateOf(v) {
	case BreakerClosed:
		return v, false, nil
	case BreakerHalfOpen:
		if b.trials.Add(1) <= int32(b.opts.HalfOpenTrials) {
			return v, true, nil
		}
		b.trials.Add(-1)
	}
	return 0, false, b.openErr.Load()
}

// record counts a call's outcome against the state it started under.
func (b *Breaker) record(v uint64, trial bool, err error) {
	if trial {
		b.trials.Add(-1)
	}
	failed := err != nil && b.opts.IsFailure(err)
	if b.sg.Load() != v {
		return // the breaker moved on while the call ran
	}
	switch stateOf(v) {
	case BreakerClosed:
		if !failed {
			if b.fails.Load() != 0 {
				b.fails.Store(0)
				b.since.Store(0)
				b.starvedSince.Store(0)
			}
			return
		}
		now := time.Now().UnixNano()
		b.since.CompareAndSwap(0, now) // the first failure of a streak
		if b.fails.Add(1) >= int64(b.opts.FailureThreshold) && now-b.since.Load() >= int64(b.opts.OpenAfter) && !b.starvedTimeout(err) {
			b.transition(v, BreakerOpen, err)
		}
	case BreakerHalfOpen:
		if errors.Is(err, context.Canceled) {
			// the caller gave up: the trial says nothing of the store, and
			// its slot (returned above) goes to the next request
			return
		}
		if failed {
			if !b.starvedTimeout(err) {
				b.transition(v, BreakerOpen, err)
			}
		} else if b.successes.Add(1) >= int32(b.opts.HalfOpenTrials) {
			b.transition(v, BreakerClosed, nil)
		}
	}
}

// starvedGrace is how long timeouts while short of CPU may keep the
// breaker from opening: a Redis that froze while rategate was overloaded
// must still be taken for down, within about a second.
const starvedGrace = time.Second

// starvedTimeout reports whether err, a failure that would open the
// breaker, is a timeout while the process is short of CPU (Starved), and
// the first such excuse since the last success or transition is younger
// than starvedGrace: it is counted, and logged at most every 10 s.
func (b *Breaker) starvedTimeout(err error) bool {
	if b.opts.Starved == nil || !b.opts.IsTimeout(err) || !b.opts.Starved() {
		return false
	}
	now := time.Now().UnixNano()
	b.starvedSince.CompareAndSwap(0, now)
	if now-b.starvedSince.Load() >= int64(starvedGrace) {
		return false
	}
	b.starved.Add(1)
	if last := b.starvedLog.Load(); now-last >= int64(10*time.Second) && b.starvedLog.CompareAndSwap(last, now) {
		b.opts.Logger.Warn().Err(err).Str("store", b.name).
			Msg("decisions time out while this process is short of CPU: the store is not taken for down (the breaker stays as it is); " +
				"those requests are decided by the local fallback. Give rategate more CPU or instances")
	}
	return true
}

// Starved returns how many failures did not open the breaker because they
// were timeouts while the process was short of CPU.
func (b *Breaker) Starved() uint64 { return b.starved.Load() }

// isTimeout reports a deadline that passed: the context's, or an I/O
// deadline of the connection.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// transition moves the breaker from the state word from to state to, unless
// another transition came first. cause is the failure that opens it.
func (b *Breaker) transition(from uint64, to BreakerState, cause error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sg.Load() != from || b.closed {
		return
	}
	prev := stateOf(from)
	next := pack(from>>2+1, to)
	now := time.Now()
	b.starvedSince.Store(0)
	log := b.opts.Logger
	switch to {
	case BreakerOpen:
		msg := ErrBreakerOpen.Error()
		if cause != nil {
			msg += ": " + cause.Error()
		}
		b.openErr.Store(&openError{msg: msg})
		if prev == BreakerClosed {
			b.openedAt, b.reopens = now, 0
			log.Warn().Str("store", b.name).Int64("failures", b.fails.Load()).
				AnErr("last_error", cause).Str("probe_interval", b.opts.ProbeInterval.String()).
				Msg("store circuit breaker open: answering by failure_mode without waiting for the store; probing in the background")
		} else {
			b.reopens++
			log.Debug().Str("store", b.name).AnErr("error", cause).
				Msg("store circuit breaker: trial call failed; open again")
		}
	case BreakerHalfOpen:
		b.successes.Store(0)
		log.Debug().Str("store", b.name).Msg("store circuit breaker half-open: the store answers a probe; trying real calls")
	case BreakerClosed:
		b.fails.Store(0)
		b.since.Store(0)
		log.Info().Str("store", b.name).Str("outage", now.Sub(b.openedAt).Round(time.Millisecond).String()).Int("failed_trials", b.reopens).
			Msg("store circuit breaker closed: the store answers again")
	}
	b.sg.Store(next)
	if to == BreakerOpen {
		b.wg.Add(1)
		go b.probe(next)
	}
	if b.opts.OnStateChange != nil {
		b.opts.OnStateChange(prev, to)
	}
}

// probe pings the store every ProbeInterval while the breaker stays in the
// open state word v, and moves it to half-open when a ping succeeds.
func (b *Breaker) probe(v uint64) {
	defer b.wg.Done()
	t := time.NewTimer(b.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		if b.sg.Load() != v {
			return
		}
		ctx, cancel := context.WithTimeout(b.ctx, b.opts.ProbeTimeout)
		err := b.ping(ctx)
		cancel()
		if err == nil {
			b.transition(v, BreakerHalfOpen, nil)
			return
		}
		t.Reset(b.opts.ProbeInterval)
	}
}
