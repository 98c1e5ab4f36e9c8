-- sliding_window.lua — the two-window estimate (a sliding window counter).
--
-- KEYS[1]  the rule's key (a hash: w = window index, c = count of window w,
--          p = count of window w-1)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME (tests pass a clock)
-- ARGV[2]  limit L   ARGV[3] period P (µs)   ARGV[4] burst (unused)   ARGV[5] cost c
-- Reply    {allowed 0|1, remaining, reset_us, retry_us (-1 = cost can never fit)}
--
-- Algorithm: w = floor(now / P), elapsed = now - w*P, est = prev * (1 - elapsed/P)
-- + curr; allow iff est + c <= L, then curr += c. O(1) memory per key.
--
-- Float convention, repeated operation for operation by the Go twin
-- (limits/algo_sliding_window.go) so both stores agree to the last bit:
--   est = prev * (1 - elapsed / P) + curr
-- evaluated left to right as four rounded doubles (q = elapsed / P; k = 1 - q;
-- x = prev * k; est = x + curr), then the verdict est + c <= L. All inputs are
-- integers below 2^53, so they are exact doubles (and floor(now / P) is exact).
-- prev * (P - elapsed) / P + curr is a different double and is never used.
--
-- remaining = floor(L - est) with est recomputed after admission, never < 0:
-- exactly what a zero-cost look at the same instant reports.
-- reset = until est is 0: end of window w+1 when curr > 0, end of window w when
-- only prev is left, 0 when both are 0.
-- retry = the first µs at which est + c <= L if nothing else is admitted. est
-- only decays, so binary-search elapsed over the float verdict itself: in this
-- window, then in the next (curr becomes prev), then the one after (empty,
-- fits whenever c <= L). The answer is the same in Lua and Go whatever the
-- search path, and no closed form has to be rounded. At most 2 log2(P) steps.
-- The key expires at the end of window w+1: until then its count is the prev
-- of the next window.
--
-- By hand: redis-cli --eval lua/sliding_window.lua rg:{demo:1.2.3.4}:sw , 0 5 60000000 5 1

local function sw_int(x)
  return string.format('%d', x)
end

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

local function sw_reset(prev, curr, w, period, now)
  if curr > 0 then return (w + 2) * period - now end
  if prev > 0 then return (w + 1) * period - now end
  return 0
end

local function sliding_window(key, now, limit, period, burst, cost)
  local w = math.floor(now / period)
  local elapsed = now - w * period
  local prev, curr = 0, 0
  local st = redis.call('HMGET', key, 'w', 'c', 'p')
  local sw = tonumber(st[1])
  if sw == w then
    curr, prev = tonumber(st[2]) or 0, tonumber(st[3]) or 0
  elseif sw == w - 1 then
    prev = tonumber(st[2]) or 0
  end

  local est = sw_estimate(prev, curr, elapsed, period)
  if est + cost > limit then
    local remaining = math.floor(limit - est)
    if remaining < 0 then remaining = 0 end
    local retry = -1
    if cost <= limit then
      local e = sw_earliest(prev, curr, elapsed, period, limit, cost)
      if e >= 0 then
        retry = e - elapsed
      else
        e = sw_earliest(curr, 0, 0, period, limit, cost)
        if e >= 0 then
          retry = period + e - elapsed
        else
          retry = 2 * period - elapsed
        end
      end
    end
    return 0, remaining, sw_reset(prev, curr, w, period, now), retry, nil
  end

  curr = curr + cost
  est = sw_estimate(prev, curr, elapsed, period)
  local remaining = math.floor(limit - est)
  if remaining < 0 then remaining = 0 end
  local reset = sw_reset(prev, curr, w, period, now)
  if cost == 0 then
    return 1, remaining, reset, 0, nil
  end
  return 1, remaining, reset, 0, function()
    if sw == w then
      -- The window's first commit already set the expiry to (w+2)*P.
      redis.call('HSET', key, 'c', sw_int(curr))
      return
    end
    redis.call('HSET', key, 'w', sw_int(w), 'c', sw_int(curr), 'p', sw_int(prev))
    redis.call('PEXPIRE', key, sw_int(math.ceil(((w + 2) * period - now) / 1000)))
  end
end

-- sliding_window_refund gives back cost, which a commit at `at` added to the
-- count of window w = floor(at / P) (see refund.lua): from curr while w is
-- still the stored window, from prev once the next window has taken over.
-- The estimate is linear in the counts, so the refund is exact.
local function sliding_window_refund(key, now, limit, period, burst, cost, at)
  local w = math.floor(at / period)
  local st = redis.call('HMGET', key, 'w', 'c', 'p')
  local sw = tonumber(st[1])
  local curr, prev = tonumber(st[2]) or 0, tonumber(st[3]) or 0
  if sw == w then
    curr = math.max(curr - cost, 0)
  elseif sw == w + 1 then
    prev = math.max(prev - cost, 0)
  else
    return
  end
  if curr == 0 and prev == 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'c', sw_int(curr), 'p', sw_int(prev))
  end
end

-- @standalone: everything below runs only under redis-cli --eval; the
-- multi-rule script (decide.lua) includes the functions above.
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local a, rem, reset, retry, commit = sliding_window(KEYS[1], now,
  tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
if a == 1 and commit then commit() end
return {a, rem, reset, retry}
