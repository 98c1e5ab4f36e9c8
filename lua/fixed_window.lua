-- fixed_window.lua — one counter per epoch-aligned window.
--
-- KEYS[1]  the rule's key: a string of two doubles, struct.pack('<dd', e,
--          n): e = the end of the window the count was counted in, µs; n =
--          the count (each an integer below 2^53, so a double holds it
--          exactly; see sliding_window.lua for why a string, not a hash)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME (tests pass a clock)
-- ARGV[2]  limit L   ARGV[3] period P (µs)   ARGV[4] burst (unused)   ARGV[5] cost c
-- Reply    {allowed 0|1, remaining, reset_us, retry_us (-1 = cost can never fit)}
--
-- Algorithm: the window is [ws, we) with ws = floor(now / P) * P; allow iff
-- count + c <= L, then count += c. The count is in force while now < e, and
-- the key expires at e, so an idle identity costs nothing.
--
-- Rule changes (a reload or override can change L and P under a live key):
-- the count is compared with the new L as it stands (3 used of a new limit of
-- 2 is limited; of 6, 3 remain), and it stays in force while the window it
-- was counted in overlaps the current one. So a count from a window longer
-- than P (P shrank) holds until its own end e; a count from a shorter window
-- (P grew) holds to the end of the current window we: the first decision that
-- costs something moves e (and the TTL) to we. A count added to a longer
-- window keeps that window's end (the strict side). With P unchanged e is
-- always we and nothing of this shows.
--
-- TTLs are at least 2 ms (math.max(..., 2)): Redis 7.0 deletes a key at once
-- on PEXPIRE 1 when a millisecond boundary passes between the command's two
-- clock reads, which would drop a count written in its window's last
-- millisecond (the record says itself when it ends, so 1 ms more is harmless).
--
-- By hand: redis-cli --eval lua/fixed_window.lua rg:{demo:1.2.3.4}:fw2 , 0 5 60000000 5 1

-- fixed_window_put writes count, counted in the window that ends at e: a
-- new record with its expiry, or the count of the record there is; to io
-- when given (records.lua). The record there is (e as stored, the expiry
-- kept) gets only its count's eight bytes, by SETRANGE: Redis changes the
-- string in place and answers a number, where SET … KEEPTTL builds a new
-- value and answers a status Lua turns into a table (see
-- docs/algorithms.md, "Record layouts").
local function fixed_window_put(key, now, limit, period, burst, count, e, new, _, io)
  if io then
    if not new and rg_set(io, key, 2, count) then return end
    local ms = nil
    if new then ms = math.max(math.ceil((e - now) / 1000), 2) end
    rg_hold(io, key, struct.pack('<dd', e, count), ms)
  elseif new then
    redis.call('SET', key, struct.pack('<dd', e, count), 'PX', math.max(math.ceil((e - now) / 1000), 2))
  else
    redis.call('SETRANGE', key, '8', struct.pack('<d', count))
  end
end

-- fixed_window returns allowed, remaining, reset, retry. solo true (a
-- request of one check) writes an admission at once, and so does solo
-- "count" (decide.lua's rg_chain) where only the count of the record
-- there is changes (n, at byte 8: rg_chain takes it off again when
-- another rule denies); otherwise an admission also returns what
-- fixed_window_put needs (the new count, the end of the window it is
-- counted in, and whether the record is new: true, written
-- with its expiry; false, the window's first commit set the expiry
-- already), then the remaining and reset a zero-cost look would report
-- instead (for a request another rule denies). io, when given, holds the
-- key (records.lua): it is read and written there.
local function fixed_window(key, now, limit, period, burst, cost, solo, io)
  -- now % period is now - floor(now / period) * period in Lua 5.1, exact
  -- for integers below 2^53
  local we = now - now % period + period
  -- v the record as stored; r the held one, decoded (records.lua)
  local v, r
  if io then
    v = io[key]
    if type(v) == 'table' then r = v end
  else
    v = redis.call('GET', key)
  end
  local e, count = nil, 0
  if v then
    if r then
      e, count = r[1], r[2]
    else
      if #v ~= 16 then error('rategate: ' .. key .. ' does not hold a fixed_window record') end
      e, count = struct.unpack('<dd', v)
      -- held: kept decoded for the call's other decisions
      if io then r = {e, count}; io[key] = r end
    end
    if e <= now then
      e, count = nil, 0
    elseif e < we then
      -- counted under a shorter period: in force to the end of this window
      e = we
      if cost > 0 then fixed_window_put(key, now, limit, period, burst, count, e, true, nil, io) end
    end
  end
  local reset = (e or we) - now
  -- held, in force, and ending where it is in force (not a record of a
  -- shorter period that this window has yet to take over: a look rewrites
  -- nothing, and the first admission must move its end and expiry): the
  -- call's further admissions add to the count alone (records.lua)
  if r and e == r[1] then rg_shortcut(key, r, 0, period, reset) end
  if count + cost > limit then
    local retry = reset
    if cost > limit then retry = -1 end
    if count == 0 then reset = 0 end
    local remaining = limit - count
    if remaining < 0 then remaining = 0 end
    return 0, remaining, reset, retry
  end
  if count + cost == 0 then return 1, limit, 0, 0 end
  if cost == 0 then return 1, limit - count, reset, 0 end
  -- the last two: what a zero-cost look reports now (decide.lua's denials)
  if solo == true or (solo and e) then
    fixed_window_put(key, now, limit, period, burst, count + cost, e or we, not e, nil, io)
    return 1, limit - count - cost, reset, 0
  end
  local lreset = reset
  if count == 0 then lreset = 0 end
  return 1, limit - count - cost, reset, 0, count + cost, e or we, not e, nil, limit - count, lreset
end

-- fixed_window_refund gives back cost, which a commit at `at` added, when the
-- request as a whole was denied by a rule in another cluster slot (refund.lua).
-- The commit reported reset = its record's end - at, so that record ends at
-- at + reset; a record is only ever extended while in force, never replaced,
-- so if it has not ended it still holds the cost. Counts are additive: the
-- refund is exact. A record that has ended has nothing left to give back.
local function fixed_window_refund(key, now, limit, period, burst, cost, at, rem, reset)
  local ends = at + reset
  if now >= ends then return end
  local v = redis.call('GET', key)
  if not v or #v ~= 16 then return end
  local e, count = struct.unpack('<dd', v)
  if e < ends then return end
  count = count - cost
  if count <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SETRANGE', key, '8', struct.pack('<d', count))
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
return {fixed_window(KEYS[1], now, limit, period, burst, tonumber(ARGV[5]), true)}
