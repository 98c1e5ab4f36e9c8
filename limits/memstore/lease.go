package memstore

import (
	"cmp"
	"context"
	"fmt"
	"sort"

	"github.com/rategate/rategate/limits"
)

// The memory store's side of leases: the Go twin of lua/lease.lua, operation
// for operation, over the same algorithm twins (algo*.go), so that a timeline
// of takes, returns and decisions gives the same answers on both stores
// (lease_store_test.go compares them step by step). The lease record is a
// state of its own under LeaseKey(key), its slices in state.lease.

// memSlice is one slice in a lease record: what lease.lua stores as
// "granted:until:at:reset:keep" under the slice's id.
type memSlice struct {
	id               string
	g, u, a, rset, k int64
}

// memLease is a lease record as lease.lua's driver reads it.
type memLease struct {
	key    string
	code   limits.Algorithm
	now    int64
	fill   int64
	window bool
	// slices not yet ended (a sliding_window one for a period past its
	// until), ended: a bucket's slices past their until, still in o.
	slices    []memSlice
	ended     []memSlice
	o, live   int64
	keep      int64
	expireWas int64
}

func (m *memLease) find(id string) int {
	for i := range m.slices {
		if m.slices[i].id == id {
			return i
		}
	}
	return -1
}

func (m *memLease) remove(i int) {
	m.slices = append(m.slices[:i:i], m.slices[i+1:]...)
}

// lockLease locks the shards of a key and its lease record, in order.
func (s *Store) lockLease(key, lkey string) func() {
	ka, kl := s.shardOf(key), s.shardOf(lkey)
	a, b := min(ka, kl), max(ka, kl)
	s.shards[a].mu.Lock()
	if b != a {
		s.shards[b].mu.Lock()
	}
	// A take charges the counter, then writes the lease record: making
	// room for the one must not drop the other.
	s.shards[ka].keep(key)
	s.shards[kl].keep(lkey)
	return func() {
		s.shards[a].kept = s.shards[a].kept[:0]
		s.shards[b].kept = s.shards[b].kept[:0]
		if b != a {
			s.shards[b].mu.Unlock()
		}
		s.shards[a].mu.Unlock()
	}
}

// openLease reads the lease record of c at now (lease.lua's first loop).
func (s *Store) openLease(c *limits.Check, now int64) *memLease {
	lk := limits.LeaseKey(c.Key)
	st := s.load(lk, now)
	m := &memLease{key: lk, code: c.Algorithm, now: now, window: !c.Algorithm.UsesBurst(), expireWas: st.expireUS}
	if !m.window {
		t := newInterval(c.Limit, c.PeriodUS)
		wi, _ := t.times(c.Burst)
		m.fill = wi + 1
	}
	for _, sl := range st.lease {
		k := sl.k
		switch {
		case k <= now:
		case !m.window && sl.u <= now:
			m.o += sl.g
			m.ended = append(m.ended, sl)
		default:
			m.o += sl.g
			m.slices = append(m.slices, sl)
			if sl.u > now {
				m.live += sl.g
			}
			m.keep = max(m.keep, k)
		}
	}
	return m
}

// save writes the record back: the slices left (and the ended ones unless
// settled), the TTL set to keep when setTTL (a take), else left as it was.
func (s *Store) saveLease(m *memLease, settled, setTTL bool) {
	var all []memSlice
	all = append(all, m.slices...)
	if !settled {
		all = append(all, m.ended...)
	}
	exp := m.expireWas
	if setTTL {
		exp = m.keep
	}
	if len(all) == 0 || exp <= m.now {
		s.put(m.key, state{})
		return
	}
	s.put(m.key, state{expireUS: exp, lease: all})
}

// decideOne decides one check as a single-check Decide does, holding the
// shard lock.
func (s *Store) decideOne(c *limits.Check, now int64) (outcome, limits.Result) {
	st := s.load(c.Key, now)
	out := algos[c.Algorithm](&st, now, c, true)
	switch {
	case out.r.Allowed && out.commit && c.Cost > 0:
		s.put(c.Key, out.next)
	case out.normalized:
		s.put(c.Key, st)
	}
	return out, out.r
}

func memLeaseCheck(c *limits.Check) error {
	if !c.Algorithm.Leasable() {
		return fmt.Errorf("memory store: %s cannot be leased", c.Algorithm)
	}
	return nil
}

func (s *Store) clock(nowUS int64) int64 {
	if nowUS != 0 {
		return nowUS
	}
	return s.now()
}

// TakeLease implements Leaser.
func (s *Store) TakeLease(_ context.Context, t *limits.LeaseTake) (limits.LeaseGrant, error) {
	c := t.Check
	if err := memLeaseCheck(&c); err != nil {
		return limits.LeaseGrant{}, err
	}
	unlock := s.lockLease(c.Key, limits.LeaseKey(c.Key))
	defer unlock()
	now := s.clock(t.NowUS)
	m := s.openLease(&c, now)
	need, want := c.Cost, max(t.Want, c.Cost)
	for _, id := range t.Settle {
		if i := m.find(id); i >= 0 {
			if m.slices[i].u > now {
				m.live -= m.slices[i].g
			}
			m.remove(i)
		}
	}
	var g, until int64
	var res limits.Result
	switch c.Algorithm {
	case limits.FixedWindow, limits.SlidingWindow:
		g, until, res = s.leaseWindowTake(&c, now, need, want)
	case limits.TokenBucket:
		have, ri, rf, iv, held := s.leaseTBState(&c, now, m.o)
		res = limits.Result{Remaining: max(have, 0), ResetUS: iv.after(c.Burst-have, ri, rf)}
		switch {
		case need > c.Burst:
			res.RetryUS = limits.NeverFits
		case have < need:
			res.RetryUS = iv.after(need-have, ri, rf)
		default:
			g = min(want, have)
			have -= g
			res = limits.Result{Allowed: true, Remaining: have, ResetUS: iv.after(c.Burst-have, ri, 0)}
			until = now + t.TTLUS
		}
		if !held {
			s.leaseTBWrite(&c, now, have, ri, iv)
		}
	case limits.GCRA:
		di, df, iv, ti, tf, held := s.leaseGCState(&c, now, m.o)
		reset := di
		if df > 0 {
			reset = di + 1
		}
		res = limits.Result{Remaining: iv.left(ti, tf, di, df, c.Burst), ResetUS: reset}
		if need > c.Burst {
			res.RetryUS = limits.NeverFits
		} else if ni, nf := leaseGCAdd(iv, di, df, need); ni > ti || (ni == ti && nf > tf) {
			res.RetryUS = ni - ti
			if nf > tf {
				res.RetryUS++
			}
		} else {
			g = min(want, res.Remaining)
			di, df = leaseGCAdd(iv, di, df, g)
			reset = di
			if df > 0 {
				reset = di + 1
			}
			res = limits.Result{Allowed: true, Remaining: iv.left(ti, tf, di, df, c.Burst), ResetUS: reset}
			until = now + t.TTLUS
		}
		if !held {
			s.leaseGCWrite(&c, now, di, df)
		}
	}
	if g > 0 {
		k := until + m.fill
		if c.Algorithm == limits.SlidingWindow {
			k = until + c.PeriodUS
		}
		m.slices = append(m.slices, memSlice{id: t.ID, g: g, u: until, a: now, rset: res.ResetUS, k: k})
		m.keep = max(m.keep, k)
	} else {
		until = 0
		res.Allowed = false
	}
	s.saveLease(m, true, true)
	return limits.LeaseGrant{Granted: g, NowUS: now, UntilUS: until, Result: res}, nil
}

// leaseWindowTake is ls_window_take.
func (s *Store) leaseWindowTake(c *limits.Check, now, need, want int64) (g, until int64, res limits.Result) {
	look := *c
	look.Cost = 0
	_, r0 := s.decideOne(&look, now)
	g = max(min(want, r0.Remaining), need)
	cc := *c
	cc.Cost = g
	_, r := s.decideOne(&cc, now)
	if !r.Allowed && g > need {
		g = need
		cc.Cost = g
		_, r = s.decideOne(&cc, now)
	}
	if !r.Allowed {
		return 0, 0, r
	}
	until = now + r.ResetUS
	if c.Algorithm == limits.SlidingWindow {
		until = floorDiv(now, c.PeriodUS)*c.PeriodUS + c.PeriodUS
	}
	return g, until, r
}

// leaseTBState is ls_tb_state.
func (s *Store) leaseTBState(c *limits.Check, now, o int64) (have, ri, rf int64, t interval, held bool) {
	t = newInterval(c.Limit, c.PeriodUS)
	st := s.load(c.Key, now)
	present := st.expireUS > now
	if present {
		sl, sp, sb := st.c, st.d, st.e
		if sl == 0 {
			sl = c.Limit
		}
		if sp == 0 {
			sp = c.PeriodUS
		}
		if sb == 0 {
			sb = c.Burst
		}
		if sl != c.Limit || sp != c.PeriodUS || sb != c.Burst {
			old := newInterval(sl, sp)
			h, hri, _ := old.level(st.b, st.a, now, max(sb-o, 0))
			st.b, st.a = h, now-hri
			s.put(c.Key, st)
			// read as tokenBucket reads it (below 0 at most); the take
			// writes it in the new terms (leaseTBWrite)
			have, ri, _, held = t.convert(h, now-hri, sl, sp, sb, now, c.Burst)
			if capacity := max(c.Burst-o, 0); have >= capacity {
				have, ri = capacity, 0
			}
			return have, ri, 0, t, held
		}
	}
	capacity := max(c.Burst-o, 0)
	if !present {
		return capacity, 0, 0, t, false
	}
	have, ri, rf = t.level(st.b, st.a, now, capacity)
	return have, ri, rf, t, false
}

// leaseTBWrite is ls_tb_write.
func (s *Store) leaseTBWrite(c *limits.Check, now, have, ri int64, t interval) {
	if have >= c.Burst {
		s.put(c.Key, state{})
		return
	}
	full := t.after(c.Burst-have, ri, 0)
	s.put(c.Key, state{expireUS: now + full, a: now - ri, b: have, c: c.Limit, d: c.PeriodUS, e: c.Burst})
}

// leaseGCState is ls_gc_state.
func (s *Store) leaseGCState(c *limits.Check, now, o int64) (di, df int64, t interval, ti, tf int64, held bool) {
	t = newInterval(c.Limit, c.PeriodUS)
	ti, tf = t.times(c.Burst)
	st := s.load(c.Key, now)
	present := st.expireUS > now
	if present {
		sl, sp := st.c, st.d
		if sl == 0 {
			sl = c.Limit
		}
		if sp == 0 {
			sp = c.PeriodUS
		}
		if sl != c.Limit || sp != c.PeriodUS {
			old := newInterval(sl, sp)
			oi, of := old.times(o)
			if st.a < now+oi || (st.a == now+oi && st.b < of) {
				st.a, st.b = now+oi, of
				s.put(c.Key, st)
			}
			cc := *c
			cc.Cost = c.Burst + 1
			st = s.load(c.Key, now)
			if out := gcra(&st, now, &cc, true); out.normalized {
				s.put(c.Key, st)
			}
			st = s.load(c.Key, now)
			present = st.expireUS > now
		}
	}
	if present {
		// (still under the old numbers when beyond the tolerance: gcra
		// leaves such a backlog as written)
		di, df, _, held = t.backlog(st.a, st.b, cmp.Or(st.c, c.Limit), cmp.Or(st.d, c.PeriodUS), now, c.Burst, ti, tf)
	}
	if oi, of := t.times(o); di < oi || (di == oi && df < of) {
		di, df = oi, of
	}
	return di, df, t, ti, tf, held
}

// leaseGCWrite is ls_gc_write.
func (s *Store) leaseGCWrite(c *limits.Check, now, di, df int64) {
	if di <= 0 && df <= 0 {
		s.put(c.Key, state{})
		return
	}
	ttl := di
	if df > 0 {
		ttl = di + 1
	}
	s.put(c.Key, state{expireUS: now + ttl, a: now + di, b: df, c: c.Limit, d: c.PeriodUS})
}

// leaseGCAdd is ls_gc_add: d + k*T, or d - |k|*T never below 0.
func leaseGCAdd(t interval, di, df, k int64) (int64, int64) {
	neg := k < 0
	if neg {
		k = -k
	}
	ki, kf := t.times(k)
	if !neg {
		di, df = di+ki, df+kf
		if df >= t.l {
			di, df = di+1, df-t.l
		}
		return di, df
	}
	di, df = di-ki, df-kf
	if df < 0 {
		di, df = di-1, df+t.l
	}
	if di < 0 {
		return 0, 0
	}
	return di, df
}

// fixedWindowRefund is fixed_window_refund: gives back cost, which a
// commit at `at` that reported reset added, while its count is in force.
func (s *Store) fixedWindowRefund(key string, now, cost, at, reset int64) {
	ends := at + reset
	if now >= ends {
		return
	}
	st := s.load(key, now)
	if st.expireUS <= now || st.a < ends {
		return
	}
	if count := st.b - cost; count <= 0 {
		s.put(key, state{})
	} else {
		st.b = count
		s.put(key, st)
	}
}

// slidingWindowRefund is sliding_window_refund.
func (s *Store) slidingWindowRefund(key string, now, period, cost, at, reset int64) {
	st := s.load(key, now)
	if st.expireUS <= now {
		return
	}
	d := st.d
	if d == 0 {
		d = period
	}
	if d != period || (at+reset)%period != 0 {
		return
	}
	e, curr, prev := st.a, st.b, st.c
	m := (at+reset)/period - 2
	switch {
	case floorDiv(e-1, period) == m:
		curr = max(curr-cost, 0)
	case floorDiv(e-period-1, period) == m:
		prev = max(prev-cost, 0)
	default:
		return
	}
	if curr == 0 && prev == 0 {
		s.put(key, state{})
		return
	}
	st.b, st.c = curr, prev
	s.put(key, st)
}

// ReturnLease implements Leaser.
func (s *Store) ReturnLease(_ context.Context, r *limits.LeaseReturn) (int64, error) {
	c := r.Check
	if err := memLeaseCheck(&c); err != nil {
		return 0, err
	}
	unlock := s.lockLease(c.Key, limits.LeaseKey(c.Key))
	defer unlock()
	now := s.clock(r.NowUS)
	m := s.openLease(&c, now)
	var back int64
	if m.window {
		for _, sr := range r.Slices {
			i := m.find(sr.ID)
			if i < 0 {
				continue
			}
			sl := m.slices[i]
			if u := min(sr.Unspent, sl.g); u > 0 {
				if c.Algorithm == limits.FixedWindow {
					if now < sl.a+sl.rset {
						s.fixedWindowRefund(c.Key, now, u, sl.a, sl.rset)
						back += u
					}
				} else {
					s.slidingWindowRefund(c.Key, now, c.PeriodUS, u, sl.a, sl.rset)
					back += u
				}
			}
			m.remove(i)
		}
		s.saveLease(m, false, false)
		return back, nil
	}
	var picked []int64
	for _, sr := range r.Slices {
		i := m.find(sr.ID)
		if i < 0 || m.slices[i].u <= now {
			continue
		}
		picked = append(picked, min(max(sr.Unspent, 0), m.slices[i].g))
		m.live -= m.slices[i].g
		m.remove(i)
	}
	// The units go back in the numbers the record is written under, not
	// the caller's (lease.lua's return says why).
	// (A record full again, or whose TAT has passed, counts as absent, as
	// in leaseTBState and leaseGCState.)
	st := s.load(c.Key, now)
	sl, sp, sb := cmp.Or(st.c, c.Limit), cmp.Or(st.d, c.PeriodUS), cmp.Or(st.e, c.Burst)
	gcraLive := st.expireUS > now && (st.a > now || st.a == now && st.b > 0) // its TAT not passed
	if c.Algorithm == limits.TokenBucket {
		if h, _, _ := newInterval(sl, sp).level(st.b, st.a, now, sb); st.expireUS > now && h < sb {
			c.Limit, c.PeriodUS, c.Burst = sl, sp, sb
		}
	} else if gcraLive {
		c.Limit, c.PeriodUS = sl, sp
	}
	if c.Algorithm == limits.TokenBucket {
		have, ri, _, iv, _ := s.leaseTBState(&c, now, m.o)
		for _, u := range picked {
			have += u
			back += u
		}
		if cp := max(c.Burst-m.live, 0); have >= cp {
			have, ri = cp, 0
		}
		s.leaseTBWrite(&c, now, have, ri, iv)
	} else {
		// the backlog as stored, not held to the caller's tolerance
		// either: a return only shortens it
		iv := newInterval(c.Limit, c.PeriodUS)
		var di, df int64
		if gcraLive {
			di, df = st.a-now, st.b
		}
		if oi, of := iv.times(m.o); di < oi || (di == oi && df < of) {
			di, df = oi, of
		}
		for _, u := range picked {
			di, df = leaseGCAdd(iv, di, df, -u)
			back += u
		}
		if li, lf := iv.times(m.live); di < li || (di == li && df < lf) {
			di, df = li, lf
		}
		s.leaseGCWrite(&c, now, di, df)
	}
	s.saveLease(m, true, false)
	return back, nil
}

// ResetLease implements Leaser.
func (s *Store) ResetLease(_ context.Context, c limits.Check, nowUS int64) error {
	if err := memLeaseCheck(&c); err != nil {
		return err
	}
	unlock := s.lockLease(c.Key, limits.LeaseKey(c.Key))
	defer unlock()
	now := s.clock(nowUS)
	m := s.openLease(&c, now)
	switch c.Algorithm {
	case limits.FixedWindow, limits.SlidingWindow:
		var until int64
		for _, sl := range m.slices {
			if sl.u > now {
				until = max(until, sl.u)
			}
		}
		s.put(c.Key, state{})
		if m.live > 0 {
			if c.Algorithm == limits.FixedWindow {
				s.put(c.Key, state{expireUS: until, a: until, b: m.live})
			} else {
				we := floorDiv(now, c.PeriodUS)*c.PeriodUS + c.PeriodUS
				s.put(c.Key, state{expireUS: swGone(we, c.PeriodUS), a: we, b: m.live, c: 0, d: c.PeriodUS})
			}
		}
		s.saveLease(m, false, false)
	case limits.TokenBucket:
		s.put(c.Key, state{})
		s.leaseTBWrite(&c, now, max(c.Burst-m.live, 0), 0, newInterval(c.Limit, c.PeriodUS))
		s.saveLease(m, true, false)
	case limits.GCRA:
		di, df := newInterval(c.Limit, c.PeriodUS).times(m.live)
		s.leaseGCWrite(&c, now, di, df)
		s.saveLease(m, true, false)
	}
	return nil
}

// LookLease implements Leaser.
func (s *Store) LookLease(_ context.Context, c limits.Check, nowUS int64) (limits.LeaseLook, error) {
	if err := memLeaseCheck(&c); err != nil {
		return limits.LeaseLook{}, err
	}
	unlock := s.lockLease(c.Key, limits.LeaseKey(c.Key))
	defer unlock()
	now := s.clock(nowUS)
	m := s.openLease(&c, now)
	look := limits.LeaseLook{NowUS: now}
	for _, sl := range m.slices {
		if sl.u > now {
			look.Slices = append(look.Slices, limits.LeasedSlice{ID: sl.id, Granted: sl.g, UntilUS: sl.u})
		}
	}
	sort.Slice(look.Slices, func(i, j int) bool { return look.Slices[i].ID < look.Slices[j].ID })
	return look, nil
}
