package limits

import (
	"context"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// The deny cache: once the store has denied an identity under a rule until
// time T, later requests of that identity are denied locally until T,
// without a store round trip. It matters under attack or abuse, when most
// requests of a few identities are denied: each denial would otherwise cost
// Redis one script run.
//
// Why a cached denial is exact (never denies what the store would admit).
//
// An entry says: the store, evaluating rule r for key k at some time t0 with
// cost c, denied and answered RetryUS. The entry denies a later request of
// the same rule and key with a cost >= c while now < until, where until is
// taken on this process's clock read BEFORE the store call (tsend <= t0), so
// until = tsend + RetryUS <= t0 + RetryUS. It is exact because of these facts:
//
//  1. RetryUS is the exact earliest time the same request fits if nothing else
//     changes the key. Checked for each algorithm's Go twin (the Lua scripts
//     compute the same numbers; the conformance and model tests compare them),
//     and checked again at the retry point itself by the random-timeline test
//     in denycache_test.go, on the memory store and on a real Redis:
//     - fixed_window: retry = the end of the window; before it the count
//       only grows, at it the window is empty and c <= L fits.
//     - sliding_log: retry = t_k + P - now for the oldest entry t_k at which
//       the freed costs first cover the excess. Entries leave at t + P, so
//       before t_k + P less than the excess has left (ties leave together).
//     - sliding_window: retry is found by binary search over the script's own
//       float verdict, which is monotone in elapsed (prev's weight only
//       decays, and correctly rounded operations preserve the order): in
//       this window, then in the next (curr becomes prev), then the empty one
//       after. It is the first admitting microsecond, not an estimate of it.
//     - gcra: retry = ceil(tat + c*T - now - tau), exact in q + r/L µs
//       arithmetic; before it tat + c*T - now' > tau still.
//     - token_bucket: retry = ceil(n*T - rho), n the missing tokens and rho
//       the refill already earned towards the next one, in the same exact
//       arithmetic. The sub-µs part of rho that an admission drops only makes
//       the bucket stricter, never looser.
//  2. A larger cost never fits earlier: every verdict is "used + c <= limit"
//     for a used that does not depend on c. A smaller cost may fit earlier,
//     so it is asked of the store.
//  3. A denial consumes nothing, and other requests (on any instance) only
//     consume more: every algorithm's verdict is monotone in what was
//     consumed, so consumption can only move the true retry later.
//  4. A non-shadow rule that denies denies the whole request, whatever the
//     other rules say; so one rule's entry is enough to deny.
//
// What can make the store admit earlier, and how each is handled:
//
//   - A rule change (override, reload): SetRules clears the cache. A
//     decision in flight under the old rules must not insert after the clear:
//     decide reads the generation before the rules, Clear bumps it before
//     emptying the shards, and put rejects a stale generation under the
//     shard lock.
//   - gcra tolerance shrinking: the store caps a TAT at the first decision
//     under the new numbers, after the clear SetRules made.
//   - A key reset through the admin API: Forget(key) after the store's DEL
//     (also bumping the generation, so a decision the store evaluated before
//     the DEL cannot insert afterwards), and the reset is announced to the
//     other instances (ResetAnnouncer; redisstore.Resets over pub/sub), which
//     forget it too. An instance whose subscription was interrupted clears
//     its whole cache when it is back, since it may have missed a reset.
//   - Refunds (redisstore's cluster.go): a Redis Cluster request denied in
//     one slot is refunded in the slots that admitted it, one round trip
//     later, and a commit whose caller gave up is refunded when its reply
//     comes. A refund only gives back what that request took, so it never
//     makes the state looser than without the request; but a denial
//     another request saw in between was computed with that quota still
//     held, and its RetryUS is then later than the truth after the refund.
//     Uncached that strictness lasts a round trip; cached it would last
//     until RetryUS. So every refund, once done, is handled as a key reset
//     of its keys (KeyReset: forgotten here, announced to the others; the
//     generation bump keeps a decision that saw the held quota from
//     inserting after it). What remains is the announcement's delay, on
//     the strict side: one that cannot be sent becomes a clear of every
//     instance's cache (redisstore.Resets), retried until it is out.
//   - Clocks: the store's clock is Redis TIME and the cache's is this
//     process's monotonic clock. Their rates differ by the two hosts'
//     frequency errors (a few ppm, up to 500 ppm while NTP slews), so a
//     cached retry is shortened by 1/1024 of itself (~977 ppm). A step of
//     Redis's clock is not covered. Tests that drive the store's clock
//     (DecideAt) use that clock for the cache and need no margin.
//
// Not covered, by nature: state the store loses on its own (FLUSHALL, DEL
// by hand, eviction under maxmemory, a failover to a replica that had not
// received the last writes). The cache then keeps enforcing what the store
// said before losing it, until RetryUS at most.
//
// Exactness is judged at the moment the request is decided: a request the
// cache denies at t would have been denied by the store evaluating it at t.
// (A real round trip evaluates it a little later, which can only help it.)

// driftShift shortens a cached retry by retry>>driftShift (1/1024, ~977 ppm)
// to absorb a rate difference between Redis's clock and ours.
const driftShift = 10

// maxDenyShards is the most shards a DenyCache splits into.
const maxDenyShards = 64

// DenyCache remembers recent store denials so that an identity denied until
// T is answered locally until T. It is safe for concurrent use. Memory is
// bounded: at most maxEntries entries, each holding a key string the
// limiter built anyway.
type DenyCache struct {
	seed     maphash.Seed
	shards   []denyShard
	mask     uint64
	perShard int
	start    time.Time

	// gen is bumped by Clear and Forget. A decision reads it before the
	// store call; its insert is refused when a Clear (cleared) or a Forget
	// of a key in the insert's shard (denyShard.forgot) came after: one
	// key's reset (a refund on a cluster, say) does not hold back every
	// other key's insert.
	gen      atomic.Uint64
	cleared  atomic.Uint64
	entries  atomic.Int64
	evicted  atomic.Uint64
	announce atomic.Pointer[announcerRef]
}

type denyShard struct {
	mu sync.Mutex
	m  map[string]denyEntry
	// minUntil is at most the earliest until in m: no entry can have
	// expired before it, so a full shard is only swept when it can help.
	minUntil int64
	// added counts the entries put in since the last sweep: a sweep reads
	// the whole shard, so a full shard sweeps again only once it took
	// perShard/sweepShare new entries (each pays a few reads), not on
	// every insert while its entries expire one by one.
	added int
	// scanned counts the entries sweeps have read (tests).
	scanned int64
	// forgot is the generation of the last Forget of a key in this shard.
	forgot uint64
	_      [32]byte // keep neighbouring shards' locks off one cache line
}

// denyEntry is one cached denial.
type denyEntry struct {
	rule *Rule
	// key is the map key, kept to serve as the Verdict's Key on a hit.
	key  string
	cost int64
	// untilUS is the cache-clock time the denial holds until (exclusive);
	// math.MaxInt64 for a cost that never fits, until the rules change.
	untilUS int64
	// retryAtUS is when the store said this cost would fit: the time a
	// cached denial reports (Retry-After). untilUS is a little earlier when
	// it allows for clock drift; the header stays the store's.
	retryAtUS int64
	// resetAtUS is when the store said the quota would be fully back.
	resetAtUS int64
	remaining int64
	// at is the cache-clock time of the denial; others are the verdicts of
	// the request's other rules at that time, which a cached answer reports
	// (aged) so that every answer lists every matching rule.
	at     int64
	others []seen
}

// seen is one other rule's result when a cached denial was stored.
type seen struct {
	rule   *Rule
	result Result
}

// ResetAnnouncer tells the other rategate instances that a key was reset, so
// that they forget their cached denial of it. redisstore.Resets is one.
type ResetAnnouncer interface {
	AnnounceReset(ctx context.Context, key string) error
}

type announcerRef struct{ a ResetAnnouncer }

// NewDenyCache returns an empty cache holding at most maxEntries denials
// (at least 1).
func NewDenyCache(maxEntries int) *DenyCache {
	maxEntries = max(maxEntries, 1)
	// A power of two no larger than maxEntries, so that perShard*shards
	// never exceeds maxEntries.
	n := min(maxDenyShards, 1<<(bits.Len(uint(maxEntries))-1))
	c := &DenyCache{
		seed:     maphash.MakeSeed(),
		shards:   make([]denyShard, n),
		mask:     uint64(n - 1),
		perShard: maxEntries / n,
		start:    time.Now(),
	}
	for i := range c.shards {
		c.shards[i].m = make(map[string]denyEntry)
		c.shards[i].minUntil = math.MaxInt64
	}
	return c
}

// Len returns the number of cached denials, expired ones not yet dropped included.
func (c *DenyCache) Len() int { return int(c.entries.Load()) }

// Evictions returns how many unexpired entries were dropped to make room.
func (c *DenyCache) Evictions() uint64 { return c.evicted.Load() }

// Clear forgets every cached denial, and makes decisions already in flight
// unable to add theirs.
func (c *DenyCache) Clear() {
	// First, so a concurrent put either sees it or is emptied below; a
	// maximum, so two Clears at once cannot leave the older generation.
	g := c.gen.Add(1)
	for old := c.cleared.Load(); old < g && !c.cleared.CompareAndSwap(old, g); old = c.cleared.Load() {
	}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		c.entries.Add(-int64(len(sh.m)))
		clear(sh.m)
		sh.minUntil = math.MaxInt64
		sh.mu.Unlock()
	}
}

// Forget drops the cached denial of one store key, and makes decisions in
// flight unable to add one computed before now. Call it after the key was
// reset in the store.
func (c *DenyCache) Forget(key string) {
	g := c.gen.Add(1)
	sh := c.shard(maphash.String(c.seed, key))
	sh.mu.Lock()
	sh.forgot = max(sh.forgot, g)
	if _, ok := sh.m[key]; ok {
		delete(sh.m, key)
		c.entries.Add(-1)
	}
	sh.mu.Unlock()
}

// SetAnnouncer makes KeyReset tell the other instances through a.
func (c *DenyCache) SetAnnouncer(a ResetAnnouncer) {
	c.announce.Store(&announcerRef{a})
}

// KeyReset is called once a key was reset in the store: it forgets the key
// here and, with an announcer, on every other instance. The error is the
// announcement's; the local part cannot fail.
func (c *DenyCache) KeyReset(ctx context.Context, key string) error {
	c.Forget(key)
	if p := c.announce.Load(); p != nil && p.a != nil {
		return p.a.AnnounceReset(ctx, key)
	}
	return nil
}

func (c *DenyCache) shard(h uint64) *denyShard { return &c.shards[h&c.mask] }

// clock returns the cache's time in µs: nowUS when a test drives the store's
// clock, otherwise this process's monotonic clock, now.
func (c *DenyCache) clock(nowUS int64) int64 { return c.clockAt(nowUS, time.Now()) }

// clockAt is clock with the process's clock read at now (time.Now).
func (c *DenyCache) clockAt(nowUS int64, now time.Time) int64 {
	if nowUS != 0 {
		return nowUS
	}
	return int64(now.Sub(c.start) / time.Microsecond)
}

// lookup returns the entry that denies a request of rule r with the given
// cost on key at now (hit), or reports that key holds a live denial of r
// that cannot answer this cost (mute): the store must then decide the
// whole request, or the answer could name another rule and a retry
// earlier than this one's. It does not allocate.
func (c *DenyCache) lookup(key []byte, r *Rule, cost, now int64) (e denyEntry, hit, mute bool) {
	sh := c.shard(maphash.Bytes(c.seed, key))
	sh.mu.Lock()
	e, ok := sh.m[string(key)]
	if ok && now >= e.untilUS {
		delete(sh.m, e.key)
		c.entries.Add(-1)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || e.rule != r {
		return denyEntry{}, false, false
	}
	// A smaller cost may fit before until: the store decides it. A larger
	// one fits no earlier, but may fit later, except in a fixed window
	// (every cost that can fit fits when the window ends): elsewhere the
	// store decides it too, so that its Retry-After is the store's word.
	if e.cost > cost || (e.cost < cost && r.Algorithm != FixedWindow) {
		return denyEntry{}, false, true
	}
	return e, true, false
}

// putDecision caches every non-shadow denial of d, a decision the store
// made that read generation gen and the cache clock now (before the store
// call). exactClock says the cache clock is the store's own (tests).
func (c *DenyCache) putDecision(gen uint64, d *Decision, now, after int64, exactClock bool) {
	if d.Admitted {
		return
	}
	var others []seen
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		if v.Result.Allowed || v.Rule.Shadow || v.Rule.Lease || v.Result.RetryUS == 0 {
			// A leased rule's denial is never cached: units other
			// instances give back can make it admit before its retry.
			continue
		}
		if others == nil && len(d.Verdicts) > 1 {
			others = make([]seen, 0, len(d.Verdicts))
			for j := range d.Verdicts {
				others = append(others, seen{rule: d.Verdicts[j].Rule, result: d.Verdicts[j].Result})
			}
		}
		c.put(gen, v, others, now, after, exactClock)
	}
}

// lastSeen returns what the entry recorded of rule r's result, aged to
// now; a rule it did not see reports its full quota (it was not asked,
// and a denied request consumes nothing). A shadow rule that would have
// denied still would until its retry time, as the store would say: its
// shadow_limited count and log line must not depend on the cache.
func (e *denyEntry) lastSeen(r *Rule, now int64) Result {
	for _, o := range e.others {
		if o.rule == r {
			res := o.result
			elapsed := now - e.at
			res.ResetUS = max(res.ResetUS-elapsed, 0)
			if r.Shadow && !res.Allowed && (res.RetryUS == NeverFits || res.RetryUS > elapsed) {
				if res.RetryUS != NeverFits {
					res.RetryUS -= elapsed
				}
				return res
			}
			res.Allowed = true
			res.RetryUS = 0
			return res
		}
	}
	return Result{Allowed: true, Remaining: max(r.Burst, r.Limit)}
}

// put caches v, a non-shadow denial the store answered for a request whose
// decision read generation gen, the cache clock now before the store call
// and after when it answered. The store decided between the two: the
// denial holds until now + its retry at the latest (the cache never denies
// past it), and what a cached answer reports (Retry-After, the reset) is
// counted from after, never earlier than the store's word. exactClock
// says the cache clock is the store's own (tests).
func (c *DenyCache) put(gen uint64, v *Verdict, others []seen, now, after int64, exactClock bool) {
	var until, retryAt int64
	switch retry := v.Result.RetryUS; {
	case retry == NeverFits:
		until, retryAt = math.MaxInt64, math.MaxInt64
	case retry > 0:
		retryAt = math.MaxInt64
		if retry <= math.MaxInt64-after {
			retryAt = after + retry
		}
		if !exactClock {
			retry -= retry >> driftShift
		}
		if retry > math.MaxInt64-now {
			until = math.MaxInt64
		} else {
			until = now + retry
		}
	default:
		return
	}
	e := denyEntry{
		rule:      v.Rule,
		key:       v.Key,
		cost:      v.Cost,
		untilUS:   until,
		retryAtUS: retryAt,
		resetAtUS: after + max(v.Result.ResetUS, 0),
		remaining: v.Result.Remaining,
		at:        after,
		others:    others,
	}
	sh := c.shard(maphash.String(c.seed, v.Key))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if c.cleared.Load() > gen || sh.forgot > gen {
		// A rule change, or a reset of a key in this shard, happened since
		// this decision started: the denial may describe state that no
		// longer exists.
		return
	}
	if old, ok := sh.m[v.Key]; ok {
		// Keep the old entry only when it denies everything the new one
		// would (no larger cost, no earlier end); otherwise the newer word wins.
		if !(old.rule == e.rule && now < old.untilUS && old.cost <= e.cost && old.untilUS >= e.untilUS) {
			sh.m[v.Key] = e
			sh.minUntil = min(sh.minUntil, until)
		}
		return
	}
	if len(sh.m) >= c.perShard {
		if sh.added >= c.perShard/sweepShare {
			c.sweepLocked(sh, now)
		}
		if len(sh.m) >= c.perShard {
			c.dropOneLocked(sh, now)
		}
	}
	sh.m[v.Key] = e
	sh.added++
	c.entries.Add(1)
	sh.minUntil = min(sh.minUntil, until)
}

// sweepShare: a full shard is swept at most once per 1/sweepShare of its
// size in new entries.
const sweepShare = 8

// sweepLocked drops the shard's expired entries, when some may have expired.
func (c *DenyCache) sweepLocked(sh *denyShard, now int64) {
	if now < sh.minUntil {
		return
	}
	sh.added = 0
	next := int64(math.MaxInt64)
	sh.scanned += int64(len(sh.m))
	for k, e := range sh.m {
		if now >= e.untilUS {
			delete(sh.m, k)
			c.entries.Add(-1)
		} else {
			next = min(next, e.untilUS)
		}
	}
	sh.minUntil = next
}

// dropOneLocked makes room in a full shard: the first expired entry among a
// few in map order (random), or else the first of them, a live denial
// (counted as evicted), so that fresh denials, the ones being hammered,
// get in. Dropping a live denial only sends its identity's next request
// to the store.
func (c *DenyCache) dropOneLocked(sh *denyShard, now int64) {
	var victim string
	n, live := 0, true
	for k, e := range sh.m {
		if n == 0 || now >= e.untilUS {
			victim, live = k, now < e.untilUS
		}
		n++
		if !live || n == 4 {
			break
		}
	}
	delete(sh.m, victim)
	c.entries.Add(-1)
	if live {
		c.evicted.Add(1)
	}
}

// verdict is the Verdict of a request denied by e at now. A request whose
// own cost can never fit says so (no Retry-After), as the store would, even
// when the entry that denies it was cached for a smaller cost.
func (e *denyEntry) verdict(r *Rule, cost, now int64) Verdict {
	retry := NeverFits
	if e.untilUS != math.MaxInt64 && !costNeverFits(r, cost) {
		retry = e.retryAtUS - now
	}
	return Verdict{Rule: r, Key: e.key, Cost: cost, Result: Result{
		Remaining: e.remaining,
		ResetUS:   max(e.resetAtUS-now, 0),
		RetryUS:   retry,
	}}
}

// costNeverFits reports whether cost exceeds what rule r can ever admit at
// once: the burst of gcra and token_bucket, the limit of the windows.
func costNeverFits(r *Rule, cost int64) bool {
	if r.Algorithm.UsesBurst() {
		return cost > r.Burst
	}
	return cost > r.Limit
}
