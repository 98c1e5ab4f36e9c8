-- sliding_window.lua — the two-window estimate (a sliding window counter).
--
-- KEYS[1]  the rule's key: a string of four doubles, struct.pack('<dddd',
--          e, c, p, d): e = the end of the window the current count was
--          counted in, µs; c = that count; p = the count of the window before
--          it, which ended at e - d; d = the period, µs, both were counted
--          under. Each is an integer below 2^53, so a double holds it
--          exactly. (A hash of four fields costs Redis three times as much to
--          read: HMGET builds four strings and tonumber parses each; a string
--          is one GET and struct.unpack copies the bytes. See
--          docs/algorithms.md, "Record layouts".)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME (tests pass a clock)
-- ARGV[2]  limit L   ARGV[3] period P (µs)   ARGV[4] burst (unused)   ARGV[5] cost c
-- Reply    {allowed 0|1, remaining, reset_us, retry_us (-1 = cost can never fit)}
--
-- Algorithm: ws = floor(now / P) * P, elapsed = now - ws, est = prev * (1 -
-- elapsed/P) + curr; allow iff est + c <= L, then curr += c. O(1) memory.
--
-- Which stored count is curr and which prev: a count whose window ends after
-- ws (it overlaps the current window) is curr; one whose window ended within
-- the last P before ws is prev; anything older is gone. With P unchanged the
-- stored window is the current one (e = ws + P: c is curr, p is prev) or the
-- one before (e = ws: c is prev), which is the textbook algorithm.
--
-- Rule changes (a reload or override changes L or P under a live key): the
-- counts are compared with the new L as they stand, and a count stays curr
-- while the window it was counted in overlaps the current one: a count from a
-- longer window (P shrank) stays curr, at full weight, until that window ends
-- (any prev count is then folded into curr: the strict side); one from a
-- shorter window (P grew) is curr to the end of this window. The first
-- decision that costs something rewrites the record in those terms, under the
-- new P (d), and moves the TTL accordingly.
--
-- Float convention, repeated operation for operation by the Go twin
-- (limits/memstore/algo_sliding_window.go) so both stores agree to the last bit:
--   est = prev * (1 - elapsed / P) + curr
-- evaluated left to right as four rounded doubles (q = elapsed / P; k = 1 - q;
-- x = prev * k; est = x + curr), then the verdict est + c <= L. All inputs are
-- integers below 2^53, so they are exact doubles (and floor(now / P) is exact).
-- prev * (P - elapsed) / P + curr is a different double and is never used.
--
-- remaining = floor(L - est) with est recomputed after admission, never < 0:
-- exactly what a zero-cost look at the same instant reports.
-- reset = until est is 0: the start of the window in which the newest count
-- no longer counts (sw_gone), 0 when both counts are 0.
-- retry = the first µs at which est + c <= L if nothing else is admitted. est
-- only decays, so binary-search elapsed over the float verdict itself: in this
-- window, then in the window where curr has become prev, then in the empty one
-- after it (fits whenever c <= L). The answer is the same in Lua and Go
-- whatever the search path, and no closed form has to be rounded. At most
-- 2 log2(P) steps. The key expires when its newest count no longer counts.
--
-- TTLs are at least 2 ms (math.max(..., 2)): Redis 7.0 deletes a key at once
-- on PEXPIRE 1 when a millisecond boundary passes between the command's two
-- clock reads, which would drop a count written in its window's last
-- millisecond (the record says itself when it ends, so 1 ms more is harmless).
--
-- By hand: redis-cli --eval lua/sliding_window.lua rg:{demo:1.2.3.4}:sw2 , 0 5 60000000 5 1

local function sw_estimate(prev, curr, elapsed, period)
  return prev * (1 - elapsed / period) + curr
end

-- sw_earliest is the smallest elapsed in [lo, period) at which cost fits a
-- window holding prev and curr, or -1.
local function sw_earliest(prev, curr, lo, period, limit, cost)
  local hi = period - 1
  if sw_estimate(prev, curr, hi, period) + cost > limit then return -1 end
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if sw_estimate(prev, curr, mid, period) + cost <= limit then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return hi
end

-- sw_gone is the start of the first window of length period in which a count
-- whose window ended at x no longer counts (not even as prev).
local function sw_gone(x, period)
  return (math.floor((x - 1) / period) + 2) * period
end

-- sw_denied is a denial's reply: the quota as it stands (est, from prev and
-- curr, the current count's window ending at cend) and when cost fits.
local function sw_denied(prev, curr, cend, ws, we, elapsed, now, period, limit, cost, est)
  local remaining = math.floor(limit - est)
  if remaining < 0 then remaining = 0 end
  local reset = 0
  if curr > 0 then
    reset = sw_gone(cend, period) - now
  elseif prev > 0 then
    reset = we - now
  end
  local retry = -1
  if cost <= limit then
    -- curr counts as curr until window k1 (k1 = 1 unless carried from a
    -- longer window), as prev in window k1, and is gone after it.
    local k1 = math.floor((cend - ws - 1) / period) + 1
    local f = sw_earliest(prev, curr, elapsed, period, limit, cost)
    if f >= 0 then
      retry = f - elapsed
    else
      f = sw_earliest(curr, 0, 0, period, limit, cost)
      if f >= 0 then
        retry = k1 * period + f - elapsed
      else
        retry = (k1 + 1) * period - elapsed
      end
    end
  end
  return 0, remaining, reset, retry
end

-- sliding_window_put writes the record (e, curr, prev) under this period,
-- expiring at gone (µs: when its counts no longer count), or, gone false,
-- keeping the expiry it has (the record is this window's, as stored, and
-- only c changed: only c's eight bytes are written, by SETRANGE, as in
-- fixed_window.lua); to io when given (records.lua).
local function sliding_window_put(key, now, limit, period, burst, e, curr, prev, gone, io)
  if io then
    if not gone and rg_set(io, key, 2, curr) then return end
    local ms = nil
    if gone then ms = math.max(math.ceil((gone - now) / 1000), 2) end
    rg_hold(io, key, struct.pack('<dddd', e, curr, prev, period), ms)
  elseif gone then
    redis.call('SET', key, struct.pack('<dddd', e, curr, prev, period), 'PX', math.max(math.ceil((gone - now) / 1000), 2))
  else
    redis.call('SETRANGE', key, '8', struct.pack('<d', curr))
  end
end

-- sliding_window returns allowed, remaining, reset, retry. solo true (a
-- request of one check) writes an admission at once, and so does solo
-- "count" (decide.lua's rg_chain) where the record is this window's and
-- only its current count changes (c, at byte 8: rg_chain takes it off
-- again when another rule denies); otherwise an admission that has
-- something to write also returns what sliding_window_put needs (the
-- current count's window end, the new current and previous counts, and
-- when the record stops counting, which sets its expiry; false: the
-- record is this window's, as stored, and only c changes), then the
-- remaining and reset a zero-cost look would report instead, for a
-- request another rule denies. io, when given, holds the key (records.lua):
-- it is read and written there.
local function sliding_window(key, now, limit, period, burst, cost, solo, io)
  -- now % period is now - floor(now / period) * period in Lua 5.1, exact
  -- for integers below 2^53: elapsed and ws are whole µs
  local elapsed = now % period
  local ws = now - elapsed
  local we = ws + period
  -- v the record as stored; r the held one, decoded (records.lua)
  local v, r
  if io then
    v = io[key]
    if type(v) == 'table' then r = v end
  else
    v = redis.call('GET', key)
  end
  local e, sc, sp, d
  if r then
    e, sc, sp, d = r[1], r[2], r[3], r[4]
  elseif v then
    if #v ~= 32 then error('rategate: ' .. key .. ' does not hold a sliding_window record') end
    e, sc, sp, d = struct.unpack('<dddd', v)
    -- held: kept decoded for the call's other decisions
    if io then r = {e, sc, sp, d}; io[key] = r end
  end
  if e == we and d == period and sc > 0 then
    -- The record is this window's, under this period: c is curr, p is prev,
    -- and its expiry (set when c became non-zero) is curr's. The general
    -- path below comes to the same numbers; this is the common case, said
    -- in fewer steps.
    -- sw_estimate's steps, written out: x = prev * (1 - elapsed / P) once,
    -- then x + curr before and after the cost (the same doubles)
    local x = sp * (1 - elapsed / period)
    local est = x + sc
    -- held: the call's further admissions add to c alone (records.lua)
    if r then rg_shortcut(key, r, x, period, we + period - now) end
    if est + cost > limit then
      return sw_denied(sp, sc, we, ws, we, elapsed, now, period, limit, cost, est)
    end
    -- sw_gone(we, period) is we + period: we is a multiple of period
    local reset = we + period - now
    local lrem
    if cost == 0 or not solo then
      lrem = math.floor(limit - est)
      if lrem < 0 then lrem = 0 end
      if cost == 0 then return 1, lrem, reset, 0 end
    end
    local remaining = math.floor(limit - (x + (sc + cost)))
    if remaining < 0 then remaining = 0 end
    if solo then
      -- sliding_window_put(..., we, sc + cost, sp, false, io), written out:
      -- the call costs this path about 2% of a decision inside Redis
      if io then
        -- the held record's c only
        r[2], rg_written[key] = sc + cost, true
      else
        redis.call('SETRANGE', key, '8', struct.pack('<d', sc + cost))
      end
      return 1, remaining, reset, 0
    end
    return 1, remaining, reset, 0, we, sc + cost, sp, false, lrem, reset
  end

  local prev, curr, cend = 0, 0, we
  local same = false
  if e then
    -- the record's own end of life, as its expiry was set (Redis may keep
    -- it a little longer, a fake test clock much longer)
    local gone
    if sc > 0 then gone = sw_gone(e, d) else gone = sw_gone(e - d, d) end
    if now >= gone then e = nil end
  end
  if e then
    if sc > 0 then
      if e > ws then
        curr = sc
        if e > cend then cend = e end
      elseif e > ws - period then
        prev = sc
      end
    end
    if sp > 0 then
      local pe = e - d
      if pe > ws then
        curr = curr + sp
        if pe > cend then cend = pe end
      elseif pe > ws - period then
        prev = prev + sp
      end
    end
    if cend > we and prev > 0 then curr, prev = curr + prev, 0 end
    -- Only c needs writing when the record already says this window, this
    -- period and this prev, and its expiry covers a current count (c > 0:
    -- a record rewritten below with only a previous count expires with
    -- this window, too early for a count added to it).
    same = d == period and e == cend and sp == prev and sc > 0
    if d ~= period and cost > 0 and (curr > 0 or prev > 0) then
      -- counted under another period: rewrite the record under this one
      local gone = sw_gone(cend - period, period)
      if curr > 0 then gone = sw_gone(cend, period) end
      sliding_window_put(key, now, limit, period, burst, cend, curr, prev, gone, io)
    end
  end

  local est = sw_estimate(prev, curr, elapsed, period)
  if est + cost > limit then
    return sw_denied(prev, curr, cend, ws, we, elapsed, now, period, limit, cost, est)
  end

  local reset = sw_gone(cend, period) - now
  local lrem, lreset
  if cost == 0 or solo ~= true then
    lrem, lreset = math.floor(limit - est), 0
    if lrem < 0 then lrem = 0 end
    if curr > 0 then
      lreset = reset
    elseif prev > 0 then
      lreset = we - now
    end
    if cost == 0 then return 1, lrem, lreset, 0 end
  end
  curr = curr + cost
  local remaining = math.floor(limit - sw_estimate(prev, curr, elapsed, period))
  if remaining < 0 then remaining = 0 end
  -- reset + now is sw_gone(cend, period): when curr stops counting
  local gone = not same and reset + now
  if solo == true then
    sliding_window_put(key, now, limit, period, burst, cend, curr, prev, gone, io)
    return 1, remaining, reset, 0
  end
  return 1, remaining, reset, 0, cend, curr, prev, gone, lrem, lreset
end

-- sliding_window_refund gives back cost, which a commit at `at` added to the
-- current count (see refund.lua), from the count that holds it now. The commit
-- reported reset = sw_gone(E) - at for its window end E, which names the
-- window of length P that contains E: the count whose window end lies in it
-- is the commit's, c while the record is the same, p once the next window
-- has taken over, gone after that. A record rewritten under another period
-- since is left alone (stricter). The estimate is linear in the counts, so
-- the refund is exact.
local function sliding_window_refund(key, now, limit, period, burst, cost, at, rem, reset)
  local v = redis.call('GET', key)
  if not v or #v ~= 32 then return end
  local e, curr, prev, d = struct.unpack('<dddd', v)
  if d ~= period then return end
  local m = (at + reset) / period - 2
  if math.floor((e - 1) / period) == m then
    curr = math.max(curr - cost, 0)
  elseif math.floor((e - period - 1) / period) == m then
    prev = math.max(prev - cost, 0)
  else
    return
  end
  if curr == 0 and prev == 0 then
    redis.call('DEL', key)
  else
    -- c and p, side by side from byte 8 (the record keeps its expiry)
    redis.call('SETRANGE', key, '8', struct.pack('<dd', curr, prev))
  end
end

-- @standalone: everything below runs only under redis-cli --eval; the
-- multi-rule scripts (lua.go) include the functions above.
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local limit, period, burst = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
return {sliding_window(KEYS[1], now, limit, period, burst, tonumber(ARGV[5]), true)}
