-- sliding_log.lua — the exact log of the requests admitted in the last period.
--
-- KEYS[1]  the rule's key (a sorted set: one member per admitted request,
--          score = its time in µs, member = "<n><K>:<c>": c its cost, K the
--          running total of the costs admitted to this key up to and
--          including it, n a letter that gives K's number of digits)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME (tests pass a clock)
-- ARGV[2]  limit L   ARGV[3] period P (µs)   ARGV[4] burst (unused)   ARGV[5] cost c
-- Reply    {allowed 0|1, remaining, reset_us, retry_us (-1 = cost can never fit)}
--
-- Algorithm: the window is (now-P, now]; allow iff the costs of the entries in
-- it plus c fit in L, then add {now, c}. Exact; memory grows with L.
--
-- Bounded work: no decision reads the log. The running totals make the sum of
-- the window two reads, the oldest entry in it and the newest one:
-- used = K(newest) - (K(oldest) - c(oldest)). Entries are kept in admission
-- order, which is time order (an entry is timed max(now, newest), so a clock
-- that steps back cannot put one before another) and, within one µs, member
-- order (the letter makes "b10" sort after "a9"); so K grows with the rank,
-- and the members are unique. A denial's retry is the oldest entry whose
-- departure frees need = used + c - L: the first rank whose K reaches
-- K(oldest) - c(oldest) + need, found by a binary search over ranks, within
-- the first need entries (each costs at least 1): O(log need) reads, and need
-- <= c unless a lower limit left more than L in the window. An admission
-- removes up to 128 entries that have left, or the whole log when nothing is
-- left in the window (UNLINK), and adds one. So a decision costs O(log n),
-- whatever L is. Denials and looks write nothing but, after a period
-- change, the expiry (below).
--
-- reset = until the newest entry leaves (the whole quota is back), 0 when empty.
-- retry = until enough of the oldest entries have left for c to fit: an entry
-- at t leaves once now - P >= t, so retry = t_k + P - now for the first t_k
-- (oldest first) whose departure frees enough. The key expires when its newest
-- entry leaves, P after it.
--
-- Rule changes (a reload or override changes L or P under a live key): the
-- entries in the new window count against the new L as they stand; a longer P
-- counts the older entries still kept (an admission drops up to 128 of those
-- outside the window of its rule, all of them when none is inside; the same
-- ones come back into the window if the Redis clock steps back), and any
-- decision that costs something moves the expiry out to P after the newest
-- entry, so that a longer P keeps them to its end. The memory store keeps
-- and drops exactly the same entries.
--
-- TTLs are at least 2 ms (math.max(..., 2)): Redis 7.0 deletes a key at once
-- on PEXPIRE 1 when a millisecond boundary passes between the command's two
-- clock reads, which would drop a count written in its window's last
-- millisecond (the record says itself when it ends, so 1 ms more is harmless).
--
-- By hand: redis-cli --eval lua/sliding_log.lua rg:{demo:1.2.3.4}:sl2 , 0 5 60000000 5 1

-- sl_int formats an integral number without Lua's %.14g rounding (µs clocks
-- have 16 digits).
local function sl_int(x)
  return string.format('%d', x)
end

local function sl_member(k, c)
  local s = sl_int(k)
  return string.char(96 + #s) .. s .. ':' .. sl_int(c)
end

-- sl_parse returns a member's running total and cost.
local function sl_parse(m)
  local k, c = string.match(m, '^%a(%d+):(%d+)$')
  return tonumber(k), tonumber(c)
end

-- sl_keep makes the key live until its newest entry, at `newest`, leaves
-- the window of this rule, if it would expire earlier (a longer period).
local function sl_keep(key, now, period, newest)
  local ms = math.max(math.ceil((newest + period - now) / 1000), 2)
  local ttl = redis.call('PTTL', key)
  if ttl >= 0 and ttl < ms then redis.call('PEXPIRE', key, ms) end
end

-- sliding_log_put drops what has left the window and adds the entry, in
-- bounded work. k == cost says the window held nothing (every member's
-- running total includes its own cost of at least 1): the whole log goes,
-- with UNLINK, which frees a large set off Redis's main thread (a burst of
-- 10000 entries in one µs leaving together held Redis for milliseconds with
-- ZREMRANGEBYSCORE). Otherwise the newest entry stays and at most 128 of
-- the oldest departed ones go, by rank: the rest go with the next
-- admissions (each adds one entry and removes up to 128). Those left behind
-- are not counted (the window's sum is read from the running totals), and
-- their totals are below every later one, so ranks still follow totals.
local function sliding_log_put(key, now, limit, period, burst, at, k, cost, ttl)
  if k == cost then
    redis.call('UNLINK', key)
  else
    local gone = redis.call('ZCOUNT', key, '-inf', sl_int(now - period))
    if gone > 0 then redis.call('ZREMRANGEBYRANK', key, 0, math.min(gone, 128) - 1) end
  end
  redis.call('ZADD', key, sl_int(at), sl_member(k, cost))
  redis.call('PEXPIRE', key, math.max(math.ceil(ttl / 1000), 2))
end

-- sliding_log returns allowed, remaining, reset, retry. solo true (a
-- request of one check) writes an admission at once (any other solo, as
-- rg_chain's "count", hands it back); otherwise an admission also
-- returns what sliding_log_put needs (the new entry's time, running total
-- and cost, and the key's TTL), then the remaining and reset a zero-cost
-- look would report instead; and the key's expiry is seen to here (the
-- put may come later, or not at all when another rule denies).
local function sliding_log(key, now, limit, period, burst, cost, solo)
  local cut = sl_int(now - period)
  local first = redis.call('ZRANGEBYSCORE', key, '(' .. cut, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local used, base, fk, last, lastk = 0, 0, 0, nil, 0
  if #first > 0 then
    local fc
    fk, fc = sl_parse(first[1])
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    lastk = sl_parse(newest[1])
    if fk and lastk then
      base = fk - fc
      last = tonumber(newest[2])
      used = lastk - base
    else
      -- members of another layout (an earlier build, or not rategate's):
      -- no running totals to trust; the identity starts afresh
      if cost > 0 then redis.call('UNLINK', key) end
      fk, lastk = 0, 0
    end
  end

  if used + cost > limit then
    local remaining = limit - used
    if remaining < 0 then remaining = 0 end
    local reset = 0
    if last then reset = last + period - now end
    local retry = -1
    if cost <= limit then
      -- 1 <= need <= used because cost <= limit, so the entry exists.
      local need = used + cost - limit
      local at = tonumber(first[2])
      if fk - base < need then
        local lo = redis.call('ZCOUNT', key, '-inf', cut) + 1
        local hi = math.min(lo + need - 2, redis.call('ZCARD', key) - 1)
        at = nil
        while lo < hi do
          local mid = math.floor((lo + hi) / 2)
          local m = redis.call('ZRANGE', key, mid, mid, 'WITHSCORES')
          -- a member of another layout counts as enough: an earlier retry
          if (sl_parse(m[1]) or math.huge) - base >= need then
            hi, at = mid, tonumber(m[2])
          else
            lo = mid + 1
          end
        end
        if not at then at = tonumber(redis.call('ZRANGE', key, hi, hi, 'WITHSCORES')[2]) end
      end
      retry = at + period - now
    end
    if cost > 0 and last then sl_keep(key, now, period, last) end
    return 0, remaining, reset, retry
  end

  local lreset = 0
  if last then lreset = last + period - now end
  if cost == 0 then return 1, limit - used, lreset, 0 end
  if last and solo ~= true then sl_keep(key, now, period, last) end
  -- After a clock step back the newest entry can be later than now.
  local at = now
  if last and last > now then at = last end
  local reset = at + period - now
  if solo == true then
    sliding_log_put(key, now, limit, period, burst, at, lastk + cost, cost, reset)
    return 1, limit - used - cost, reset, 0
  end
  return 1, limit - used - cost, reset, 0, at, lastk + cost, cost, reset, limit - used, lreset
end

-- sliding_log_refund removes the entry a commit at `at` added (see
-- refund.lua). The commit reported reset = its entry's time + P - at, so the
-- entry is at t = at + reset - P. Entries with one time and one cost are
-- interchangeable, so it removes the newest such; the entries after it (those
-- admitted since, one round trip's worth) get their running totals lowered by
-- its cost, so the log is exactly the one without the request. An entry that
-- has left the window is no longer counted and is left alone. The search
-- reads the 256 newest entries at or after t, no more: entries in one µs (a
-- batch shares its instant, and after the Redis clock steps back every
-- admission takes the newest's time) could otherwise make one refund read
-- the whole log (10 ms at 10000). If the newest entry with the request's
-- time and cost has more than 255 newer ones, nothing is given back:
-- stricter, never looser. The TTL is left as the last write set it: it
-- still covers every entry, and shortening it to this commit's period
-- would drop entries a rule lengthened since still counts (deleting a key
-- whose entries have all left would also free, on Redis's main thread, the
-- departed entries admissions have not removed yet).
local function sliding_log_refund(key, now, limit, period, burst, cost, at, rem, reset)
  local t = at + reset - period
  if t <= now - period then return end
  local s = sl_int(t)
  local later = redis.call('ZREVRANGEBYSCORE', key, '+inf', s, 'WITHSCORES', 'LIMIT', 0, 256)
  local mine = nil
  for i = 1, #later, 2 do
    if tonumber(later[i + 1]) == t then
      local _, c = sl_parse(later[i])
      if c == cost then
        mine = i
        break
      end
    end
  end
  if not mine then return end
  redis.call('ZREM', key, later[mine])
  -- oldest first: each new name is below every name still to be renamed,
  -- and above every older one. The new name goes in before the old one
  -- leaves, so the key never empties (which would drop its TTL).
  for i = mine - 2, 1, -2 do
    local k, c = sl_parse(later[i])
    redis.call('ZADD', key, later[i + 1], sl_member(k - cost, c))
    redis.call('ZREM', key, later[i])
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
return {sliding_log(KEYS[1], now, limit, period, burst, tonumber(ARGV[5]), true)}
