-- fixed_window.lua — one counter per epoch-aligned window.
--
-- KEYS[1]  the rule's key (a hash: w = window index, n = count)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME (tests pass a clock)
-- ARGV[2]  limit L   ARGV[3] period P (µs)   ARGV[4] burst (unused)   ARGV[5] cost c
-- Reply    {allowed 0|1, remaining, reset_us, retry_us (-1 = cost can never fit)}
--
-- Algorithm: w = floor(now / P); allow iff count_w + c <= L, then count_w += c.
-- The key expires at the end of its window, so an idle identity costs nothing.
--
-- By hand: redis-cli --eval lua/fixed_window.lua rg:{demo:1.2.3.4}:fw , 0 5 60000000 5 1

local function fixed_window(key, now, limit, period, burst, cost)
  local w = math.floor(now / period)
  local count = 0
  local st = redis.call('HMGET', key, 'w', 'n')
  local same = st[1] and tonumber(st[1]) == w
  if same then
    count = tonumber(st[2]) or 0
  end
  local reset = (w + 1) * period - now
  if count + cost > limit then
    local retry = reset
    if cost > limit then retry = -1 end
    if count == 0 then reset = 0 end
    return 0, limit - count, reset, retry, nil
  end
  count = count + cost
  if count == 0 then
    return 1, limit, 0, 0, nil
  end
  return 1, limit - count, reset, 0, function()
    if same then
      -- The window's first commit already set the expiry to its end.
      redis.call('HSET', key, 'n', string.format('%d', count))
      return
    end
    redis.call('HSET', key, 'w', string.format('%d', w), 'n', string.format('%d', count))
    redis.call('PEXPIRE', key, math.ceil(reset / 1000))
  end
end

-- fixed_window_refund gives back cost, which a commit at `at` added, when the
-- request as a whole was denied by a rule in another cluster slot (refund.lua).
-- Counts are additive, so the refund is exact; a window that has ended has
-- nothing left to give back.
local function fixed_window_refund(key, now, limit, period, burst, cost, at)
  local w = math.floor(at / period)
  local st = redis.call('HMGET', key, 'w', 'n')
  if not st[1] or tonumber(st[1]) ~= w then return end
  local count = (tonumber(st[2]) or 0) - cost
  if count <= 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'n', string.format('%d', count))
  end
end

-- @standalone: everything below runs only under redis-cli --eval; the
-- multi-rule script (decide.lua) includes the function above.
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local a, rem, reset, retry, commit = fixed_window(KEYS[1], now,
  tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
if a == 1 and commit then commit() end
return {a, rem, reset, retry}
