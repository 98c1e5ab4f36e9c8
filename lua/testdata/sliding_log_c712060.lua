-- sliding_log.lua — the exact log of the requests admitted in the last period.
--
-- KEYS[1]  the rule's key (a sorted set: one member per admitted request,
--          score = its time in µs, member = "<time>:<seq>:<cost>")
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME (tests pass a clock)
-- ARGV[2]  limit L   ARGV[3] period P (µs)   ARGV[4] burst (unused)   ARGV[5] cost c
-- Reply    {allowed 0|1, remaining, reset_us, retry_us (-1 = cost can never fit)}
--
-- Algorithm: drop entries with time <= now - P (the window is (now-P, now]);
-- allow iff sum(costs) + c <= L, then add {now, c}. Exact; memory grows with L.
--
-- Members stay unique for requests in the same microsecond: <seq> is the number
-- of members already scored <time> (ZCOUNT, taken at commit). Members sharing a
-- score are only ever removed together (ZREMRANGEBYSCORE removes a whole score
-- or none of it; expiry and DEL remove everything), so they are always exactly
-- <time>:0 .. <time>:k-1 and <time>:k is new. The cost rides in the member
-- because a sorted set has nowhere else to keep it.
--
-- reset = until the newest entry leaves (the whole quota is back), 0 when empty.
-- retry = until enough of the oldest entries have left for c to fit: an entry
-- at t leaves once now - P >= t, so retry = t_k + P - now for the first t_k
-- (oldest first) whose departure frees enough. The key expires when its newest
-- entry leaves, P after the last admission.
--
-- By hand: redis-cli --eval lua/sliding_log.lua rg:{demo:1.2.3.4}:sl , 0 5 60000000 5 1

-- sl_int formats an integral number without Lua's %.14g rounding (µs clocks
-- have 16 digits).
local function sl_int(x)
  return string.format('%d', x)
end

local function sliding_log(key, now, limit, period, burst, cost)
  -- Trimming changes nothing logically (expired entries count for nothing),
  -- so it runs before the verdict, even for a request that is then denied.
  redis.call('ZREMRANGEBYSCORE', key, '-inf', sl_int(now - period))
  local log = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local costs, used = {}, 0
  for i = 1, #log, 2 do
    local c = tonumber(string.match(log[i], ':(%d+)$'))
    costs[#costs + 1] = c
    used = used + c
  end
  local last = nil
  if #log > 0 then last = tonumber(log[#log]) end

  if used + cost > limit then
    local remaining = limit - used
    if remaining < 0 then remaining = 0 end
    local reset = 0
    if last then reset = last + period - now end
    local retry = -1
    if cost <= limit then
      -- need <= used because cost <= limit, so the walk always ends.
      local need, freed = used + cost - limit, 0
      for j = 1, #costs do
        freed = freed + costs[j]
        if freed >= need then
          retry = tonumber(log[2 * j]) + period - now
          break
        end
      end
    end
    return 0, remaining, reset, retry, nil
  end

  if cost == 0 then
    local reset = 0
    if last then reset = last + period - now end
    return 1, limit - used, reset, 0, nil
  end
  -- After a clock step back the newest entry can be later than now.
  if not last or last < now then last = now end
  local reset = last + period - now
  return 1, limit - used - cost, reset, 0, function()
    local seq = redis.call('ZCOUNT', key, sl_int(now), sl_int(now))
    redis.call('ZADD', key, sl_int(now), string.format('%d:%d:%d', now, seq, cost))
    redis.call('PEXPIRE', key, sl_int(math.ceil(reset / 1000)))
  end
end

-- sliding_log_refund removes the entry a commit at `at` added (see
-- refund.lua). Entries at one score with one cost are interchangeable, so it
-- removes one of them, preferring the highest <seq>; when that one has another
-- cost it takes the freed <seq>, so the members at `at` stay <at>:0 .. <at>:k-2
-- and the next ZCOUNT still names a new member. The TTL follows the newest
-- entry left.
local function sliding_log_refund(key, now, limit, period, burst, cost, at)
  local s = sl_int(at)
  local members = redis.call('ZRANGEBYSCORE', key, s, s)
  local last, lastseq, lastcost = nil, -1, 0
  local mine, mineseq = nil, -1
  for _, m in ipairs(members) do
    local seq, c = string.match(m, ':(%d+):(%d+)$')
    seq, c = tonumber(seq), tonumber(c)
    if seq and c then
      if seq > lastseq then last, lastseq, lastcost = m, seq, c end
      if c == cost and seq > mineseq then mine, mineseq = m, seq end
    end
  end
  if not mine then return end
  redis.call('ZREM', key, mine)
  if mine ~= last then
    redis.call('ZREM', key, last)
    redis.call('ZADD', key, s, string.format('%s:%d:%d', s, mineseq, lastcost))
  end
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #newest == 0 then return end
  local ttl = tonumber(newest[2]) + period - now
  if ttl <= 0 then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, sl_int(math.ceil(ttl / 1000)))
  end
end

-- @standalone: everything below runs only under redis-cli --eval; the
-- multi-rule script (decide.lua) includes the functions above.
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local a, rem, reset, retry, commit = sliding_log(KEYS[1], now,
  tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
if a == 1 and commit then commit() end
return {a, rem, reset, retry}
