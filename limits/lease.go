package limits

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"hash/maphash"
	"math"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rategate/rategate/internal/tick"
)

// Leases: exact quota for hot keys (rules with lease: true).
//
// A global limit lives on one key and so on one Redis core, whatever the
// cluster. A leased rule is decided from this instance's memory instead: the
// instance takes a slice of the key's remaining quota from the store in one
// atomic script run (lua/lease.lua), spends it locally, and takes the next
// slice before it runs out. What is leased is already counted in the store,
// so the sum of what every instance admits never exceeds the limit; see
// docs/algorithms.md ("Leases") for the argument per algorithm and
// docs/scaling.md for the cost.
//
// The instance's side, here:
//
//   - One entry per leased key this instance decides, holding its slices
//     (oldest first) and avail, the units it may still spend. A decision
//     spends with one compare-and-swap on avail, after checking that the
//     oldest slice has not ended (until). Units are fungible: the oldest
//     slice is taken to be spent first, so when it ends, what it still
//     holds is what avail has beyond the units of the later slices. The
//     slices of a window algorithm are all of one window: a grant the
//     store counted in a later window (a take sent just before the end,
//     run just after) ends the earlier window's slices at once.
//   - Slices are sized to what this instance spent in the last Horizon,
//     measured between takes, growing at most twice as fast as the last
//     grant and never beyond 1/8 of the limit (windows) or burst (buckets),
//     nor beyond what this rate spends before the window ends or the slice's
//     TTL. A quiet instance asks for what each request needs; a busy one
//     asks about every Horizon/2. Only spends count, and a request another
//     rule denies gives its unit back: a client cannot make an instance
//     lease more than it really admits.
//   - When avail falls below half the last grant the next slice is taken in
//     the background (one take in flight per key; a decision that finds none
//     left waits for it, or takes itself). When the store has nothing left
//     to lease, the key is denied here until the store's retry time (at
//     most Recheck, so that units others give back are found).
//   - Unspent units go back to the store when a key is idle (Idle), when a
//     rule's numbers change (SetRules), when a bucket's slice nears its
//     TTL, when a sliding_window slice's window ends (into what is then the
//     previous count), and at shutdown (ReturnLeases). fixed_window units
//     left at the end of their window are wasted (their count is gone).
//   - Memory is bounded: at most MaxKeys entries; a full table returns the
//     least recently used of a few and reuses its room.
//
// A multi-rule request spends its leased rules first, then asks the store
// for the others; when one of those denies (or a leased rule has nothing
// left), the spent units are given back here, so the request consumes
// nothing. A leased denial is never put in the deny cache: units another
// instance gives back can make a key admit earlier than a denial's retry.

// Leaser is a store that can lease slices of a key's quota: the Redis store
// and the memory store are. The limiter is handed one at wiring (Options).
type Leaser interface {
	// TakeLease leases between t.Check.Cost (need) and t.Want units of
	// t.Check's key, or none when need does not fit.
	TakeLease(ctx context.Context, t *LeaseTake) (LeaseGrant, error)
	// ReturnLease gives back the unspent units of slices of one key and
	// reports how many units went back.
	ReturnLease(ctx context.Context, r *LeaseReturn) (int64, error)
	// ResetLease is the admin reset of a leased key: everything is reset
	// but what the live slices hold.
	ResetLease(ctx context.Context, c Check, nowUS int64) error
	// LookLease lists the live slices of a key, every instance's.
	LookLease(ctx context.Context, c Check, nowUS int64) (LeaseLook, error)
}

// LeaseTake asks for a slice.
type LeaseTake struct {
	// Check names the key, algorithm and numbers; Cost is need, the units
	// the caller spends at once (>= 1).
	Check Check
	// Want is how many units the caller asks for (>= need).
	Want int64
	// ID names the new slice ("<instance>-<n>").
	ID string
	// TTLUS is how long a gcra or token_bucket slice may be spent.
	TTLUS int64
	// Settle lists this holder's slices of the key spent to the last unit.
	Settle []string
	// NowUS, when non-zero, replaces the store's clock (tests).
	NowUS int64
}

// LeaseGrant is a take's answer.
type LeaseGrant struct {
	// Granted is the units leased, 0 when need did not fit.
	Granted int64
	// NowUS is the store's clock when it decided; UntilUS the store time
	// the slice may be spent until (exclusive).
	NowUS, UntilUS int64
	// Result is need's verdict: Remaining is the store's quota left after
	// the grant; when nothing was granted, RetryUS is when need fits.
	Result Result
}

// LeaseReturn gives back slices of one key.
type LeaseReturn struct {
	Check  Check
	Slices []SliceReturn
	NowUS  int64
}

// SliceReturn is one slice given back with the units not spent.
type SliceReturn struct {
	ID      string
	Unspent int64
}

// LeaseLook is what the store says is leased of a key.
type LeaseLook struct {
	NowUS  int64
	Slices []LeasedSlice
}

// LeasedSlice is one live slice in the store.
type LeasedSlice struct {
	ID               string
	Granted, UntilUS int64
}

// LeaseOptions configures a limiter's leases. Zero fields take defaults.
type LeaseOptions struct {
	// Horizon: a slice is what this instance spends in about this long.
	Horizon time.Duration
	// TTL is how long a gcra or token_bucket slice may be spent; it bounds
	// how long a dead instance's slice holds the bucket's cap.
	TTL time.Duration
	// Idle: the slices of a key no request asked for this long go back.
	Idle time.Duration
	// Recheck bounds how long a key the store had nothing to lease for is
	// denied here before the store is asked again.
	Recheck time.Duration
	// MaxKeys bounds the keys this instance holds an entry for.
	MaxKeys int
	// Timeout bounds a background take or return.
	Timeout time.Duration
	// Instance names this instance's slices; default a random hex id.
	Instance string
	// SyncPrefetch takes the next slice on the deciding goroutine, at the
	// decision's clock (tests that drive the store's clock).
	SyncPrefetch bool
}

// Defaults of LeaseOptions.
const (
	DefaultLeaseHorizon = 50 * time.Millisecond
	DefaultLeaseTTL     = 2 * time.Second
	DefaultLeaseIdle    = 500 * time.Millisecond
	DefaultLeaseRecheck = 250 * time.Millisecond
	DefaultLeaseMaxKeys = 10_000
	DefaultLeaseTimeout = time.Second
	// leaseSweepEvery is how often RunLeases sweeps the entries.
	leaseSweepEvery = 100 * time.Millisecond
	// leaseSettleAfter: a window's slice spent to the last unit is taken
	// out of the store's record this long after (settleSpent), when
	// requests that spent from it have decided their other rules.
	leaseSettleAfter = time.Second
	// leaseSliceShare: a slice is at most 1/leaseSliceShare of the limit
	// (windows) or burst (buckets), at least 1.
	leaseSliceShare = 8
	leaseShards     = 32
	// leaseJobQueue bounds the returns waiting for the sweeper in its
	// channel; those it has no room for wait in leaseTable.over.
	leaseJobQueue = 4096
	// leasePrefetches bounds the background takes in flight.
	leasePrefetches = 64
	// leaseReturnRetry: a return the store fails is tried again at every
	// sweep for this long (a return runs at most once per slice, so trying
	// again is safe), then its units are wasted.
	leaseReturnRetry = time.Minute
	// leaseMaxStatsRules bounds the rule names with stats of their own.
	leaseMaxStatsRules = 1000
)

func (o LeaseOptions) withDefaults() LeaseOptions {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Horizon, DefaultLeaseHorizon)
	def(&o.TTL, DefaultLeaseTTL)
	def(&o.Idle, DefaultLeaseIdle)
	def(&o.Recheck, DefaultLeaseRecheck)
	def(&o.Timeout, DefaultLeaseTimeout)
	if o.MaxKeys <= 0 {
		o.MaxKeys = DefaultLeaseMaxKeys
	}
	if o.Instance == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		o.Instance = hex.EncodeToString(b[:])
	}
	return o
}

// errLeasesClosed answers takes after ReturnLeases.
var errLeasesClosed = errors.New("leases closed: rategate is shutting down")

// errLeaseBusy answers a decision whose key's entry kept being replaced,
// or that kept finding the takes it waited for spent by others.
var errLeaseBusy = errors.New("lease: no slice for this decision after many tries (the key's entry kept being replaced, or others spent every take it waited for)")

// leaseTable is a limiter's leases.
type leaseTable struct {
	store    Leaser
	opt      LeaseOptions
	start    time.Time
	seed     maphash.Seed
	shards   [leaseShards]leaseShard
	perShard int
	seq      atomic.Uint64
	closed   atomic.Bool
	jobs     chan *leaseJob
	// over holds the returns the channel had no room for, up to two per
	// key the table may hold: one sweep, or one rule change, can end every
	// entry at once, and a return dropped leaves its units counted until
	// the window ends (idle identities refused before their limit).
	overMu   sync.Mutex
	over     []*leaseJob
	prefetch chan struct{}
	// bg counts the background takes in flight (ReturnLeases waits).
	bg sync.WaitGroup

	statsMu sync.Mutex
	stats   atomic.Pointer[map[string]*leaseRuleStats]
	other   *leaseRuleStats
}

type leaseShard struct {
	mu sync.RWMutex
	m  map[string]*leaseEntry
	_  [32]byte
}

// leaseRuleStats counts one rule's leases (LeaseStats).
type leaseRuleStats struct {
	name                                  string
	takes, units, returned, wasted        atomic.Int64
	servedLocal, servedTake, deniedLocal  atomic.Int64
	takeDenied, takeFailed, returnsFailed atomic.Int64
}

// leaseEntry is this instance's lease of one key.
type leaseEntry struct {
	key    string
	bucket bool
	stats  *leaseRuleStats
	rule   atomic.Pointer[Rule]
	// avail is the units that may be spent, until the local time (µs) the
	// oldest slice ends (0: none), epoch bumped whenever slices go.
	avail atomic.Int64
	until atomic.Int64
	epoch atomic.Uint64
	// lastUse is the local time of the last decision; spent the units
	// spent since the last take began (the rate); low the avail below
	// which the next slice is taken; storeRem and resetAt what the store
	// said at the last take (remaining, and the local time of its reset).
	lastUse     atomic.Int64
	spent       atomic.Int64
	low         atomic.Int64
	storeRem    atomic.Int64
	resetAt     atomic.Int64
	prefetching atomic.Bool

	mu     sync.Mutex
	slices []heldSlice
	// settle: the slices to take out of the store's record with the next
	// take; settling: a window's slices spent to the last unit, not yet
	// settled (settleSpent).
	settle   []string
	settling []spentSlice
	dead     bool
	inflight chan struct{}
	// exhausted: the store had no need units to lease until exUntil
	// (local µs); its answer, retry at exRetryAt.
	exUntil, exRetryAt, exNeed int64
	exResult                   Result
	lastGrant, lastTake        int64
	rate                       float64 // units per µs between the last two takes
}

// spentSlice is a window slice spent to the last unit at (local µs).
type spentSlice struct {
	id          string
	at, granted int64
}

// heldSlice is one slice this instance holds.
type heldSlice struct {
	id      string
	granted int64
	// until is the local time (µs) it may be spent before; window, for
	// the window algorithms, the store time its window ends (all the
	// slices an entry holds are of one window).
	until, window int64
}

// leaseJob gives slices of one key back.
type leaseJob struct {
	check  Check
	slices []SliceReturn
	stats  *leaseRuleStats
	// failedAt is the leases' clock at its first failed try (0: none).
	failedAt int64
}

func newLeaseTable(store Leaser, opt LeaseOptions) *leaseTable {
	opt = opt.withDefaults()
	lt := &leaseTable{
		store:    store,
		opt:      opt,
		start:    time.Now(),
		seed:     maphash.MakeSeed(),
		perShard: max(opt.MaxKeys/leaseShards, 1),
		jobs:     make(chan *leaseJob, leaseJobQueue),
		prefetch: make(chan struct{}, leasePrefetches),
	}
	for i := range lt.shards {
		lt.shards[i].m = make(map[string]*leaseEntry)
	}
	empty := map[string]*leaseRuleStats{}
	lt.stats.Store(&empty)
	lt.other = &leaseRuleStats{name: "_other"}
	return lt
}

// clock is the leases' time in µs: nowUS when a test drives the store's
// clock, otherwise this process's monotonic clock (never 0).
func (lt *leaseTable) clock(nowUS int64) int64 {
	if nowUS != 0 {
		return nowUS
	}
	return int64(time.Since(lt.start)/time.Microsecond) + 1_000_000
}

// wall is the wall clock in µs, to size a slice to its window's end (the
// store's windows are aligned to its own clock, which NTP keeps close).
func wall(nowUS int64) int64 {
	if nowUS != 0 {
		return nowUS
	}
	return time.Now().UnixMicro()
}

func (lt *leaseTable) shard(key string) *leaseShard {
	return &lt.shards[maphash.String(lt.seed, key)%leaseShards]
}

func (lt *leaseTable) ruleStats(name string) *leaseRuleStats {
	if st := (*lt.stats.Load())[name]; st != nil {
		return st
	}
	lt.statsMu.Lock()
	defer lt.statsMu.Unlock()
	old := *lt.stats.Load()
	if st := old[name]; st != nil {
		return st
	}
	if len(old) >= leaseMaxStatsRules {
		return lt.other
	}
	next := make(map[string]*leaseRuleStats, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	st := &leaseRuleStats{name: name}
	next[name] = st
	lt.stats.Store(&next)
	return st
}

// sameNumbers reports whether slices taken under rule a may be spent under b.
func sameNumbers(a, b *Rule) bool {
	return b.Lease && a.Algorithm == b.Algorithm && a.Limit == b.Limit && a.Period == b.Period && a.Burst == b.Burst
}

// floorDiv is x / y rounded toward minus infinity (y > 0).
func floorDiv(x, y int64) int64 {
	q := x / y
	if x%y < 0 {
		q--
	}
	return q
}

// capacity is what a rule can admit at once: its burst or its limit.
func capacity(r *Rule) int64 {
	if r.Algorithm.UsesBurst() {
		return r.Burst
	}
	return r.Limit
}

// entry returns key's entry for rule r, creating it, or replacing one taken
// under other numbers.
func (lt *leaseTable) entry(key string, r *Rule, now int64) *leaseEntry {
	sh := lt.shard(key)
	sh.mu.RLock()
	e := sh.m[key]
	sh.mu.RUnlock()
	if e != nil {
		if r0 := e.rule.Load(); r0 == r {
			return e
		} else if sameNumbers(r0, r) {
			e.rule.Store(r)
			return e
		}
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if cur := sh.m[key]; cur != nil {
		if r0 := cur.rule.Load(); r0 == r || sameNumbers(r0, r) {
			cur.rule.Store(r)
			return cur
		}
		lt.kill(cur)
		delete(sh.m, key)
	}
	if len(sh.m) >= lt.perShard {
		// Full: give back the least recently used of a few.
		var victim *leaseEntry
		n := 0
		for _, c := range sh.m {
			if victim == nil || c.lastUse.Load() < victim.lastUse.Load() {
				victim = c
			}
			if n++; n >= 8 {
				break
			}
		}
		lt.kill(victim)
		delete(sh.m, victim.key)
	}
	e = &leaseEntry{key: key, bucket: r.Algorithm.UsesBurst(), stats: lt.ruleStats(r.Name)}
	e.rule.Store(r)
	e.lastUse.Store(now)
	sh.m[key] = e
	return e
}

// killLocked ends e: nothing more is spent from it. It returns the job
// that gives back what e held (nil: nothing to tell the store). e.mu is
// held; the caller removes e from its shard.
func (lt *leaseTable) killLocked(e *leaseEntry) *leaseJob {
	if e.dead {
		return nil
	}
	e.dead = true
	left := e.avail.Swap(0)
	e.until.Store(0)
	e.epoch.Add(1)
	j := lt.jobLocked(e, left)
	e.slices, e.settle, e.settling = nil, nil, nil
	return j
}

// kill ends e and queues the return of what it held.
func (lt *leaseTable) kill(e *leaseEntry) {
	e.mu.Lock()
	j := lt.killLocked(e)
	e.mu.Unlock()
	if j != nil {
		lt.queue(j)
	}
}

// jobLocked builds the return of all of e's slices holding left unspent
// units in all (the newest slices hold them: the oldest are spent first),
// plus the slices to settle; nil when there is nothing to tell the store.
func (lt *leaseTable) jobLocked(e *leaseEntry, left int64) *leaseJob {
	r := e.rule.Load()
	j := &leaseJob{check: r.Check(e.key, 0), stats: e.stats}
	for i := len(e.slices) - 1; i >= 0; i-- {
		s := &e.slices[i]
		u := min(left, s.granted)
		left -= u
		// a spent slice is settled too: a bucket's cap holds its units
		// until the store hears, and a window's record keeps it until
		// the window ends
		j.slices = append(j.slices, SliceReturn{ID: s.id, Unspent: u})
	}
	for _, id := range e.settle {
		j.slices = append(j.slices, SliceReturn{ID: id})
	}
	for _, sp := range e.settling {
		j.slices = append(j.slices, SliceReturn{ID: sp.id})
	}
	if len(j.slices) == 0 {
		return nil
	}
	return j
}

func unspentOf(j *leaseJob) int64 {
	var n int64
	for _, s := range j.slices {
		n += s.Unspent
	}
	return n
}

// queue hands j to the sweeper; past the channel it waits in lt.over, and
// only past that bound is it wasted.
func (lt *leaseTable) queue(j *leaseJob) {
	select {
	case lt.jobs <- j:
		return
	default:
	}
	lt.overMu.Lock()
	if len(lt.over) < 2*lt.opt.MaxKeys {
		lt.over = append(lt.over, j)
		j = nil
	}
	lt.overMu.Unlock()
	if j != nil {
		j.stats.wasted.Add(unspentOf(j))
	}
}

// nextJob returns a queued return (the channel's first, then the
// overflow's), or nil when none waits. more is the caller's share of the
// overflow taken so far.
func (lt *leaseTable) nextJob(more *[]*leaseJob) *leaseJob {
	select {
	case j := <-lt.jobs:
		return j
	default:
	}
	if len(*more) == 0 {
		lt.overMu.Lock()
		*more, lt.over = lt.over, nil
		lt.overMu.Unlock()
	}
	if len(*more) == 0 {
		return nil
	}
	j := (*more)[0]
	*more = (*more)[1:]
	return j
}

// clamp lowers avail to at most n and returns by how much.
func (e *leaseEntry) clamp(n int64) int64 {
	for {
		a := e.avail.Load()
		if a <= n {
			return 0
		}
		if e.avail.CompareAndSwap(a, n) {
			return a - n
		}
	}
}

// expireLocked drops e's slices that ended by now: what each still held is
// returned (sliding_window: into the count it is now the previous of) or
// wasted (fixed_window's count is gone; a bucket counts it spent); and the
// oldest slices spent to the last unit (a bucket's is settled with the next
// take). e.mu is held.
func (lt *leaseTable) expireLocked(e *leaseEntry, now int64) {
	// changed: until moves; bump: a give back of a unit spent before must
	// be refused (it could outlive what it was spent from).
	changed, bump := false, false
	for len(e.slices) > 0 {
		s := e.slices[0]
		var later int64
		for _, t := range e.slices[1:] {
			later += t.granted
		}
		if s.until > now {
			if e.avail.Load() <= later && e.inflight == nil && (e.bucket || len(e.slices) > 1) {
				// Spent to the last unit: forgotten. A bucket's is
				// settled with the next take, and then no unit of it may
				// come back (bump). A window's other slices are of the
				// same window, so a unit given back after this is as
				// good in them (giveBack wants one of them live); its
				// newest slice is kept until its window ends, for the
				// units of requests another rule may yet deny. A
				// window's is settled once leaseSettleAfter has passed
				// (settleSpent): its record would otherwise keep a field
				// per slice until the window ends (an hour's window on a
				// busy instance: some 72,000, every one read by every
				// take). avail never holds more than the slices still in
				// the record (heldLocked), which is what an admin reset
				// keeps counted (103 admitted at a limit of 100 when a
				// unit spent from a settled slice came back on top). Not
				// while a take is out: its
				// decision may have reserved what avail held (avail is 0
				// meanwhile), and puts it back if the store has nothing
				// to lease, into these slices.
				e.slices = e.slices[1:]
				if e.bucket {
					e.settle = append(e.settle, s.id)
					bump = true
				} else {
					e.settling = append(e.settling, spentSlice{id: s.id, at: now, granted: s.granted})
				}
				changed = true
				continue
			}
			break
		}
		unspent := e.clamp(later)
		e.slices = e.slices[1:]
		changed, bump = true, true
		if unspent == 0 {
			continue
		}
		r := e.rule.Load()
		if r.Algorithm == SlidingWindow {
			lt.queue(&leaseJob{check: r.Check(e.key, 0), slices: []SliceReturn{{ID: s.id, Unspent: unspent}}, stats: e.stats})
		} else {
			e.stats.wasted.Add(unspent)
		}
	}
	if e.settleSpent(now) {
		// what the settled slices held leaves avail with them
		e.stats.wasted.Add(e.clamp(e.heldLocked()))
	}
	if bump {
		e.epoch.Add(1)
	}
	if changed {
		if len(e.slices) > 0 {
			e.until.Store(e.slices[0].until)
		} else {
			e.until.Store(0)
		}
	}
}

// settleSpent moves the window slices spent to the last unit at least
// leaseSettleAfter ago to e.settle, and reports whether it moved any: the
// store stops counting them with the next take, so avail may hold no more
// than the slices left do (the caller clamps it; giveBack never adds
// past it). e.mu is held.
func (e *leaseEntry) settleSpent(now int64) bool {
	n := 0
	for n < len(e.settling) && now-e.settling[n].at >= PeriodUS(leaseSettleAfter) {
		e.settle = append(e.settle, e.settling[n].id)
		n++
	}
	e.settling = e.settling[n:]
	return n > 0
}

// trySpend spends cost units if the slices allow, without locking. The
// epoch read first is the one a give back must find unchanged.
func (e *leaseEntry) trySpend(cost, now int64) (uint64, bool) {
	ep := e.epoch.Load()
	if now >= e.until.Load() {
		return 0, false
	}
	for {
		a := e.avail.Load()
		if a < cost {
			return 0, false
		}
		if e.avail.CompareAndSwap(a, a-cost) {
			e.spent.Add(cost)
			return ep, true
		}
	}
}

// giveBack returns cost units a request spent at now (another rule denied
// it), as long as no slice they could belong to went since and a slice of
// theirs is still live: otherwise they are left unspent for good.
func (e *leaseEntry) giveBack(cost int64, ep uint64, now int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dead || e.epoch.Load() != ep || now >= e.until.Load() {
		return
	}
	// never more than the slices the store's record still counts for
	// this instance hold (an admin reset keeps exactly those)
	back := min(cost, e.heldLocked()-e.avail.Load())
	if back <= 0 {
		return
	}
	e.avail.Add(back)
	e.spent.Add(-back)
}

// heldLocked is what the slices the store's record counts for e hold:
// the live ones and the spent ones not yet settled. e.mu is held.
func (e *leaseEntry) heldLocked() int64 {
	var n int64
	for _, s := range e.slices {
		n += s.granted
	}
	for _, s := range e.settling {
		n += s.granted
	}
	return n
}

// allowed is the Result of a spend: the store's remaining at the last take
// and what this instance holds, the store's reset aged.
func (e *leaseEntry) allowed(r *Rule, now int64) Result {
	return Result{Allowed: true, Remaining: min(max(e.storeRem.Load()+e.avail.Load(), 0), capacity(r)),
		ResetUS: max(e.resetAt.Load()-now, 0)}
}

// sizeLocked returns how many units to ask for when need are needed, and
// restarts the rate measure. e.mu is held.
func (lt *leaseTable) sizeLocked(e *leaseEntry, r *Rule, need, now, wallUS int64) int64 {
	spent := e.spent.Swap(0)
	if e.lastTake > 0 && now > e.lastTake {
		e.rate = float64(max(spent, 0)) / float64(now-e.lastTake)
	}
	e.lastTake = now
	extra := int64(e.rate * float64(lt.opt.Horizon/time.Microsecond))
	extra = min(extra, 2*e.lastGrant+1, max(capacity(r)/leaseSliceShare, 1))
	if r.Algorithm.UsesBurst() {
		extra = min(extra, int64(e.rate*float64(lt.opt.TTL/time.Microsecond)))
	} else {
		p := PeriodUS(r.Period)
		extra = min(extra, int64(e.rate*float64(floorDiv(wallUS, p)*p+p-wallUS)))
	}
	return need + max(extra, 0)
}

func (lt *leaseTable) newID() string {
	return lt.opt.Instance + "-" + strconv.FormatUint(lt.seq.Add(1), 36)
}

// takeLocked takes a slice for e and applies the answer; it releases and
// retakes e.mu around the store call. need units of the grant are spent at
// once (0 for a prefetch, which asks for at least 1), on top of reserved
// units the caller already took from e's slices. covered reports that the
// caller's need and reserved units stand; it is false when the grant came
// from a later window than e's slices (the take ran after their window
// ended in the store's time): those slices end at once, reserved units
// with them, and the grant goes into avail whole unless it covers the
// caller's need and reserved units by itself.
func (lt *leaseTable) takeLocked(ctx context.Context, l *Limiter, e *leaseEntry, r *Rule, need, reserved, now, nowUS int64) (g LeaseGrant, covered, fresh bool, err error) {
	if lt.closed.Load() {
		return LeaseGrant{}, false, false, errLeasesClosed
	}
	ask := max(need, 1)
	want := lt.sizeLocked(e, r, ask, now, wall(nowUS))
	settle := e.settle
	e.settle = nil
	done := make(chan struct{})
	e.inflight = done
	t := &LeaseTake{Check: r.Check(e.key, ask), Want: want, ID: lt.newID(), TTLUS: PeriodUS(lt.opt.TTL),
		Settle: settle, NowUS: nowUS}
	e.mu.Unlock()
	refused, err := l.call(OpLease, func() (err error) {
		g, err = lt.store.TakeLease(ctx, t)
		return err
	})
	if refused != nil {
		err = refused
	}
	e.mu.Lock()
	e.inflight = nil
	close(done)
	switch {
	case err != nil:
		e.settle = append(e.settle, settle...)
		e.stats.takeFailed.Add(1)
		return g, false, false, err
	case g.Granted <= 0:
		e.stats.takeDenied.Add(1)
		retry := g.Result.RetryUS
		e.exNeed, e.exResult = ask, g.Result
		// The store's retry and reset count from when it decided, which
		// is after now by up to the round trip: counted from the reply,
		// a local denial's Retry-After is never short.
		at := lt.clock(nowUS)
		switch {
		case retry == NeverFits:
			e.exRetryAt, e.exUntil = math.MaxInt64, now+PeriodUS(lt.opt.Recheck)
		case retry > 0:
			hold := retry
			if nowUS == 0 {
				hold -= retry >> driftShift
			}
			e.exRetryAt, e.exUntil = at+retry, now+min(hold, PeriodUS(lt.opt.Recheck))
		default:
			e.exRetryAt, e.exUntil = now, now
		}
		e.storeRem.Store(g.Result.Remaining)
		e.resetAt.Store(at + g.Result.ResetUS)
		return g, false, false, nil
	}
	e.stats.takes.Add(1)
	e.stats.units.Add(g.Granted)
	span := g.UntilUS - g.NowUS
	if nowUS == 0 {
		span -= span >> driftShift
	}
	sl := heldSlice{id: t.ID, granted: g.Granted, until: now + span, window: g.UntilUS}
	if e.dead {
		// Killed while the take was out: give it all back.
		lt.queue(&leaseJob{check: t.Check, slices: []SliceReturn{{ID: t.ID, Unspent: g.Granted - need}}, stats: e.stats})
		return g, true, false, nil
	}
	covered = true
	keep := g.Granted - need
	if !e.bucket && len(e.slices) > 0 && g.UntilUS > e.slices[len(e.slices)-1].window {
		// The store counted this grant in a later window: the slices of
		// the earlier one cannot be spent any more (nor what the caller
		// reserved of them), and nothing of two windows may mix.
		lt.endWindowLocked(e, reserved)
		covered = g.Granted >= need+reserved
		fresh = covered
		if covered {
			keep = g.Granted - need - reserved
		} else {
			keep = g.Granted
		}
	}
	i := sort.Search(len(e.slices), func(i int) bool { return e.slices[i].until > sl.until })
	e.slices = append(e.slices, heldSlice{})
	copy(e.slices[i+1:], e.slices[i:])
	e.slices[i] = sl
	e.until.Store(e.slices[0].until)
	e.avail.Add(keep)
	e.low.Store(g.Granted / 2)
	// The growth cap follows the grants, but one cut short (a window's
	// end, a denial's remainder) halves it rather than resetting it.
	e.lastGrant = max(g.Granted, e.lastGrant/2)
	e.exUntil = 0
	e.storeRem.Store(g.Result.Remaining)
	e.resetAt.Store(lt.clock(nowUS) + g.Result.ResetUS) // from the reply, as a denial's
	return g, covered, fresh, nil
}

// endWindowLocked ends every slice of e (a window's, whose window has
// ended in the store's time) at once: what they hold, plus extra units a
// caller reserved of them, is returned (sliding_window, into what is now the
// previous count) or wasted (fixed_window). e.mu is held.
func (lt *leaseTable) endWindowLocked(e *leaseEntry, extra int64) {
	left := e.clamp(0) + extra
	r := e.rule.Load()
	var j *leaseJob
	if r.Algorithm == SlidingWindow {
		j = &leaseJob{check: r.Check(e.key, 0), stats: e.stats}
	}
	for i := len(e.slices) - 1; i >= 0 && left > 0; i-- {
		u := min(left, e.slices[i].granted)
		left -= u
		if j != nil {
			j.slices = append(j.slices, SliceReturn{ID: e.slices[i].id, Unspent: u})
		} else {
			e.stats.wasted.Add(u)
		}
	}
	if j != nil && len(j.slices) > 0 {
		lt.queue(j)
	}
	e.slices = e.slices[:0]
	e.until.Store(0)
	e.epoch.Add(1)
}

// leaseOutcome is what acquire decided for one leased check.
type leaseOutcome struct {
	res   Result
	e     *leaseEntry
	epoch uint64
	spent bool
	err   error
}

// acquire decides one leased check of cost units: spent from a slice (or
// from a take it waited for), denied, or failed (the store could not
// lease: the failure mode decides).
func (lt *leaseTable) acquire(ctx context.Context, l *Limiter, key string, r *Rule, cost, now, nowUS int64) leaseOutcome {
	if cost <= 0 {
		return leaseOutcome{res: Result{Allowed: true, Remaining: capacity(r)}}
	}
	if costNeverFits(r, cost) {
		return leaseOutcome{res: Result{Remaining: 0, RetryUS: NeverFits}}
	}
	// Each turn either decides, or finds the entry ended (replaced by a
	// rule change or an eviction: at most a few times), or waits for a
	// take another decision started (bounded by ctx).
	for turn, dead := 0, 0; turn < 64 && dead < 4; turn++ {
		e := lt.entry(key, r, now)
		e.lastUse.Store(now)
		if ep, ok := e.trySpend(cost, now); ok {
			e.stats.servedLocal.Add(1)
			lt.maybePrefetch(l, e, cost, nowUS)
			return leaseOutcome{res: e.allowed(r, now), e: e, epoch: ep, spent: true}
		}
		e.mu.Lock()
		if e.dead {
			e.mu.Unlock()
			dead++
			continue
		}
		lt.expireLocked(e, now)
		if ep, ok := e.trySpend(cost, now); ok {
			e.mu.Unlock()
			e.stats.servedLocal.Add(1)
			return leaseOutcome{res: e.allowed(r, now), e: e, epoch: ep, spent: true}
		}
		have := e.avail.Load()
		if now >= e.until.Load() {
			have = 0
		}
		// The store's denial answers the need it was asked and, in a
		// fixed window only, a larger one (every need that can fit fits
		// when the window ends); elsewhere a larger need fits later than
		// the retry the store gave: it asks, so that its Retry-After is
		// the store's word (as the deny cache does).
		if need := cost - have; now < e.exUntil && (need == e.exNeed || need > e.exNeed && r.Algorithm == FixedWindow) {
			res := e.exResult
			res.Allowed = false
			res.Remaining = max(have, 0)
			res.ResetUS = max(e.resetAt.Load()-now, 0)
			if e.exRetryAt == math.MaxInt64 {
				res.RetryUS = NeverFits
			} else {
				res.RetryUS = max(e.exRetryAt-now, 1)
			}
			e.mu.Unlock()
			e.stats.deniedLocal.Add(1)
			return leaseOutcome{res: res}
		}
		if wait := e.inflight; wait != nil {
			e.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return leaseOutcome{err: ctx.Err()}
			}
			// decided from here on: answers count from now, not from
			// before the wait (a Retry-After long by the wait)
			now = lt.clock(nowUS)
			continue
		}
		// Take: what is held, reserved from concurrent spenders, plus a
		// fresh grant. The give back of this decision (another rule
		// denies) must find no slice gone since now: ep.
		ep := e.epoch.Load()
		reserved := int64(0)
		if now < e.until.Load() {
			reserved = e.clamp(0)
		}
		g, covered, fresh, err := lt.takeLocked(ctx, l, e, r, cost-reserved, reserved, now, nowUS)
		if err == nil && g.Granted > 0 && !covered {
			// A new window began in the store: decide again from it.
			e.mu.Unlock()
			continue
		}
		if err != nil || g.Granted <= 0 {
			if reserved > 0 {
				back := int64(0)
				if !e.dead && e.epoch.Load() == ep && now < e.until.Load() {
					// no more than the slices the record still counts
					// hold (the take may have settled some: giveBack)
					back = max(min(reserved, e.heldLocked()-e.avail.Load()), 0)
					e.avail.Add(back)
				}
				e.stats.wasted.Add(reserved - back)
			}
			e.mu.Unlock()
			if err != nil {
				return leaseOutcome{err: err}
			}
			return leaseOutcome{res: Result{Remaining: max(g.Result.Remaining+reserved, 0), ResetUS: g.Result.ResetUS, RetryUS: g.Result.RetryUS}}
		}
		if fresh {
			// The earlier window's slices ended; the grant covered this
			// decision whole: a give back goes to the new window.
			ep = e.epoch.Load()
		}
		e.spent.Add(cost)
		res := e.allowed(r, now)
		e.mu.Unlock()
		e.stats.servedTake.Add(1)
		return leaseOutcome{res: res, e: e, epoch: ep, spent: true}
	}
	return leaseOutcome{err: errLeaseBusy}
}

// maybePrefetch takes e's next slice when avail fell below its low mark.
func (lt *leaseTable) maybePrefetch(l *Limiter, e *leaseEntry, cost, nowUS int64) {
	if e.avail.Load() >= e.low.Load() || !e.prefetching.CompareAndSwap(false, true) {
		return
	}
	if lt.opt.SyncPrefetch {
		lt.prefetchNow(l, e, nowUS)
		return
	}
	select {
	case lt.prefetch <- struct{}{}:
	default:
		e.prefetching.Store(false)
		return
	}
	lt.bg.Add(1)
	go func() {
		defer lt.bg.Done()
		defer func() { <-lt.prefetch }()
		lt.prefetchNow(l, e, 0)
	}()
}

func (lt *leaseTable) prefetchNow(l *Limiter, e *leaseEntry, nowUS int64) {
	defer e.prefetching.Store(false)
	now := lt.clock(nowUS)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dead || e.inflight != nil || now < e.exUntil {
		return
	}
	lt.expireLocked(e, now)
	ctx, cancel := context.WithTimeout(context.Background(), lt.opt.Timeout)
	defer cancel()
	_, _, _, _ = lt.takeLocked(ctx, l, e, e.rule.Load(), 0, 0, now, nowUS)
}

// leaseScratch is a Decision's room for its leased checks.
type leaseScratch struct {
	// idx are the indices in batch.Checks (and res) of leased checks: not
	// of Verdicts, where a shadow rule's block has a verdict and no check
	// (verdictOf).
	idx       []int
	spent     []leaseSpend
	shared    Batch
	sharedIdx []int
	sharedRes []Result
}

// leaseSpend is one leased check's spend, to give back if the request is
// denied after all.
type leaseSpend struct {
	e         *leaseEntry
	cost, now int64
	epoch     uint64
}

func (s *leaseScratch) giveBack() {
	for _, sp := range s.spent {
		sp.e.giveBack(sp.cost, sp.epoch, sp.now)
	}
	clear(s.spent)
	s.spent = s.spent[:0]
}

// verdictOf returns the index in d.Verdicts of check i of d.batch: a
// shadow rule's block has a verdict and no check.
func (d *Decision) verdictOf(i int) int {
	for j := range d.Verdicts {
		if d.Verdicts[j].Rule.Identity == IdentityBlock {
			continue
		}
		if i == 0 {
			return j
		}
		i--
	}
	panic("limits: a check without its verdict")
}

// notAsked is the result of a rule a denied request did not ask: its full
// quota, as the deny cache reports such a rule (nothing was consumed).
func notAsked(r *Rule) Result { return Result{Allowed: true, Remaining: capacity(r)} }

// decideLeased decides a request with leased checks (d.lease.idx): those
// from this instance's slices, then the others in the store, all or
// nothing. It fills d.res for every check; decided is false when nothing
// could decide and the failure mode answered (d says how).
func (l *Limiter) decideLeased(ctx context.Context, d *Decision, nowUS int64) (admitted, decided bool, err error) {
	lt := l.leases
	s := &d.lease
	now := lt.clock(nowUS)
	s.spent = s.spent[:0]
	denied := false
	next := 0
	for ; next < len(s.idx); next++ {
		i := s.idx[next]
		v := &d.Verdicts[d.verdictOf(i)]
		out := lt.acquire(ctx, l, v.Key, v.Rule, v.Cost, now, nowUS)
		if out.err != nil {
			// The store could not lease: the whole request is decided as
			// a request the store could not decide (once a slice is
			// spent, failure_mode applies).
			s.giveBack()
			return l.decideLocal(ctx, d, &d.batch, d.res, out.err)
		}
		d.res[i] = out.res
		if out.spent {
			s.spent = append(s.spent, leaseSpend{e: out.e, cost: v.Cost, now: now, epoch: out.epoch})
		}
		if !out.res.Allowed && !v.Rule.Shadow {
			denied = true
			next++
			break
		}
	}
	s.shared.Checks = s.shared.Checks[:0]
	s.shared.NowUS = nowUS
	s.sharedIdx = s.sharedIdx[:0]
	k := 0
	for i := range d.batch.Checks {
		if k < len(s.idx) && s.idx[k] == i {
			k++
			continue
		}
		s.sharedIdx = append(s.sharedIdx, i)
		s.shared.Checks = append(s.shared.Checks, d.batch.Checks[i])
	}
	if denied {
		// Nothing else is asked: a denied request consumes nothing.
		s.giveBack()
		for _, i := range s.idx[next:] {
			d.res[i] = notAsked(d.Verdicts[d.verdictOf(i)].Rule)
		}
		for _, i := range s.sharedIdx {
			d.res[i] = notAsked(d.Verdicts[d.verdictOf(i)].Rule)
		}
		return false, true, nil
	}
	if len(s.shared.Checks) == 0 {
		return true, true, nil
	}
	if cap(s.sharedRes) < len(s.shared.Checks) {
		s.sharedRes = make([]Result, len(s.shared.Checks))
	}
	s.sharedRes = s.sharedRes[:len(s.shared.Checks)]
	admitted, err = l.decideShared(ctx, &s.shared, s.sharedRes, time.Time{})
	if err != nil {
		// The leased rules stay as their slices decided them (exact); the
		// others are decided as any failed decision is.
		if admitted, decided, err = l.decideLocal(ctx, d, &s.shared, s.sharedRes, err); !decided {
			if !d.Admitted {
				s.giveBack()
			}
			return false, false, err
		}
	}
	for k, i := range s.sharedIdx {
		d.res[i] = s.sharedRes[k]
	}
	if !admitted {
		s.giveBack()
	}
	clear(s.spent)
	s.spent = s.spent[:0]
	return admitted, true, err
}

// rulesChanged ends the entries whose rule is gone, no longer leased, or
// has other numbers (their slices go back); the others follow the new rule.
func (lt *leaseTable) rulesChanged(rules []*Rule) {
	byName := make(map[string]*Rule, len(rules))
	for _, r := range rules {
		if r.Lease {
			byName[r.Name] = r
			lt.ruleStats(r.Name) // its series exist from the start
		}
	}
	for i := range lt.shards {
		sh := &lt.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			r0 := e.rule.Load()
			switch nr := byName[r0.Name]; {
			case nr == nil || !sameNumbers(r0, nr):
				lt.kill(e)
				delete(sh.m, k)
			case nr != r0:
				e.rule.Store(nr)
			}
		}
		sh.mu.Unlock()
	}
}

// sweep retires idle entries (their slices go back), drops ended slices,
// and gives back a bucket's slice about to end with units left.
func (lt *leaseTable) sweep(now int64) {
	idle := PeriodUS(lt.opt.Idle)
	soon := 2 * PeriodUS(leaseSweepEvery)
	var es []*leaseEntry
	for i := range lt.shards {
		sh := &lt.shards[i]
		es = es[:0]
		sh.mu.RLock()
		for _, e := range sh.m {
			es = append(es, e)
		}
		sh.mu.RUnlock()
		for _, e := range es {
			if now-e.lastUse.Load() >= idle {
				sh.mu.Lock()
				e.mu.Lock()
				var j *leaseJob
				if sh.m[e.key] == e && e.inflight == nil && now-e.lastUse.Load() >= idle {
					j = lt.killLocked(e)
					delete(sh.m, e.key)
				}
				e.mu.Unlock()
				sh.mu.Unlock()
				if j != nil {
					lt.queue(j)
				}
				continue
			}
			e.mu.Lock()
			if !e.dead && e.inflight == nil {
				lt.expireLocked(e, now)
				if e.bucket && len(e.slices) > 0 && e.slices[0].until-now <= soon {
					s0 := e.slices[0]
					var later int64
					for _, t := range e.slices[1:] {
						later += t.granted
					}
					unspent := e.clamp(later)
					e.slices = e.slices[1:]
					e.epoch.Add(1)
					if len(e.slices) > 0 {
						e.until.Store(e.slices[0].until)
					} else {
						e.until.Store(0)
					}
					if unspent > 0 {
						r := e.rule.Load()
						lt.queue(&leaseJob{check: r.Check(e.key, 0), slices: []SliceReturn{{ID: s0.id, Unspent: unspent}}, stats: e.stats})
					} else {
						e.settle = append(e.settle, s0.id)
					}
				}
			}
			e.mu.Unlock()
		}
	}
}

// runJobs runs the queued returns, each within Timeout; those the store
// fails wait for the next run, for leaseReturnRetry at most: an outage
// (a Redis restart) would otherwise leave a slice given back meanwhile
// counted until its window ends. Once one fails, the rest of the run
// waits for the next one untried, queued ahead of what failed: while
// Redis is down a run costs one Timeout, not one per return, and a
// return that fails alone does not hold the others back.
func (lt *leaseTable) runJobs(ctx context.Context, l *Limiter, nowUS int64) {
	var failed, later, more []*leaseJob
	down := false
	for {
		j := lt.nextJob(&more)
		if j == nil {
			break
		}
		if down {
			later = append(later, j)
			continue
		}
		if !lt.runJob(ctx, l, j, nowUS, false) {
			down = true
			now := lt.clock(nowUS)
			if j.failedAt == 0 {
				j.failedAt = now
			}
			// A job whose try ctx ended (shutdown) waits for
			// ReturnLeases, however long it has waited.
			if ctx.Err() != nil || now-j.failedAt < PeriodUS(leaseReturnRetry) {
				failed = append(failed, j)
			} else {
				j.stats.wasted.Add(unspentOf(j))
			}
		}
	}
	for _, j := range later {
		lt.queue(j)
	}
	for _, j := range failed {
		lt.queue(j)
	}
}

// runJob gives one job's slices back; false when the store failed. With
// direct, the store breaker does not refuse it (shutdown: no request
// waits on the call, and an open breaker may not have seen Redis back).
func (lt *leaseTable) runJob(ctx context.Context, l *Limiter, j *leaseJob, nowUS int64, direct bool) bool {
	c, cancel := context.WithTimeout(ctx, lt.opt.Timeout)
	defer cancel()
	var back int64
	ret := func() (err error) {
		back, err = lt.store.ReturnLease(c, &LeaseReturn{Check: j.check, Slices: j.slices, NowUS: nowUS})
		return err
	}
	var refused, err error
	if direct {
		err = ret()
	} else {
		refused, err = l.call(OpLease, ret)
	}
	if refused != nil || err != nil {
		j.stats.returnsFailed.Add(1)
		return false
	}
	j.stats.returned.Add(back)
	if w := unspentOf(j) - back; w > 0 {
		// the store had nothing to take them back into (their window
		// is over, or the key was rewritten since)
		j.stats.wasted.Add(w)
	}
	return true
}

// RunLeases keeps the leases until ctx ends: every 100 ms it retires idle
// keys, drops ended slices and gives back what they held. ReturnLeases
// gives back the rest at shutdown. Without leases it returns at once.
func (l *Limiter) RunLeases(ctx context.Context) {
	lt := l.leases
	if lt == nil {
		return
	}
	tick.Every(ctx, leaseSweepEvery, func() {
		lt.sweep(lt.clock(0))
		lt.runJobs(ctx, l, 0)
	})
}

// SweepLeasesAt runs one sweep and the returns it queued at the store clock
// nowUS (tests that drive the clock; 0 = the real clocks).
func (l *Limiter) SweepLeasesAt(ctx context.Context, nowUS int64) {
	if lt := l.leases; lt != nil {
		lt.sweep(lt.clock(nowUS))
		lt.runJobs(ctx, l, nowUS)
	}
}

// ReturnLeases gives back every slice this instance holds and takes no new
// ones (SIGTERM: rategate is stopping). It returns the units given back;
// the rest is what ctx did not leave time for. nowUS as for SweepLeasesAt.
func (l *Limiter) ReturnLeases(ctx context.Context, nowUS int64) int64 {
	lt := l.leases
	if lt == nil {
		return 0
	}
	lt.closed.Store(true)
	// Background takes in flight end within Timeout; what they bring back
	// is queued to be returned (their entries are ended below).
	waited := make(chan struct{})
	go func() {
		lt.bg.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-ctx.Done():
	}
	var jobs []*leaseJob
	for i := range lt.shards {
		sh := &lt.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			e.mu.Lock()
			if j := lt.killLocked(e); j != nil {
				jobs = append(jobs, j)
			}
			e.mu.Unlock()
			delete(sh.m, k)
		}
		sh.mu.Unlock()
	}
	var more []*leaseJob
	for j := lt.nextJob(&more); j != nil; j = lt.nextJob(&more) {
		jobs = append(jobs, j)
	}
	// A Redis that just came back may still be refused for a while (the
	// store breaker has not seen it yet; go-redis answers its last dial
	// error for up to a second), and an idle key's failed return waits
	// here for it: returns go past the breaker (runJob's direct), and a
	// failed one is tried again every leaseSweepEvery until ctx ends, when
	// what is left counts as wasted. A failed one waits behind the others,
	// which are tried first: a return that fails alone (its Redis Cluster
	// master is down) does not hold the others back.
	var back int64
	failed := 0 // the jobs at the end of jobs, failed since the last wait
	for len(jobs) > 0 {
		if failed >= len(jobs) {
			select {
			case <-ctx.Done():
				for _, j := range jobs {
					j.stats.wasted.Add(unspentOf(j))
				}
				return back
			case <-time.After(leaseSweepEvery):
			}
			failed = 0
		}
		j := jobs[0]
		jobs = jobs[1:]
		before := j.stats.returned.Load()
		if lt.runJob(ctx, l, j, nowUS, true) {
			back += j.stats.returned.Load() - before
			continue
		}
		jobs = append(jobs, j)
		failed++
	}
	return back
}

// DropLeases forgets every slice without giving anything back: the store
// lost its data (a flush, a restart without persistence), so what the
// slices held is no longer counted there and must not be spent.
func (l *Limiter) DropLeases() {
	lt := l.leases
	if lt == nil {
		return
	}
	for i := range lt.shards {
		sh := &lt.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			e.mu.Lock()
			if j := lt.killLocked(e); j != nil {
				j.stats.wasted.Add(unspentOf(j))
			}
			e.mu.Unlock()
			delete(sh.m, k)
		}
		sh.mu.Unlock()
	}
}

// LeaseRuleStats are one rule's lease counters since the process started.
type LeaseRuleStats struct {
	// Rule is the rule's name ("_other" past 1000 rule names).
	Rule string
	// Takes is the slices taken, Units the units they held; Returned the
	// units given back, Wasted those that ended unspent without (their
	// window ended, a return failed, a bucket slice's TTL passed).
	Takes, Units, Returned, Wasted int64
	// ServedLocal is the decisions answered from a slice without a store
	// call, ServedTake those that waited for a take, DeniedLocal those
	// denied here because the store had nothing to lease.
	ServedLocal, ServedTake, DeniedLocal int64
	// TakesDenied and TakesFailed count takes the store refused (nothing
	// to lease) or could not answer; ReturnsFailed returns that failed.
	TakesDenied, TakesFailed, ReturnsFailed int64
}

// LeaseStats returns every leased rule's counters, by rule name.
func (l *Limiter) LeaseStats() []LeaseRuleStats {
	lt := l.leases
	if lt == nil {
		return nil
	}
	m := *lt.stats.Load()
	out := make([]LeaseRuleStats, 0, len(m)+1)
	add := func(st *leaseRuleStats) {
		out = append(out, LeaseRuleStats{Rule: st.name, Takes: st.takes.Load(), Units: st.units.Load(),
			Returned: st.returned.Load(), Wasted: st.wasted.Load(), ServedLocal: st.servedLocal.Load(),
			ServedTake: st.servedTake.Load(), DeniedLocal: st.deniedLocal.Load(), TakesDenied: st.takeDenied.Load(),
			TakesFailed: st.takeFailed.Load(), ReturnsFailed: st.returnsFailed.Load()})
	}
	for _, st := range m {
		add(st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rule < out[j].Rule })
	if len(m) >= leaseMaxStatsRules {
		add(lt.other)
	}
	return out
}

// LeasesHeld returns how many keys this instance holds an entry for and
// the units it may spend in all.
func (l *Limiter) LeasesHeld() (keys int, units int64) {
	lt := l.leases
	if lt == nil {
		return 0, 0
	}
	for i := range lt.shards {
		sh := &lt.shards[i]
		sh.mu.RLock()
		keys += len(sh.m)
		for _, e := range sh.m {
			units += e.avail.Load()
		}
		sh.mu.RUnlock()
	}
	return keys, units
}

// LeaseInstance returns the id this instance's slices are named by.
func (l *Limiter) LeaseInstance() string {
	if l.leases == nil {
		return ""
	}
	return l.leases.opt.Instance
}

// LeaseState is a leased key's lease, as the admin API shows it.
type LeaseState struct {
	// Held is what this instance holds.
	Held LeaseHeld `json:"held"`
	// Store is what the store says is leased, every instance's slices;
	// StoreError why it could not say.
	Store      *LeaseStoreView `json:"store,omitempty"`
	StoreError string          `json:"store_error,omitempty"`
}

// LeaseHeld is this instance's lease of one key.
type LeaseHeld struct {
	Instance string `json:"instance"`
	// Units is what it may still spend.
	Units  int64       `json:"units"`
	Slices []SliceView `json:"slices"`
	// RatePerSecond is what it spent per second between its last takes.
	RatePerSecond float64 `json:"rate_per_second"`
	// DeniedForMS is how long more it denies the key without asking (the
	// store had nothing to lease), 0 when it does not.
	DeniedForMS int64 `json:"denied_for_ms,omitempty"`
}

// LeaseStoreView is what the store says is leased of one key.
type LeaseStoreView struct {
	// Units is what the live slices hold in all (spent or not: the store
	// learns what was spent only when a slice ends).
	Units  int64       `json:"units"`
	Slices []SliceView `json:"slices"`
}

// SliceView is one slice.
type SliceView struct {
	ID      string `json:"id"`
	Granted int64  `json:"granted"`
	// EndsInMS is the time left until it can no longer be spent.
	EndsInMS int64 `json:"ends_in_ms"`
}

// leaseState reports key's lease under rule r: held here, and in the store.
func (l *Limiter) leaseState(ctx context.Context, r *Rule, key string) *LeaseState {
	lt := l.leases
	now := lt.clock(0)
	st := &LeaseState{Held: LeaseHeld{Instance: lt.opt.Instance, Slices: []SliceView{}}}
	sh := lt.shard(key)
	sh.mu.RLock()
	e := sh.m[key]
	sh.mu.RUnlock()
	if e != nil {
		e.mu.Lock()
		if !e.dead {
			if now < e.until.Load() {
				st.Held.Units = e.avail.Load()
			}
			for _, s := range e.slices {
				st.Held.Slices = append(st.Held.Slices, SliceView{ID: s.id, Granted: s.granted, EndsInMS: max(s.until-now, 0) / 1000})
			}
			st.Held.RatePerSecond = e.rate * 1e6
			if now < e.exUntil {
				st.Held.DeniedForMS = (e.exUntil - now + 999) / 1000
			}
		}
		e.mu.Unlock()
	}
	var look LeaseLook
	refused, err := l.call(OpLease, func() (err error) {
		look, err = lt.store.LookLease(ctx, r.Check(key, 0), 0)
		return err
	})
	if refused != nil {
		err = refused
	}
	if err != nil {
		st.StoreError = err.Error()
		return st
	}
	sv := &LeaseStoreView{Slices: []SliceView{}}
	for _, s := range look.Slices {
		sv.Units += s.Granted
		sv.Slices = append(sv.Slices, SliceView{ID: s.ID, Granted: s.Granted, EndsInMS: max(s.UntilUS-look.NowUS, 0) / 1000})
	}
	st.Store = sv
	return st
}

// forgetLease ends this instance's lease of key, giving back what it holds.
func (l *Limiter) forgetLease(key string) {
	lt := l.leases
	sh := lt.shard(key)
	sh.mu.Lock()
	e := sh.m[key]
	if e != nil {
		delete(sh.m, key)
	}
	sh.mu.Unlock()
	if e != nil {
		lt.kill(e)
	}
}
