-- gcra.lua — generic cell rate algorithm (a leaky bucket as a meter), the
-- same family as redis-cell: `gcra` with burst B answers like
-- `CL.THROTTLE key B-1 L P c` (redis-cell's max_burst is B-1).
--
-- KEYS[1]  the rule's key: a string of four doubles, struct.pack('<dddd', t,
--          f, l, p): t = theoretical arrival time TAT in whole µs, f = the
--          TAT's fraction of a µs in units of 1/L µs, 0 <= f < L; l, p = the
--          limit and period (µs) the TAT was written under (each an integer
--          below 2^53, so a double holds it exactly; see sliding_window.lua
--          for why a string, not a hash)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME (tests pass a clock)
-- ARGV[2]  limit L   ARGV[3] period P (µs)   ARGV[4] burst B   ARGV[5] cost c
-- Reply    {allowed 0|1, remaining, reset_us, retry_us (-1 = cost can never fit)}
--
-- Algorithm: T = P/L, tolerance tau = B*T; tat = max(stored, now), new = tat + c*T;
-- allow iff new - now <= tau, then store new. The key expires when its TAT passes.
--
-- Rule changes (a reload or override changes L, P or B under a live key):
-- what was used carries over in units (one unit is one request of cost 1,
-- whatever the rate). Under the same rate (L and P) the TAT is read as it
-- stands, whatever B was; under another, the backlog d = tat - now is read
-- in units of the old T, queued at the new T (exact for whole units, the
-- rest of one rounded up to the µs). Neither is capped at the new burst:
-- an identity that used more than it holds waits the difference out (as a
-- window count above a lowered limit does). Under another rate the first
-- decision that costs something writes the converted TAT back, so it
-- drains at the new rate from then on; under the same rate nothing is
-- rewritten until an admission. Both readings are stable, so instances
-- with different numbers on one key (a rolling reload) read each other's
-- records without a ratchet, and together admit no more than the loosest
-- numbers of the two. With L, P and B unchanged the TAT never exceeds
-- now + tau.
--
-- Rounding: none in the decision. T is kept exactly as q + r/L µs (q = floor(P/L),
-- r = P mod L) and every TAT as whole µs + f/L, so fractional intervals (L=3 per
-- second, or L=1e9 per ms, T = 1e-6 µs) neither drift nor admit early; a burst
-- of B always fits on a fresh key. Only what is reported is rounded, against the
-- client: reset/retry/TTL up to the next µs (ms for PEXPIRE), remaining down.
--
-- Exactness bound: every intermediate is an integer below 2^53 (so a double holds
-- it exactly) while now < 2^52 µs (year 2112), P <= 2^45 µs (~407 days),
-- L, B, c < 2^30 (cost > B is refused before any product) and B*P/L <= 2^45 µs.
-- Config validation (P <= 400 days, L, B <= 1e9, B*P/L <= 400 days) stays inside;
-- a backlog converted from another rate is read within 2^45 µs and then not
-- written back (gc_backlog: it stays under the numbers that can hold it).
-- limits/memstore/algo_gcra.go is the in-memory twin, step for step.
--
-- TTLs are at least 2 ms (math.max(..., 2)): Redis 7.0 deletes a key at once
-- on PEXPIRE 1 when a millisecond boundary passes between the command's two
-- clock reads, which would drop a count written in its window's last
-- millisecond (the record says itself when it ends, so 1 ms more is harmless).
--
-- By hand: redis-cli --eval lua/gcra.lua rg:{demo:1.2.3.4}:gc2 , 0 1 1000000 5 1

-- gc_times returns k*T as (whole µs, numerator over L), for 0 <= k < 2^30.
-- k*r can reach 2^60, so k is split in 15-bit halves to keep every product
-- below 2^46; math.floor(x / limit) is the exact quotient for x < 2^53.
local function gc_times(k, q, r, limit)
  local kh = math.floor(k / 32768)
  local kl = k - kh * 32768
  local x = kh * r
  local a1 = math.floor(x / limit)
  local s = (x - a1 * limit) * 32768 + kl * r
  local a2 = math.floor(s / limit)
  return k * q + a1 * 32768 + a2, s - a2 * limit
end

-- gc_count returns the largest n in [0, hi] with n*T <= xi + xf/L: a floating
-- estimate, then corrected exactly (it is off by at most one).
local function gc_count(xi, xf, hi, q, r, limit, period)
  local n = math.floor((xi * limit + xf) / period)
  if n > hi then n = hi end
  if n < 0 then n = 0 end
  while n > 0 do
    local ni, nf = gc_times(n, q, r, limit)
    if ni < xi or (ni == xi and nf <= xf) then break end
    n = n - 1
  end
  while n < hi do
    local ni, nf = gc_times(n + 1, q, r, limit)
    if ni > xi or (ni == xi and nf > xf) then break end
    n = n + 1
  end
  return n
end

-- gc_left returns floor((tau - d) / T), 0 when d > tau.
local function gc_left(ti, tf, di, df, burst, q, r, limit, period)
  local xi, xf = ti - di, tf - df
  if xf < 0 then xi, xf = xi - 1, xf + limit end
  if xi < 0 then return 0 end
  return gc_count(xi, xf, burst, q, r, limit, period)
end

-- gc_backlog returns the backlog d = tat - now (>= 0, whole µs + numerator
-- over L) a stored TAT t + f/sl written under limit sl and period sp means
-- under limit L, period P and burst B: as it is when sl and sp are L and P
-- (even beyond tau: a burst that shrank leaves what was used to wait out),
-- else d in units of the old T queued at the new T, rounded up to the µs.
-- changed is true when the stored TAT is to be rewritten (the rate
-- changed), held when it must not be: d read at the new T passes 2^45 µs.
local function gc_backlog(t, f, sl, sp, now, q, r, limit, period, burst, ti, tf)
  local di, df = 0, 0
  local changed, held = false, false
  if sl == limit and sp == period then
    if t >= now then di, df = t - now, f end
  elseif t > now or (t == now and f > 0) then
    -- another rate: n whole units of the old T and the rest of one,
    -- queued at the new T (the rest scaled, rounded up to the next µs)
    local xi = t - now
    local sq = math.floor(sp / sl)
    local sr = sp - sq * sl
    local n = gc_count(xi, f, 1073741823, sq, sr, sl, sp)
    local ni, nf = gc_times(n, sq, sr, sl)
    local ri, rf = xi - ni, f - nf
    if rf < 0 then ri, rf = ri - 1, rf + sl end
    if n * (period / limit) >= 35184372088832 then
      -- beyond 2^45 µs (407 days): read as that, where the sums stay
      -- exact, and never written so (held): the units past it would be
      -- lost to the other numbers
      di, df, held = 35184372088832, 0, true
    else
      di, df = gc_times(n, q, r, limit)
      if ri > 0 or rf > 0 then
        di = di + math.ceil((ri + rf / sl) * (period / limit) / (sp / sl))
      end
    end
  end
  if (sl ~= limit or sp ~= period) and not held then changed = true end
  return di, df, changed, held
end

-- gcra_load returns the record at key: its TAT (whole µs and numerator)
-- and the limit and period it was written under; nothing when there is
-- none. io, when given, holds the key (records.lua). (lease.lua reads and
-- writes records through gcra_load and gcra_store.)
local function gcra_load(key, io)
  local v
  if io then
    v = io[key]
  else
    v = redis.call('GET', key)
  end
  if not v then return nil end
  if #v ~= 32 then error('rategate: ' .. key .. ' does not hold a gcra record') end
  return struct.unpack('<dddd', v)
end

-- gcra_store writes a record: expiring ttl µs from now (rounded up to the
-- ms, at least 2 ms, see the header), or keeping its expiry when ttl is nil;
-- to io when given (records.lua). t false deletes the key.
local function gcra_store(key, t, f, limit, period, ttl, io)
  local v, ms = false, nil
  if t then v = struct.pack('<dddd', t, f, limit, period) end
  if ttl then ms = math.max(math.ceil(ttl / 1000), 2) end
  if io then
    rg_hold(io, key, v, ms)
  elseif not v then
    redis.call('DEL', key)
  elseif ms then
    redis.call('SET', key, v, 'PX', ms)
  else
    redis.call('SET', key, v, 'KEEPTTL')
  end
end

-- gcra_put writes the TAT an admission moved, under this rule, expiring
-- when it passes (ttl µs from now, rounded up).
local function gcra_put(key, now, limit, period, burst, t, f, ttl, _, io)
  gcra_store(key, t, f, limit, period, ttl, io)
end

-- gcra returns allowed, remaining, reset, retry. solo true (a request of
-- one check) writes an admission at once (any other solo, as rg_chain's
-- "count", hands it back); otherwise an admission also returns
-- what gcra_put needs: the new TAT (whole µs and numerator) and its
-- distance from now rounded up (the TTL). It hands back no look (what a
-- zero-cost look would report instead): that costs a gc_left, more than
-- asking again on the rare denial. io: see gcra_load.
local function gcra(key, now, limit, period, burst, cost, solo, io)
  local q = math.floor(period / limit)
  local r = period - q * limit
  local ti, tf = gc_times(burst, q, r, limit)
  -- d = tat - now >= 0 as di + df/L; a TAT in the past is an empty bucket.
  local di, df = 0, 0
  local t, f, sl, sp = gcra_load(key, io)
  if t then
    local changed
    di, df, changed = gc_backlog(t, f, sl, sp, now, q, r, limit, period, burst, ti, tf)
    if changed and cost > 0 then
      if di > 0 or df > 0 then
        local ttl = di
        if df > 0 then ttl = di + 1 end
        gcra_store(key, now + di, df, limit, period, ttl, io)
      else
        gcra_store(key, false, 0, limit, period, nil, io)
      end
    end
  end
  local reset = di
  if df > 0 then reset = di + 1 end
  if cost == 0 or cost > burst then
    -- a look, or a cost that can never fit: the quota as it stands
    local rem = gc_left(ti, tf, di, df, burst, q, r, limit, period)
    if cost == 0 then return 1, rem, reset, 0 end
    return 0, rem, reset, -1
  end
  local ci, cf = gc_times(cost, q, r, limit)
  local ni, nf = di + ci, df + cf
  if nf >= limit then ni, nf = ni + 1, nf - limit end
  if ni > ti or (ni == ti and nf > tf) then
    local retry = ni - ti
    if nf > tf then retry = retry + 1 end
    return 0, gc_left(ti, tf, di, df, burst, q, r, limit, period), reset, retry
  end
  local ttl = ni
  if nf > 0 then ttl = ni + 1 end
  if solo == true then
    gcra_store(key, now + ni, nf, limit, period, ttl, io)
    return 1, gc_left(ti, tf, ni, nf, burst, q, r, limit, period), ttl, 0
  end
  return 1, gc_left(ti, tf, ni, nf, burst, q, r, limit, period), ttl, 0, now + ni, nf, ttl
end

-- gcra_refund takes back the c*T a commit at `at` added to the TAT (see
-- refund.lua), but only the part still queued at now: once some of it has
-- drained, a later request may have started from a TAT that already
-- included it, and taking back all of it would undo part of that request.
-- So the refund is min(c*T, X - now), X being the TAT the commit stored.
-- X is known from below: X >= at + c*T (a TAT is at least the time of the
-- request that set it) and X > at + reset - 1 (reset is X - at rounded up),
-- so the refund errs, by less than 1 µs and only when part has drained, on
-- the strict side. With nothing drained (the usual case: the refund follows
-- the commit by one round trip) it is exact, in the same whole µs + f/L form.
-- A TAT written under other numbers since is left alone (stricter).
local function gcra_refund(key, now, limit, period, burst, cost, at, rem, reset)
  local t, f, sl, sp = gcra_load(key)
  if not t or sl ~= limit or sp ~= period then return end
  local q = math.floor(period / limit)
  local r = period - q * limit
  local ci, cf = gc_times(cost, q, r, limit)
  local xi, xf = at + ci, cf
  local bi, bf = at + reset, 0
  if limit > 1 then bi, bf = at + reset - 1, 1 end
  if bi > xi or (bi == xi and bf > xf) then xi, xf = bi, bf end
  local ai, af = xi - now, xf
  if ai < 0 or (ai == 0 and af == 0) then return end
  if ai > ci or (ai == ci and af > cf) then ai, af = ci, cf end
  local ni, nf = t - ai, f - af
  if nf < 0 then ni, nf = ni - 1, nf + limit end
  if ni < now or (ni == now and nf == 0) then
    redis.call('DEL', key)
    return
  end
  local ttl = ni - now
  if nf > 0 then ttl = ttl + 1 end
  gcra_store(key, ni, nf, limit, period, ttl)
end

-- @standalone: everything below runs only under redis-cli --eval; the
-- multi-rule scripts (lua.go) include the functions above.
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local limit, period, burst = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
return {gcra(KEYS[1], now, limit, period, burst, tonumber(ARGV[5]), true)}
