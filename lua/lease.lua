-- lease.lua — slices of one key's quota, leased to a rategate instance that
-- spends them locally (rules with lease: true; limits/lease.go explains the
-- instance's side, docs/algorithms.md why the union of what every instance
-- admits never exceeds the rule).
--
-- lua.go builds LeaseScript from the algorithm functions (the part of each
-- lua/<algo>.lua above its "@standalone" line) and this file. To run it by
-- hand: go run ./lua/print lease > /tmp/lease.lua, then
--   redis-cli --eval /tmp/lease.lua rg:{demo:}:fw rg:{demo:}:lease , 0 take 1 100 60000000 100 1 10 a-1 0
--
-- KEYS[1]  the rule's key, shared with every decision that is not leased
-- KEYS[2]  its lease record, in the same slot: "<prefix>:{<rule>:<identity>}:lease",
--          a hash of the slices not yet ended: field = slice id, value =
--          "granted:until:at:reset:keep" (µs, Redis clock): the units granted,
--          the time they may be spent until (exclusive), when the slice was
--          taken, the reset its commit reported (what a window refund needs),
--          and until when the record keeps it (see below)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME
-- ARGV[2]  the operation: take | return | reset | look
-- ARGV[3]  algorithm code (1 fixed_window, 3 sliding_window, 4 gcra,
--          5 token_bucket; sliding_log cannot be leased)
-- ARGV[4]  limit L   ARGV[5] period P (µs)   ARGV[6] burst B
-- take     ARGV[7] need (units the caller spends at once, >= 1), ARGV[8] want
--          (units it asks for, >= need), ARGV[9] the new slice's id,
--          ARGV[10] how long a gcra or token_bucket slice lives (µs),
--          ARGV[11...] ids of this holder's slices spent to the last unit
--          (settled: ended without anything to give back)
--          Reply {now, granted (0: need does not fit), until, allowed 0|1,
--                 remaining, reset_us, retry_us (-1: need can never fit)}
-- return   ARGV[7...] pairs: slice id, units not spent
--          Reply {now, units given back}
-- reset    the admin API's reset of a leased key: the count (or bucket)
--          keeps exactly what the live slices hold, everything else is reset
--          Reply {now}
-- look     Reply {now, n, then per live slice: id, granted, until}
--
-- The windows (fixed_window, sliding_window): a take is a decision of cost
-- g, the most of want that fits (at least need), so what is leased is
-- counted like any admission; a slice can be spent until the end of the
-- window it was counted in. A return is the cluster refund of its unspent
-- units (<algo>_refund): into the count they were added to, while it still
-- counts (sliding_window: also once it has become the previous count).
--
-- The buckets (token_bucket, gcra): spending a token taken earlier is not
-- exact by itself: were the bucket to refill to B while a slice is out, the
-- fleet could spend B and the slice at once. So the record holds the level
-- left once every live slice is taken out, and that level refills only up
-- to B - o, o the units of the slices not yet ended (gcra: its TAT is kept
-- at least o*T ahead of now): what is stored plus what the slices hold never
-- exceeds B. A slice ends when its holder returns it (its unspent units go
-- back into the level) or at its until (then all of it counts as spent; the
-- holder stops spending before). A record written under other numbers is
-- first capped under those, then converted by the algorithm itself; a
-- return gives its units back in the record's own numbers instead (see
-- its operation below).
--
-- Every write of a take, a return or a reset persists the cap, so a slice
-- that ended since the last one does not hand back the refill its cap held.
-- Exactly once: a slice is given back at most once (its field is deleted).
-- TTLs are at least 2 ms, as in the algorithm files (see fixed_window.lua).

local function ls_int(x)
  return string.format('%d', x)
end

-- The windows -------------------------------------------------------------

local function ls_window(code)
  if code == 1 then return fixed_window, fixed_window_put end
  return sliding_window, sliding_window_put
end

-- ls_window_take counts g units for the caller, the most of want that fits
-- and at least need, or none; it returns g, until, remaining, reset, retry.
local function ls_window_take(code, key, now, limit, period, burst, need, want)
  local algo, put = ls_window(code)
  local _, rem = algo(key, now, limit, period, burst, 0)
  local g = want
  if g > rem then g = rem end
  if g < need then g = need end
  local a, r2, reset, retry, w1, w2, w3, w4 = algo(key, now, limit, period, burst, g)
  if a ~= 1 and g > need then
    -- sliding_window: floor(L - est) can be one more than what fits
    g = need
    a, r2, reset, retry, w1, w2, w3, w4 = algo(key, now, limit, period, burst, g)
  end
  if a ~= 1 then return 0, 0, r2, reset, retry end
  if w1 then put(key, now, limit, period, burst, w1, w2, w3, w4) end
  -- fixed_window: the end of the window the count is in force for;
  -- sliding_window: the end of the current window (the count is curr in it)
  local untl = now + reset
  if code == 3 then untl = math.floor(now / period) * period + period end
  return g, untl, r2, reset, 0
end

-- ls_window_return gives back u units of slice s = {granted, until, at, reset}.
local function ls_window_return(code, key, now, limit, period, burst, s, u)
  if u > s[1] then u = s[1] end
  if u <= 0 then return 0 end
  if code == 1 then
    if now >= s[3] + s[4] then return 0 end
    fixed_window_refund(key, now, limit, period, burst, u, s[3], 0, s[4])
  else
    sliding_window_refund(key, now, limit, period, burst, u, s[3], 0, s[4])
  end
  return u
end

-- ls_window_reset rebuilds the count from the live slices alone.
local function ls_window_reset(code, key, now, limit, period, held, untl)
  redis.call('DEL', key)
  if held <= 0 then return end
  if code == 1 then
    fixed_window_put(key, now, limit, period, 0, held, untl, true)
    return
  end
  local we = math.floor(now / period) * period + period
  sliding_window_put(key, now, limit, period, 0, we, held, 0, sw_gone(we, period))
end

-- token_bucket ------------------------------------------------------------

-- ls_tb_state returns the level (whole tokens, and rho = ri + rf/L µs
-- earned towards the next one) a bucket holds now under the cap B - o, o
-- the units of every slice in the record when it was last written.
local function ls_tb_state(key, now, limit, period, burst, o)
  local q = math.floor(period / limit)
  local r = period - q * limit
  local tokens, ts, sl, sp, sb = token_bucket_load(key)
  if tokens then
    if sl ~= limit or sp ~= period or sb ~= burst then
      local sq = math.floor(sp / sl)
      local sr = sp - sq * sl
      if tb_level(tokens, ts, now, sb, sq, sr, sl, sp) >= sb then
        -- full again: as if absent (its TTL ends when it is full)
        tokens, ts = nil, nil
      else
        -- written under other numbers: capped under those first, then
        -- read as token_bucket reads it (have may be below 0); the take
        -- writes it in the new terms (ls_tb_write)
        local c = sb - o
        if c < 0 then c = 0 end
        local h, hri = tb_level(tokens, ts, now, c, sq, sr, sl, sp)
        token_bucket_store(key, h, now - hri, sl, sp, sb, nil)
        local have, ri, _, held = tb_convert(h, now - hri, sl, sp, sb, now, limit, period, burst, q, r)
        c = burst - o
        if c < 0 then c = 0 end
        if have >= c then have, ri = c, 0 end
        return have, ri, 0, q, r, held
      end
    end
  end
  local c = burst - o
  if c < 0 then c = 0 end
  if not tokens then return c, 0, 0, q, r end
  local have, ri, rf = tb_level(tokens, ts, now, c, q, r, limit, period)
  return have, ri, rf, q, r
end

local function ls_tb_write(key, now, limit, period, burst, have, ri, q, r)
  if have >= burst then
    redis.call('DEL', key)
    return
  end
  token_bucket_store(key, have, now - ri, limit, period, burst, tb_after(burst - have, ri, 0, q, r, limit))
end

-- gcra --------------------------------------------------------------------

-- ls_gc_state returns the backlog d = tat - now (whole µs + numerator over
-- L) under the cap d >= o*T, o the units of every slice in the record when
-- it was last written, and T and the tolerance.
local function ls_gc_state(key, now, limit, period, burst, o)
  local q = math.floor(period / limit)
  local r = period - q * limit
  local ti, tf = gc_times(burst, q, r, limit)
  local t, f, sl, sp = gcra_load(key)
  if t then
    if (sl ~= limit or sp ~= period) and not (t > now or (t == now and f > 0)) then
      -- its TAT has passed: as if absent (its TTL ends then)
      t = nil
    elseif sl ~= limit or sp ~= period then
      -- written under other numbers: capped under those, then converted
      -- by gcra (a cost above the burst decides nothing), which writes it
      -- in the new terms when they can hold it
      local sq = math.floor(sp / sl)
      local sr = sp - sq * sl
      local oi, of = gc_times(o, sq, sr, sl)
      if t < now + oi or (t == now + oi and f < of) then
        gcra_store(key, now + oi, of, sl, sp, nil)
      end
      gcra(key, now, limit, period, burst, burst + 1)
      t, f, sl, sp = gcra_load(key)
    end
  end
  local di, df, held = 0, 0, false
  if t then
    -- (still under the old numbers when gcra held it at the bound)
    local _
    di, df, _, held = gc_backlog(t, f, sl, sp, now, q, r, limit, period, burst, ti, tf)
  end
  local oi, of = gc_times(o, q, r, limit)
  if di < oi or (di == oi and df < of) then di, df = oi, of end
  return di, df, q, r, ti, tf, held
end

local function ls_gc_write(key, now, limit, period, di, df)
  if di <= 0 and df <= 0 then
    redis.call('DEL', key)
    return
  end
  local ttl = di
  if df > 0 then ttl = di + 1 end
  gcra_store(key, now + di, df, limit, period, ttl)
end

-- gc_add returns d + k*T (k may be negative: d - |k|*T, never below 0).
local function ls_gc_add(di, df, k, q, r, limit)
  local neg = k < 0
  if neg then k = -k end
  local ki, kf = gc_times(k, q, r, limit)
  if not neg then
    di, df = di + ki, df + kf
    if df >= limit then di, df = di + 1, df - limit end
    return di, df
  end
  di, df = di - ki, df - kf
  if df < 0 then di, df = di - 1, df + limit end
  if di < 0 then return 0, 0 end
  return di, df
end

-- the driver ---------------------------------------------------------------

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local op = ARGV[2]
local code = tonumber(ARGV[3])
local limit, period, burst = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local key, lkey = KEYS[1], KEYS[2]
if code ~= 1 and code ~= 3 and code ~= 4 and code ~= 5 then
  return redis.error_reply('rategate: algorithm code ' .. tostring(ARGV[3]) .. ' cannot be leased')
end
local window = code == 1 or code == 3

-- The slices. o counts those in the record (what the bucket's cap was last
-- written under), live those that may still be spent. A slice is kept
-- past its until (keep, fixed when it is taken): a sliding_window slice for
-- one period (its units can still be returned to the previous count), a
-- bucket's for the time the bucket takes to refill (fill): until a write
-- has taken an ended slice out (ended), the cap it held stays in o, so a
-- late first call after it ended cannot hand back refill the cap held
-- while it was out.
local fill = 0
if not window then
  local q = math.floor(period / limit)
  fill = tb_times(burst, q, period - q * limit, limit) + 1
end
local slices, ended = {}, {}
local o, live, keep = 0, 0, 0
local raw = redis.call('HGETALL', lkey)
for i = 1, #raw, 2 do
  local g, u, a, rs, k = string.match(raw[i + 1], '^(%d+):(%d+):(%d+):(%-?%d+):(%d+)$')
  if not g then
    redis.call('HDEL', lkey, raw[i])
  else
    g, u, a, rs, k = tonumber(g), tonumber(u), tonumber(a), tonumber(rs), tonumber(k)
    if k <= now then
      -- ended long enough ago for its cap not to matter: the bucket has
      -- had the time to refill past it since (or its window is over)
      redis.call('HDEL', lkey, raw[i])
    elseif not window and u <= now then
      o = o + g
      ended[#ended + 1] = raw[i]
    else
      o = o + g
      slices[raw[i]] = {g, u, a, rs}
      if u > now then live = live + g end
      if k > keep then keep = k end
    end
  end
end

-- ls_settle takes the ended slices of a bucket out, once the level has
-- been written under their cap.
local function ls_settle()
  for _, id in ipairs(ended) do redis.call('HDEL', lkey, id) end
end

-- ls_keep sets the record's TTL to its last slice's end.
local function ls_keep()
  if keep <= now then
    redis.call('DEL', lkey)
  else
    redis.call('PEXPIRE', lkey, math.max(math.ceil((keep - now) / 1000), 2))
  end
end

if op == 'look' then
  local reply = {now, 0}
  for id, s in pairs(slices) do
    if s[2] > now then
      reply[#reply + 1] = id
      reply[#reply + 1] = s[1]
      reply[#reply + 1] = s[2]
      reply[2] = reply[2] + 1
    end
  end
  return reply
end

if op == 'take' then
  local need, want, id, ttl = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
  if want < need then want = need end
  for i = 11, #ARGV do
    local s = slices[ARGV[i]]
    if s then
      if s[2] > now then live = live - s[1] end
      slices[ARGV[i]] = nil
      redis.call('HDEL', lkey, ARGV[i])
    end
  end
  local g, untl, rem, reset, retry
  if window then
    g, untl, rem, reset, retry = ls_window_take(code, key, now, limit, period, burst, need, want)
  elseif code == 5 then
    local have, ri, rf, q, r, held = ls_tb_state(key, now, limit, period, burst, o)
    reset = tb_after(burst - have, ri, rf, q, r, limit)
    if need > burst then
      g, rem, retry = 0, math.max(have, 0), -1
    elseif have < need then
      g, rem, retry = 0, math.max(have, 0), tb_after(need - have, ri, rf, q, r, limit)
    else
      g = want
      if g > have then g = have end
      have = have - g
      rem, reset, retry = have, tb_after(burst - have, ri, 0, q, r, limit), 0
      untl = now + ttl
    end
    -- (a debt held at the bound grants nothing and is not written)
    if not held then ls_tb_write(key, now, limit, period, burst, have, ri, q, r) end
  else
    local di, df, q, r, ti, tf, held = ls_gc_state(key, now, limit, period, burst, o)
    reset = di
    if df > 0 then reset = di + 1 end
    rem = gc_left(ti, tf, di, df, burst, q, r, limit, period)
    if need > burst then
      g, retry = 0, -1
    else
      local ni, nf = ls_gc_add(di, df, need, q, r, limit)
      if ni > ti or (ni == ti and nf > tf) then
        g, retry = 0, ni - ti
        if nf > tf then retry = retry + 1 end
      else
        g = want
        if g > rem then g = rem end
        di, df = ls_gc_add(di, df, g, q, r, limit)
        rem = gc_left(ti, tf, di, df, burst, q, r, limit, period)
        reset = di
        if df > 0 then reset = di + 1 end
        retry, untl = 0, now + ttl
      end
    end
    if not held then ls_gc_write(key, now, limit, period, di, df) end
  end
  if g > 0 then
    local k = untl + fill
    if code == 3 then k = untl + period end
    redis.call('HSET', lkey, id, ls_int(g) .. ':' .. ls_int(untl) .. ':' .. ls_int(now) .. ':' .. ls_int(reset) .. ':' .. ls_int(k))
    if k > keep then keep = k end
  end
  ls_settle()
  ls_keep()
  if g > 0 then return {now, g, untl, 1, rem, reset, 0} end
  return {now, 0, 0, 0, rem, reset, retry}
end

if op == 'return' then
  local back = 0
  if window then
    for i = 7, #ARGV - 1, 2 do
      local s = slices[ARGV[i]]
      if s then
        back = back + ls_window_return(code, key, now, limit, period, burst, s, tonumber(ARGV[i + 1]) or 0)
        slices[ARGV[i]] = nil
        redis.call('HDEL', lkey, ARGV[i])
      end
    end
    return {now, back}
  end
  -- A bucket: the returned units go back into the level, which stays
  -- within B - (the live slices left) since each returned unit was part of
  -- its slice's units.
  local picked = {}
  for i = 7, #ARGV - 1, 2 do
    local s = slices[ARGV[i]]
    if s and s[2] > now then
      local u = tonumber(ARGV[i + 1]) or 0
      if u > s[1] then u = s[1] end
      if u < 0 then u = 0 end
      picked[#picked + 1] = u
      live = live - s[1]
      slices[ARGV[i]] = nil
      redis.call('HDEL', lkey, ARGV[i])
    end
  end
  -- The units go back in the numbers the record is written under, not
  -- the caller's: a return sent under a rule since changed (its slice
  -- was taken before) would otherwise convert a record other instances
  -- already wrote under the new numbers back to the old ones, where the
  -- part used past the old burst does not fit and was forgotten (a
  -- burst raised from 10 to 100 admitted 190).
  if code == 5 then
    -- (a record full again counts as absent, as in ls_tb_state)
    local tokens, ts, sl, sp, sb = token_bucket_load(key)
    if tokens then
      local sq = math.floor(sp / sl)
      if tb_level(tokens, ts, now, sb, sq, sp - sq * sl, sl, sp) < sb then limit, period, burst = sl, sp, sb end
    end
    local have, ri, rf, q, r = ls_tb_state(key, now, limit, period, burst, o)
    for _, u in ipairs(picked) do
      have = have + u
      back = back + u
    end
    local c = math.max(burst - live, 0)
    if have >= c then have, ri = c, 0 end
    ls_tb_write(key, now, limit, period, burst, have, ri, q, r)
  else
    -- the backlog as stored, not held to the caller's tolerance either:
    -- a return only shortens it
    -- (a record whose TAT has passed counts as absent, as in ls_gc_state)
    local t, f, sl, sp = gcra_load(key)
    local di, df = 0, 0
    if t and (t > now or (t == now and f > 0)) then
      limit, period, di, df = sl, sp, t - now, f
    end
    local q = math.floor(period / limit)
    local r = period - q * limit
    local oi, of = gc_times(o, q, r, limit)
    if di < oi or (di == oi and df < of) then di, df = oi, of end
    for _, u in ipairs(picked) do
      di, df = ls_gc_add(di, df, -u, q, r, limit)
      back = back + u
    end
    local li, lf = gc_times(live, q, r, limit)
    if di < li or (di == li and df < lf) then di, df = li, lf end
    ls_gc_write(key, now, limit, period, di, df)
  end
  ls_settle()
  return {now, back}
end

if op == 'reset' then
  if window then
    local untl = 0
    for _, s in pairs(slices) do
      if s[2] > now and s[2] > untl then untl = s[2] end
    end
    ls_window_reset(code, key, now, limit, period, live, untl)
  elseif code == 5 then
    local q = math.floor(period / limit)
    local r = period - q * limit
    redis.call('DEL', key)
    ls_tb_write(key, now, limit, period, burst, math.max(burst - live, 0), 0, q, r)
  else
    local q = math.floor(period / limit)
    local r = period - q * limit
    local di, df = gc_times(live, q, r, limit)
    ls_gc_write(key, now, limit, period, di, df)
  end
  ls_settle()
  return {now}
end

return redis.error_reply('rategate: unknown lease operation ' .. tostring(op))
