-- token_bucket.lua — a bucket of B tokens refilled at L per P, starting full.
--
-- KEYS[1]  the rule's key: a string of five doubles, struct.pack('<ddddd',
--          tokens, ts, l, p, b): tokens = whole tokens at ts, ts = µs; l, p,
--          b = the limit, period (µs) and burst it was written under (each
--          an integer below 2^53, so a double holds it exactly; see
--          sliding_window.lua for why a string, not a hash)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME (tests pass a clock)
-- ARGV[2]  limit L   ARGV[3] period P (µs)   ARGV[4] burst B   ARGV[5] cost c
-- Reply    {allowed 0|1, remaining, reset_us, retry_us (-1 = cost can never fit)}
--
-- Algorithm: tokens_now = min(B, tokens + (now - ts) * L / P); allow iff
-- tokens_now >= c, then tokens = tokens_now - c. The key expires when full.
--
-- Rule changes (a reload or override changes L, P or B under a live key):
-- the level is brought up to now at the rate it was written under, and what
-- was used, old B - tokens_now, is taken from the new B, in tokens whatever
-- the rates (tb_convert): a larger burst adds its difference, a smaller
-- one removes it, even below 0 (an identity that used more than the new
-- burst holds refills the difference first, as gcra waits out a backlog
-- beyond tau); the part of a token already earned is scaled to the new
-- rate, rounded down. The first decision that costs something under
-- another rate writes the bucket back in the new terms (below empty too:
-- the record then holds fewer than 0 tokens), so it refills at the new
-- rate from then on. Under the same rate nothing is rewritten until an
-- admission. So instances with different numbers on one key (a rolling
-- reload) read each other's records alike, without a ratchet, and gcra and
-- token_bucket stay equivalent across changes.
--
-- Rounding: a token's refill time T = P/L is kept exactly as q + r/L µs, so the
-- refill is counted exactly: tokens_now = tokens + k (k whole tokens earned) plus
-- rho, the time already earned towards the next one (0 <= rho < T). The stored
-- count is always whole and rho is kept as elapsed time: on an admission ts is
-- set to now - floor(rho), so the part of rho below one µs is dropped. When T is
-- a whole number of µs (or a µs refills whole tokens) rho is whole and nothing is
-- dropped: the bucket is exact and decides exactly like gcra with the same L, P,
-- B. Otherwise each admission gives up less than one µs of refill (and less than
-- one token): conservative, never admitting more than the exact bucket would.
-- Reported times are rounded up to the next µs (ms for PEXPIRE), remaining down.
--
-- Exactness bound: every intermediate is an integer below 2^53 (so a double holds
-- it exactly) while now < 2^52 µs (year 2112), P <= 2^45 µs (~407 days),
-- L, B, c < 2^30 (cost > B is refused before any product) and B*P/L <= 2^45 µs.
-- Config validation (P <= 400 days, L, B <= 1e9, B*P/L <= 400 days) stays inside;
-- a debt converted from another rate is read within 2^45 µs of refill and
-- 2^30 tokens and then not written back (tb_convert).
-- limits/memstore/algo_token_bucket.go is the in-memory twin, step for step.
--
-- TTLs are at least 2 ms (math.max(..., 2)): Redis 7.0 deletes a key at once
-- on PEXPIRE 1 when a millisecond boundary passes between the command's two
-- clock reads, which would drop a count written in its window's last
-- millisecond (the record says itself when it ends, so 1 ms more is harmless).
--
-- By hand: redis-cli --eval lua/token_bucket.lua rg:{demo:1.2.3.4}:tb2 , 0 1 1000000 5 1

-- tb_times returns k*T as (whole µs, numerator over L), for 0 <= k < 2^30.
-- k*r can reach 2^60, so k is split in 15-bit halves to keep every product
-- below 2^46; math.floor(x / limit) is the exact quotient for x < 2^53.
local function tb_times(k, q, r, limit)
  local kh = math.floor(k / 32768)
  local kl = k - kh * 32768
  local x = kh * r
  local a1 = math.floor(x / limit)
  local s = (x - a1 * limit) * 32768 + kl * r
  local a2 = math.floor(s / limit)
  return k * q + a1 * 32768 + a2, s - a2 * limit
end

-- tb_count returns the largest n in [0, hi] with n*T <= e µs: a floating
-- estimate, then corrected exactly (it is off by at most one).
local function tb_count(e, hi, q, r, limit, period)
  local n = math.floor(e * limit / period)
  if n > hi then n = hi end
  if n < 0 then n = 0 end
  while n > 0 do
    local ni, nf = tb_times(n, q, r, limit)
    if ni < e or (ni == e and nf == 0) then break end
    n = n - 1
  end
  while n < hi do
    local ni, nf = tb_times(n + 1, q, r, limit)
    if ni > e or (ni == e and nf > 0) then break end
    n = n + 1
  end
  return n
end

-- tb_after returns ceil(n*T - (ri + rf/L)): how long n more tokens take when
-- rho of the next one is already earned.
local function tb_after(n, ri, rf, q, r, limit)
  local ni, nf = tb_times(n, q, r, limit)
  if nf > rf then return ni - ri + 1 end
  return ni - ri
end

-- tb_level returns the whole tokens a bucket of capacity cap holds at now
-- when it held tokens at ts and refills one every T = q + r/L µs, and rho =
-- ri + rf/L, the time already earned towards the next one (0 when full).
local function tb_level(tokens, ts, now, cap, q, r, limit, period)
  if tokens >= cap then return cap, 0, 0 end
  local e = now - ts
  if e < 0 then e = 0 end
  local need = cap - tokens
  local fi, ff = tb_times(need, q, r, limit)
  if e > fi or (e == fi and ff == 0) then return cap, 0, 0 end
  local k = tb_count(e, need - 1, q, r, limit, period)
  local ki, kf = tb_times(k, q, r, limit)
  if kf > 0 then return tokens + k, e - ki - 1, limit - kf end
  return tokens + k, e - ki, 0
end

-- tb_convert returns the level of a record of tokens at ts, written
-- under limit sl, period sp and burst sb, at now under limit L, period P
-- and burst B (T = q + r/L): whole tokens, below 0 when more was used
-- than B holds, rho = ri + rf/L µs earned towards the next one, and
-- whether the debt was held at the bound (not to be written). What
-- was used, sb - tokens_now, is carried in tokens (a token is a token
-- whatever the rate); under another rate, rho is scaled to the new T,
-- rounded down to the µs (rf is then 0).
local function tb_convert(tokens, ts, sl, sp, sb, now, limit, period, burst, q, r)
  if sl == limit and sp == period then
    local have, ri, rf = tb_level(tokens, ts, now, sb, q, r, limit, period)
    if sb == burst then return have, ri, rf end
    -- the sub-µs part of rho is dropped, as an admission would
    have = have - sb + burst
    if have >= burst then return burst, 0, 0 end
    return have, ri, 0
  end
  local sq = math.floor(sp / sl)
  local sr = sp - sq * sl
  local h, hri, hrf = tb_level(tokens, ts, now, sb, sq, sr, sl, sp)
  local have = h - sb + burst
  if have >= burst then return burst, 0, 0 end
  -- a debt is read within 2^45 µs of refill and 2^30 tokens, where the
  -- sums stay exact, and then not written back (held): the tokens past it
  -- would be lost to the other numbers
  local held = false
  local most = tb_count(35184372088832, 1073741823, q, r, limit, period)
  if burst - have > most then have, held = burst - most, true end
  local ri = 0
  if hri > 0 or hrf > 0 then
    -- rho at the new T: T less the rest of the token still to refill,
    -- that rest scaled exactly as gcra scales its part-unit (gc_backlog),
    -- so that the two stay equal to the µs
    local xi, xf = sq - hri, sr - hrf
    if xf < 0 then xi, xf = xi - 1, xf + sl end
    local whole = tb_times(1, q, r, limit)
    ri = whole - math.ceil((xi + xf / sl) * (period / limit) / (sp / sl))
    if ri >= whole then ri = whole - 1 end
    if ri < 0 then ri = 0 end
  end
  return have, ri, 0, held
end

-- token_bucket_load returns the record at key: its whole tokens (below 0
-- for a debt), the time they refer to, and the limit, period and burst it was
-- written under; nothing when there is none. io, when given, holds the
-- key (records.lua). (lease.lua reads and writes records through
-- token_bucket_load and token_bucket_store.)
local function token_bucket_load(key, io)
  local v
  if io then
    v = io[key]
  else
    v = redis.call('GET', key)
  end
  if not v then return nil end
  if #v ~= 40 then error('rategate: ' .. key .. ' does not hold a token_bucket record') end
  local tokens, ts, l, p, b = struct.unpack('<ddddd', v)
  -- (below 0: a debt, what a burst or rate change left; tb_convert)
  return math.floor(tokens), ts, l, p, b
end

-- token_bucket_store writes a record: expiring ttl µs from now (rounded up
-- to the ms, at least 2 ms, see the header), or keeping its expiry when ttl
-- is nil; to io when given (records.lua). tokens false deletes the key.
local function token_bucket_store(key, tokens, ts, limit, period, burst, ttl, io)
  local v, ms = false, nil
  if tokens then v = struct.pack('<ddddd', tokens, ts, limit, period, burst) end
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

-- token_bucket_put writes the bucket an admission left, under this rule,
-- expiring when it is full again (ttl µs from now, rounded up).
local function token_bucket_put(key, now, limit, period, burst, left, ts, ttl, _, io)
  token_bucket_store(key, left, ts, limit, period, burst, ttl, io)
end

-- token_bucket returns allowed, remaining, reset, retry. solo true (a
-- request of one check) writes an admission at once (any other solo, as
-- rg_chain's "count", hands it back); otherwise an admission also
-- returns what token_bucket_put needs (the tokens left, the time they
-- refer to, the time to a full bucket: the TTL), then the remaining and
-- reset a zero-cost look would report instead. io: see token_bucket_load.
local function token_bucket(key, now, limit, period, burst, cost, solo, io)
  local q = math.floor(period / limit)
  local r = period - q * limit
  -- have = whole tokens now; rho = ri + rf/L µs earned towards the next one
  local have, ri, rf = burst, 0, 0
  local tokens, ts, sl, sp, sb = token_bucket_load(key, io)
  if tokens then
    local held
    have, ri, rf, held = tb_convert(tokens, ts, sl, sp, sb, now, limit, period, burst, q, r)
    if (sl ~= limit or sp ~= period) and cost > 0 and not held then
      -- another rate: written back in the new terms, to refill at the new
      -- rate from now on (below empty too: the record holds a debt)
      if have >= burst then
        token_bucket_store(key, false, 0, limit, period, burst, nil, io)
      else
        token_bucket_store(key, have, now - ri, limit, period, burst, tb_after(burst - have, ri, 0, q, r, limit), io)
      end
    end
  end
  local reset = tb_after(burst - have, ri, rf, q, r, limit)
  local rem = have
  if rem < 0 then rem = 0 end
  if cost > burst then return 0, rem, reset, -1 end
  if cost == 0 then return 1, rem, reset, 0 end
  if have < cost then
    return 0, rem, reset, tb_after(cost - have, ri, rf, q, r, limit)
  end
  local left = have - cost
  -- stored state: left tokens at now - ri (rf is the dropped sub-µs part)
  local ttl = tb_after(burst - left, ri, 0, q, r, limit)
  if solo == true then
    token_bucket_store(key, left, now - ri, limit, period, burst, ttl, io)
    return 1, left, ttl, 0
  end
  return 1, left, ttl, 0, left, now - ri, ttl, nil, have, reset
end

-- token_bucket_refund gives back the tokens a commit at `at` took (see
-- refund.lua). A bucket is a GCRA in disguise: X, the time it would be full
-- again after the commit, plays the TAT, and the refund is min(c*T, X - now)
-- of refill time, the part of the request not yet refilled (gcra_refund
-- says why). X is exact: the commit reported left = rem tokens and reset =
-- ceil((B-left)*T - rho), which give rho and so X = at - rho + (B-left)*T.
-- A full refund (the usual case) adds c tokens; a partial one moves the
-- refill start back by its whole µs (the sub-µs rest is kept, on the strict
-- side). A bucket that is full again is deleted, as if never touched.
-- When T is not a whole number of µs the commit itself dropped the sub-µs
-- part of rho (see the header), which no refund can know: such a bucket ends
-- up less than 1 µs of refill behind the untouched one per refund (stricter,
-- never looser). With a whole T, or for gcra, the refund is exact. A bucket
-- written under other numbers since is left alone (stricter).
local function token_bucket_refund(key, now, limit, period, burst, cost, at, rem, reset)
  local tokens, ts, sl, sp, sb = token_bucket_load(key)
  if not tokens or sl ~= limit or sp ~= period or sb ~= burst then return end
  if tokens >= burst or rem >= burst then return end
  local q = math.floor(period / limit)
  local r = period - q * limit
  local bi, bf = tb_times(burst - rem, q, r, limit)
  local rho = bi - reset
  if bf > 0 then rho = rho + 1 end
  local xi, xf = at - rho + bi, bf
  local ci, cf = tb_times(cost, q, r, limit)
  local ai, af = xi - now, xf
  if ai < 0 or (ai == 0 and af == 0) then return end
  if ai > ci or (ai == ci and af >= cf) then
    tokens = tokens + cost
  else
    ts = ts - ai
  end
  if tokens >= burst then
    redis.call('DEL', key)
    return
  end
  local fi, ff = tb_times(burst - tokens, q, r, limit)
  local full = ts + fi
  if ff > 0 then full = full + 1 end
  if full <= now then
    redis.call('DEL', key)
    return
  end
  token_bucket_store(key, tokens, ts, limit, period, burst, full - now)
end

-- @standalone: everything below runs only under redis-cli --eval; the
-- multi-rule scripts (lua.go) include the functions above.
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local limit, period, burst = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
return {token_bucket(KEYS[1], now, limit, period, burst, tonumber(ARGV[5]), true)}
