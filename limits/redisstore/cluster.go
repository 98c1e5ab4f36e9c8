package redisstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/lua"

	"github.com/redis/go-redis/v9"
)

// Multi-rule decisions on Redis Cluster.
//
// A Lua script may only touch keys of one hash slot, and the rules of one
// request usually live in different slots (a per-user key and the global
// key hash to different tags). So a cluster store groups the checks of a
// request by slot and runs decide.lua once per slot, all slots in parallel:
// one round trip of wall time, like a single Redis. Checks that share a slot
// stay in one script and are decided atomically together.
//
// Each slot's script commits only if every non-shadow check of that slot
// allows. When some slot denies, the slots that admitted have committed a
// request that is denied as a whole; their commits are then undone by
// lua/refund.lua, one script per slot, again in parallel: a second round
// trip, paid only by denied requests that matched rules in several slots.
// The contract "a denied request consumes nothing" holds once the refund
// has run. In between (one round trip) the denied request holds quota in
// the other slots, so a concurrent request may see less than is really
// left: the window can only make the limiter stricter, never looser.
//
// Refunds are exact when nothing else happened to the key in between, never
// give back more than the denied request still holds (see each
// <algo>_refund in lua/), and run at most once (a marker key set with NX).
// A refund that cannot run within the request's deadline is retried once in
// the background (bounded, see maxBackgroundRefunds); one that fails leaves
// its quota consumed until the window or bucket passes.
//
// When a slot fails (timeout, CLUSTERDOWN, a primary down), the request
// fails as on a single Redis (failure_mode applies) and the slots that did
// commit are refunded in the background.

// maxBackgroundRefunds bounds the refunds that run after their request.
const maxBackgroundRefunds = 256

// backgroundRefundTimeout is the deadline of one refund run after its request.
const backgroundRefundTimeout = time.Second

// RefundCounts counts the refunds of a cluster store since it opened.
type RefundCounts struct {
	// Refunded is how many slot refunds ran within their request.
	Refunded int64
	// Late is how many ran in the background after their request.
	Late int64
	// Lost is how many could not run: their quota stays consumed until the
	// window or bucket passes (stricter than exact, never looser).
	Lost int64
}

// refundStats holds the counters behind RefundCounts.
type refundStats struct {
	refunded, late, lost atomic.Int64
}

// Refunds returns the store's refund counters (all zero off a cluster).
func (s *Store) Refunds() RefundCounts {
	st := &s.bg.stats
	return RefundCounts{Refunded: st.refunded.Load(), Late: st.late.Load(), Lost: st.lost.Load()}
}

// slotGroup is the checks of one request that share a hash slot.
type slotGroup struct {
	slot int
	idx  []int // indices into the batch, in batch order
	// order: how likely the group is to deny, lowest first
	// (sortByRestriction)
	order int64
	// set by decideGroup
	admitted bool
	at       int64 // the script's clock, µs
	err      error
}

// groupBySlot groups checks by slot, in order of first appearance.
func groupBySlot(checks []limits.Check) []slotGroup {
	groups := make([]slotGroup, 0, len(checks))
next:
	for i := range checks {
		slot := KeySlot(checks[i].Key)
		for g := range groups {
			if groups[g].slot == slot {
				groups[g].idx = append(groups[g].idx, i)
				continue next
			}
		}
		groups = append(groups, slotGroup{slot: slot, idx: []int{i}})
	}
	return groups
}

// parallel runs fn(0..n-1) concurrently, fn(0) on the calling goroutine, and
// returns when all have returned. Every fn is bounded by the caller's
// context, so nothing outlives the call.
func parallel(n int, fn func(i int)) {
	if n == 0 {
		return
	}
	var wg sync.WaitGroup
	wg.Add(n - 1)
	for i := 1; i < n; i++ {
		go func() {
			defer wg.Done()
			fn(i)
		}()
	}
	fn(0)
	wg.Wait()
}

// decideSlots decides a batch whose checks may live in several slots.
func (s *Store) decideSlots(ctx context.Context, b *limits.Batch, results []limits.Result) (bool, error) {
	for i := range b.Checks {
		if b.Checks[i].Algorithm.Code() == 0 {
			return false, fmt.Errorf("redis store: algorithm %q not implemented", b.Checks[i].Algorithm)
		}
	}
	groups := groupBySlot(b.Checks)
	if len(groups) == 1 {
		return s.decideAll(ctx, b, results)
	}
	// The slot most likely to deny goes first, alone; the others only
	// once it admitted. A request it denies then holds nothing elsewhere
	// (nothing to refund, no unit of a global rule taken from others in
	// the meantime).
	now := time.Now().UnixNano()
	sortByRestriction(b.Checks, groups, &s.denied, now)
	s.decideGroups(ctx, b, groups[:1], results)
	s.noteDenials(b, groups[:1], results, now)
	if first := &groups[0]; first.err == nil && !first.admitted {
		// Denied: the other slots' rules report their own verdict on a
		// request that is denied anyway, committing nothing.
		s.dryGroups(ctx, b, groups[1:], results)
		return false, nil
	} else if first.err != nil {
		return false, first.err
	}
	s.decideGroups(ctx, b, groups[1:], results)
	s.noteDenials(b, groups[1:], results, now)

	var err error
	admitted := true
	for i := range groups {
		switch g := &groups[i]; {
		case g.err != nil:
			if err == nil {
				err = g.err
			}
		case !g.admitted:
			admitted = false
		}
	}
	if err == nil && admitted {
		return true, nil
	}

	// Denied (or failed) as a whole: give back what the admitting slots took.
	markerTTL := refundMarkerTTL(ctx, now)
	var jobs []*refundJob
	for i := range groups {
		if g := &groups[i]; g.err == nil && g.admitted {
			if j := newRefundJob(b, g, results, markerTTL); j != nil {
				jobs = append(jobs, j)
			}
		}
	}
	if err != nil || ctx.Err() != nil {
		for _, j := range jobs {
			s.refundLater(j)
		}
		if err == nil {
			// Every slot answered in time, the refunds did not: the
			// decision stands.
			return false, nil
		}
		return false, err
	}
	parallel(len(jobs), func(i int) { jobs[i].err = s.runRefund(ctx, jobs[i], results) })
	for _, j := range jobs {
		if j.err != nil {
			s.noteError(j.err)
			s.refundLater(j)
		} else {
			s.bg.stats.refunded.Add(1)
			s.announceRefund(ctx, j)
		}
	}
	return false, nil
}

// sortByRestriction orders groups by how likely they are to deny: a
// group with a check this store saw denied lately first (recent), then
// the smallest limit of a non-shadow check (a per-user rule before a
// global one), groups of shadow checks only last. The order among equals
// is the batch's. Without the first rule a flood of fresh identities
// against an exhausted global rule went the other way round: every
// per-user slot admitted, the global one denied, and every denial paid a
// refund and its announcement to the fleet.
func sortByRestriction(checks []limits.Check, groups []slotGroup, recent *recentDenials, now int64) {
	for gi := range groups {
		g := &groups[gi]
		g.order = int64(math.MaxInt64)
		denied := false
		for _, i := range g.idx {
			if c := &checks[i]; !c.Shadow {
				g.order = min(g.order, min(c.Limit, c.Burst))
				denied = denied || recent.seen(c.Key, now)
			}
		}
		if denied {
			// before every group not denied lately, by limit among them
			g.order -= math.MaxInt64
		}
	}
	sort.SliceStable(groups, func(i, j int) bool { return groups[i].order < groups[j].order })
}

// recentDenials remembers, by a hash of the key, until when a check this
// store saw denied stays denied (its retry time): the slot that denies
// still is asked first (sortByRestriction). Once the key has room again
// the order is by limit, as before (a burst then admits the limit
// exactly), and an admin reset forgets the key (forget). A direct-mapped
// table of recentDenialSlots: two keys that share a place only make the
// order a guess again, which it was before; no decision depends on it.
type recentDenials struct {
	hash  [recentDenialSlots]atomic.Uint64
	until [recentDenialSlots]atomic.Int64 // ns
}

const (
	recentDenialSlots = 4096
	// recentDenialAtLeast keeps a key noted for 20 ms past a denial even
	// when its retry is sooner (a busy sliding_window or gcra rule frees a
	// unit every millisecond): under a flood its denials keep renewing
	// it, and after one the order goes back to limits within 20 ms.
	recentDenialAtLeast = int64(20 * time.Millisecond)
)

var recentSeed = maphash.MakeSeed()

func (r *recentDenials) note(key string, until int64) {
	h := maphash.String(recentSeed, key)
	i := h % recentDenialSlots
	r.hash[i].Store(h)
	r.until[i].Store(until)
}

func (r *recentDenials) seen(key string, now int64) bool {
	h := maphash.String(recentSeed, key)
	i := h % recentDenialSlots
	return r.hash[i].Load() == h && now < r.until[i].Load()
}

func (r *recentDenials) forget(key string) {
	h := maphash.String(recentSeed, key)
	if i := h % recentDenialSlots; r.hash[i].Load() == h {
		r.until[i].Store(0)
	}
}

// noteDenials records the non-shadow checks the groups denied, until
// their retry time (from now, the decision's start), at least
// recentDenialAtLeast.
func (s *Store) noteDenials(b *limits.Batch, groups []slotGroup, results []limits.Result, now int64) {
	for gi := range groups {
		if g := &groups[gi]; g.err == nil && !g.admitted {
			for _, i := range g.idx {
				if r := &results[i]; !r.Allowed && !b.Checks[i].Shadow && r.RetryUS > 0 {
					s.denied.note(b.Checks[i].Key, now+max(r.RetryUS*1000, recentDenialAtLeast))
				}
			}
		}
	}
}

// dryGroups reports what the groups' checks say of a request that is
// denied anyway, committing nothing: what decide.lua reports for the rules
// of a denied request (a denying rule its own verdict and retry, the
// others their quota as it stands). Each group's script is given one more
// check, in the group's slot, that can never fit (cost 2 on a limit of 1,
// which writes nothing), so it denies and commits nothing.
func (s *Store) dryGroups(ctx context.Context, b *limits.Batch, groups []slotGroup, results []limits.Result) {
	parallel(len(groups), func(i int) {
		g := &groups[i]
		// One more check that can never fit (the group's first check
		// again, at a cost above its limit and burst) makes the script
		// commit nothing. It names a key the group has already: a key
		// that never exists would make a slot being migrated refuse the
		// script (TRYAGAIN) on both sides until the migration ended.
		call := groupCall(ctx, b, g)
		c := &b.Checks[g.idx[0]]
		never := *c
		never.Cost, never.Shadow = max(c.Limit, c.Burst)+1, false
		call.keys = append(call.keys, c.Key)
		call.args, _ = appendCheckArgs(call.args, &never)
		res := make([]limits.Result, len(g.idx)+1)
		if _, _, err := s.decideCall(call, res); err == nil {
			for k, idx := range g.idx {
				results[idx] = res[k]
			}
			return
		}
		// Not worth failing a denial over: the rule was not asked.
		for _, idx := range g.idx {
			results[idx] = limits.Result{Allowed: true, Remaining: b.Checks[idx].Burst}
		}
	})
}

// decideGroups runs decide.lua for every slot's checks at once, each on
// its slot's primary (one goroutine per slot beyond the first: a primary
// that is slow holds up only the request that needs it).
func (s *Store) decideGroups(ctx context.Context, b *limits.Batch, groups []slotGroup, results []limits.Result) {
	parallel(len(groups), func(i int) {
		g := &groups[i]
		res := make([]limits.Result, len(g.idx))
		adm, at, err := s.decideCall(groupCall(ctx, b, g), res)
		s.groupDecided(g, res, adm, at, err, results)
	})
}

// groupCall builds the decide.lua call of one slot's checks.
func groupCall(ctx context.Context, b *limits.Batch, g *slotGroup) *scriptCall {
	call := newCall(ctx)
	call.args = append(call.args, b.NowUS)
	for _, i := range g.idx {
		call.keys = append(call.keys, b.Checks[i].Key)
		call.args, _ = appendCheckArgs(call.args, &b.Checks[i]) // codes checked by decideSlots
	}
	return call
}

// groupDecided fills results from g's decision: res, its results in g's
// order, admitted and at, or err.
func (s *Store) groupDecided(g *slotGroup, res []limits.Result, adm, at int64, err error, results []limits.Result) {
	if err != nil {
		s.noteError(err)
		g.err = fmt.Errorf("redis store: decide (slot %d): %w", g.slot, err)
		return
	}
	for k, i := range g.idx {
		results[i] = res[k]
	}
	g.admitted, g.at = adm == 1, at
}

// refundJob is one slot's refund: refund.lua's keys and arguments, built
// when the decision is made so that it can outlive the batch.
type refundJob struct {
	keys []string // the refunded keys, then the marker (until unmarked)
	args []any
	idx  []int // the refunded checks' indices into the batch
	err  error
	// unmarked: the marker was dropped (unmark). mayHaveRun: a send failed
	// other than by Redis saying it did not run it. An unmarked job that
	// may have run is never sent again; a marked one may be (its marker
	// answers), but is never unmarked: its marker may exist by then, and a
	// TRYAGAIN may mean the refunded key moved away from it.
	unmarked, mayHaveRun bool
}

// refunded returns the keys j gives units back to.
func (j *refundJob) refunded() []string {
	if j.unmarked {
		return j.keys
	}
	return j.keys[:len(j.keys)-1]
}

// unmark drops j's marker, for a slot being migrated: the marker key never
// exists before the refund runs, and a script with one key present and
// one missing is refused TRYAGAIN on both sides of a migration, so a
// marked refund could not run until the migration ended (held the request
// to its deadline, then was lost). Unmarked, refund.lua runs on the keys
// alone, wherever they are (ASK follows them). Without the marker a resend
// could give back twice: an unmarked refund is sent again only when Redis
// said it did not run it (TRYAGAIN, MOVED, ASK), never after a lost reply.
// Only a job no send of which may have run is unmarked: after a lost
// reply the marker may be set, and TRYAGAIN then says the refunded key
// has moved away from it (the refund ran: unmarked, it would run twice).
func (j *refundJob) unmark() {
	if j.unmarked {
		return
	}
	j.keys = j.keys[:len(j.keys)-1]
	j.args[1] = int64(0)
	j.unmarked = true
}

// newRefundJob builds the refund of what g committed: every check that
// allowed with a cost (shadow checks included). nil when g took nothing.
func newRefundJob(b *limits.Batch, g *slotGroup, results []limits.Result, markerTTL time.Duration) *refundJob {
	j := &refundJob{args: []any{b.NowUS, markerTTL.Milliseconds()}}
	for _, i := range g.idx {
		c, r := &b.Checks[i], &results[i]
		if !r.Allowed || c.Cost <= 0 {
			continue
		}
		j.keys = append(j.keys, c.Key)
		j.idx = append(j.idx, i)
		j.args = append(j.args, c.Algorithm.Code(), c.Limit, c.PeriodUS, c.Burst, c.Cost,
			g.at, r.Remaining, r.ResetUS)
	}
	if len(j.keys) == 0 {
		return nil
	}
	j.keys = append(j.keys, refundMarker(j.keys[0]))
	return j
}

// lateRefundJob builds the refund of a decide.lua run whose caller gave
// up before its reply came, from the call's keys and arguments and the
// reply: every check that allowed with a cost, when the run admitted (a
// denied run committed nothing). nil when it took nothing or the reply is
// not decide.lua's.
func lateRefundJob(call *scriptCall, reply any) *refundJob {
	n := len(call.keys)
	if n == 0 || len(call.args) != 1+6*n {
		return nil
	}
	res := make([]limits.Result, n)
	adm, at, err := callResults(call, reply, res)
	if err != nil || adm != 1 {
		return nil
	}
	// Unmarked: it is sent once, and again only when Redis said it did
	// not run it (runRefund), so no marker is needed, and none bounds how
	// late after its commit it may run (the late grace, then the
	// background attempt).
	j := &refundJob{args: []any{call.args[0], int64(0)}, unmarked: true}
	for i := range n {
		a := call.args[1+6*i : 1+6*(i+1)] // code, limit, period, burst, cost, shadow
		cost, ok := a[4].(int64)
		if !res[i].Allowed || !ok || cost <= 0 {
			continue
		}
		j.keys = append(j.keys, call.keys[i])
		j.idx = append(j.idx, i)
		j.args = append(j.args, a[0], a[1], a[2], a[3], cost, at, res[i].Remaining, res[i].ResetUS)
	}
	if len(j.keys) == 0 {
		return nil
	}
	return j
}

// refundMarker returns a fresh marker key in the slot of key: its hash tag
// and ":refund:<random id>", e.g. "rg:{login:1.2.3.4}:refund:9f86d081884c7d65".
// A key without a hash tag is hashed whole, so it is made the tag (keys
// that would not survive that are not rategate's; AppendKey always tags).
func refundMarker(key string) string {
	return limits.SiblingKey(key, "refund:"+strconv.FormatUint(rand.Uint64(), 16))
}

// refundMarkerTTL keeps a marker until no retry of its refund can arrive:
// the request's deadline, then the background attempt, with a margin,
// counted from start (UnixNano), the decision's start, which is before its
// commits. refund.lua gives nothing back for a send that runs this long
// after its commit: a send the network held up that long may be a copy of
// one that ran and whose marker has ended.
func refundMarkerTTL(ctx context.Context, start int64) time.Duration {
	ttl := backgroundRefundTimeout + time.Second
	if d, ok := ctx.Deadline(); ok {
		ttl += max(time.Duration(d.UnixNano()-start), 0)
	}
	return ttl
}

// runRefund runs one slot's refund and, when results is not nil, reports
// the refunded checks' quota as it now stands.
func (s *Store) runRefund(ctx context.Context, j *refundJob, results []limits.Result) error {
	var reply any
	var err error
	if j.unmarked && j.mayHaveRun {
		return fmt.Errorf("redis store: refund (slot %d): not sent again: an unmarked refund may have run", KeySlot(j.keys[0]))
	}
	for attempt := 1; ; attempt++ {
		reply, err = s.sendRefund(ctx, j)
		if err == nil || !notRun(err) {
			j.mayHaveRun = j.mayHaveRun || err != nil
			break
		}
		if isTryAgain(err) && !j.unmarked && !j.mayHaveRun {
			// The slot is being migrated and the marker, never set (no
			// send ran), is on neither side: unmarked, the refund runs
			// where its keys are.
			j.unmark()
			continue
		}
		// TRYAGAIN still (the keys themselves split between the two
		// sides), CLUSTERDOWN: it did not run; again once the migration
		// or the failover is over. (A marked refund gives nothing back a
		// second time; an unmarked one is only resent after Redis said it
		// did not run it.)
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis store: refund (slot %d): %w (%w)", KeySlot(j.keys[0]), err, ctx.Err())
		case <-time.After(time.Duration(attempt) * 20 * time.Millisecond):
		}
	}
	if err != nil {
		return fmt.Errorf("redis store: refund (slot %d): %w", KeySlot(j.keys[0]), err)
	}
	res := make([]limits.Result, len(j.idx))
	if _, _, err := parseReply(reply, 1, res); err != nil {
		return err
	}
	if results != nil {
		for k, i := range j.idx {
			results[i] = res[k]
		}
	}
	return nil
}

// noRetryCmd is a command go-redis's cluster client must not send again
// by itself (it does on TRYAGAIN, after up to 100 ms of pauses, and on a
// broken connection): runRefund decides what is sent again. Redirects
// (MOVED, ASK) are still followed.
type noRetryCmd struct{ *redis.Cmd }

func (noRetryCmd) NoRetry() bool { return true }

// sendRefund sends j's refund.lua once (EVALSHA, then EVAL if the server
// lacks the script) and returns its reply.
func (s *Store) sendRefund(ctx context.Context, j *refundJob) (any, error) {
	args := make([]any, 0, 3+len(j.keys)+len(j.args))
	args = append(args, "evalsha", s.refund.Hash(), len(j.keys))
	for _, k := range j.keys {
		args = append(args, k)
	}
	args = append(args, j.args...)
	cmd := redis.NewCmd(ctx, args...)
	_ = s.client.Process(ctx, noRetryCmd{cmd})
	if isNoScript(cmd.Err()) {
		src, err := lua.Refund()
		if err != nil {
			return nil, err
		}
		args[0], args[1] = "eval", src
		cmd = redis.NewCmd(ctx, args...)
		_ = s.client.Process(ctx, noRetryCmd{cmd})
	}
	return cmd.Result()
}

// refundLater runs j in the background with its own deadline, at most once.
func (s *Store) refundLater(j *refundJob) {
	st := &s.bg.stats
	started := s.bg.goRun(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, backgroundRefundTimeout)
		defer cancel()
		if err := s.runRefund(ctx, j, nil); err != nil {
			s.noteError(err)
			st.lost.Add(1)
			return
		}
		st.late.Add(1)
		s.announceRefund(ctx, j)
	})
	if !started {
		st.lost.Add(1)
	}
}

// noteError asks a cluster client to reload the slot map after a failure:
// go-redis follows MOVED and ASK by itself, but after a failover the old
// primary simply does not answer, and the map would otherwise only be
// refreshed every ClusterStateReloadInterval (a minute). The reload runs in
// the background, at most every 200 ms.
func (s *Store) noteError(err error) {
	if s.topology != Cluster || errors.Is(err, context.Canceled) {
		return
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
	if s.nodes != nil {
		s.nodes.reloadSoon()
	}
}

// pingCluster checks that every primary answers and every slot has one, and
// names the primaries. Two round trips of wall time: the slot map (which
// ForEachMaster reloads) and CLUSTER SLOTS in parallel, then the primaries.
func (s *Store) pingCluster(ctx context.Context, cc *redis.ClusterClient) error {
	var slots []redis.ClusterSlot
	var slotsErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		slots, slotsErr = cc.ClusterSlots(ctx).Result()
	}()
	var mu sync.Mutex
	var primaries []string
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		addr := c.Options().Addr
		if err := s.pingAndLoad(ctx, c); err != nil {
			return fmt.Errorf("primary %s: %w", addr, err)
		}
		mu.Lock()
		primaries = append(primaries, addr)
		mu.Unlock()
		return nil
	})
	<-done
	if err != nil {
		s.noteError(err)
		return err
	}
	if len(primaries) == 0 {
		s.noteError(errNoPrimary)
		return errNoPrimary
	}
	if slotsErr != nil {
		s.noteError(slotsErr)
		return fmt.Errorf("cluster slots: %w", slotsErr)
	}
	if gaps := uncoveredSlots(slots); gaps != "" {
		return fmt.Errorf("no primary serves slots %s", gaps)
	}
	sort.Strings(primaries)
	name := fmt.Sprintf("redis cluster (%d primaries: %s)", len(primaries), strings.Join(primaries, " "))
	s.name.Store(&name)
	return nil
}

var errNoPrimary = errors.New("no cluster primary known (are the seed nodes up?)")

// uncoveredSlots lists the slots no range in slots serves ("0-5460,
// 10923-16383"), or "" when every slot has a primary.
func uncoveredSlots(slots []redis.ClusterSlot) string {
	var covered [NumSlots]bool
	for _, r := range slots {
		if len(r.Nodes) == 0 {
			continue
		}
		for i := max(r.Start, 0); i <= r.End && i < NumSlots; i++ {
			covered[i] = true
		}
	}
	var gaps []string
	for i := 0; i < NumSlots; i++ {
		if covered[i] {
			continue
		}
		j := i
		for j+1 < NumSlots && !covered[j+1] {
			j++
		}
		if i == j {
			gaps = append(gaps, strconv.Itoa(i))
		} else {
			gaps = append(gaps, fmt.Sprintf("%d-%d", i, j))
		}
		i = j
	}
	return strings.Join(gaps, ",")
}

// pingSentinel checks that the server the sentinels named is a primary and
// names it: "redis sentinel mymaster (primary 10.0.0.5:6379, 1 replica)".
func (s *Store) pingSentinel(ctx context.Context, c *redis.Client) error {
	var role *redis.Cmd
	var info *redis.ClientInfoCmd
	var exists *redis.BoolSliceCmd
	// One round trip. CLIENT INFO (Redis >= 6.2) only names the primary:
	// its failure is not a readiness failure.
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		role = p.Do(ctx, "ROLE")
		info = p.ClientInfo(ctx)
		exists = p.ScriptExists(ctx, s.scriptHashes()...)
		return nil
	})
	if err := role.Err(); err != nil {
		return err
	}
	arr, _ := role.Val().([]any)
	if len(arr) == 0 {
		return fmt.Errorf("ROLE answered %v", role.Val())
	}
	if r, _ := arr[0].(string); r != "master" {
		return fmt.Errorf("the server the sentinels named is a %v, not a primary (failover in progress?)", arr[0])
	}
	if err := s.loadMissing(ctx, c, exists); err != nil {
		return err
	}
	replicas := 0
	if len(arr) >= 3 {
		if l, ok := arr[2].([]any); ok {
			replicas = len(l)
		}
	}
	master := "unknown address"
	if ci := info.Val(); info.Err() == nil && ci != nil && ci.LAddr != "" {
		master = ci.LAddr
	}
	plural := "s"
	if replicas == 1 {
		plural = ""
	}
	name := fmt.Sprintf("redis sentinel %s (primary %s, %d replica%s)", s.master, master, replicas, plural)
	s.name.Store(&name)
	return nil
}

// Warm loads the scripts and the function library on every primary (or on
// the one Redis) and so opens a connection to each: the first decisions
// then do not pay for loading them (EVAL of the whole script can exceed a
// 50 ms budget). Call it once at start; Ping reloads scripts a new primary
// lacks, and a decision reloads the library where it is missing.
func (s *Store) Warm(ctx context.Context) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			addr := c.Options().Addr
			if err := s.load(ctx, c); err != nil {
				return fmt.Errorf("primary %s: %w", addr, err)
			}
			nd, err := s.nodes.node(addr)
			if err != nil {
				return err
			}
			if err := nd.co.fn.load(ctx, c); err != nil {
				return fmt.Errorf("primary %s: function load: %w", addr, err)
			}
			return nil
		})
	}
	if err := s.load(ctx, s.client); err != nil {
		return err
	}
	if err := s.co.fn.load(ctx, s.client); err != nil {
		return fmt.Errorf("function load: %w", err)
	}
	return nil
}

// Functions reports how many servers the store decides on with FCALL of
// its function library, and how many with EVALSHA.
func (s *Store) Functions() (fcall, evalsha int) {
	count := func(c *coalescer) {
		if c.fn.eval.Load() {
			evalsha++
		} else {
			fcall++
		}
	}
	if s.co != nil {
		count(s.co)
	}
	if s.nodes != nil {
		for _, nd := range s.nodes.all() {
			count(nd.co)
		}
	}
	return fcall, evalsha
}

// scripts returns the store's scripts: decide; refund on a cluster; and,
// where batches go as one call (a single server or Sentinel), decide_many
// as a script, for a server that does not run functions. Each is loaded
// at Warm and on a new primary, so no first batch waits for an EVAL.
func (s *Store) scripts() []*redis.Script {
	scs := []*redis.Script{s.script}
	if s.refund != nil {
		scs = append(scs, s.refund)
	}
	if s.co != nil && s.co.many.Load() {
		scs = append(scs, lua.DecideManyScript)
	}
	return scs
}

func (s *Store) scriptHashes() []string {
	var hs []string
	for _, sc := range s.scripts() {
		hs = append(hs, sc.Hash())
	}
	return hs
}

func (s *Store) load(ctx context.Context, c redis.Scripter) error {
	for _, sc := range s.scripts() {
		if err := sc.Load(ctx, c).Err(); err != nil {
			return fmt.Errorf("script load: %w", err)
		}
	}
	return nil
}

// pingAndLoad pings one server and, in the same round trip, checks that it
// has the scripts; it loads the ones it lacks (a replica just promoted).
func (s *Store) pingAndLoad(ctx context.Context, c *redis.Client) error {
	var ping *redis.StatusCmd
	var exists *redis.BoolSliceCmd
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		ping = p.Ping(ctx)
		exists = p.ScriptExists(ctx, s.scriptHashes()...)
		return nil
	})
	if err := ping.Err(); err != nil {
		return err
	}
	return s.loadMissing(ctx, c, exists)
}

// loadMissing loads the scripts SCRIPT EXISTS said the server lacks.
func (s *Store) loadMissing(ctx context.Context, c redis.Scripter, exists *redis.BoolSliceCmd) error {
	have, err := exists.Result()
	if err != nil {
		return nil // an old server or an ACL without SCRIPT: EVAL will do
	}
	for i, sc := range s.scripts() {
		if i < len(have) && !have[i] {
			if err := sc.Load(ctx, c).Err(); err != nil {
				return fmt.Errorf("script load: %w", err)
			}
		}
	}
	return nil
}
