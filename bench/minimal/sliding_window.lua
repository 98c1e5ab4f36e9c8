-- sliding_window.lua (bench/minimal) — the two-window estimate:
-- est = prev * (P - elapsed) / P + curr; allow iff est + 1 <= L, then curr += 1.
-- KEYS[1]  a hash: w = window index floor(now / P), c = its count, p = window w-1's count
-- ARGV[1]  limit L   ARGV[2] period P in ms
-- Reply    {allowed 0|1, remaining, reset ms, retry ms}; the key expires at the end of window w+1.
-- By hand: redis-cli --eval bench/minimal/sliding_window.lua min:u:alice , 5 60000
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local limit, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local w = math.floor(now / period)
local el = now - w * period
local s = redis.call('HMGET', KEYS[1], 'w', 'c', 'p')
local sw, curr, prev = tonumber(s[1]), tonumber(s[2]) or 0, tonumber(s[3]) or 0
if sw == w - 1 then prev, curr = curr, 0 elseif sw ~= w then prev, curr = 0, 0 end
local est = prev * (period - el) / period + curr
local reset = (w + 2) * period - now
if est + 1 > limit then
  -- prev decays within this window, or the next one must take curr as its prev
  local retry = period - el + math.ceil(period - (limit - 1) * period / math.max(curr, 1))
  if curr + 1 <= limit then retry = math.ceil(period - (limit - 1 - curr) * period / prev) - el end
  if curr == 0 then reset = reset - period end
  return {0, math.max(math.floor(limit - est), 0), reset, retry}
end
if sw == w then
  redis.call('HINCRBY', KEYS[1], 'c', 1)
else
  redis.call('HSET', KEYS[1], 'w', w, 'c', 1, 'p', prev)
  redis.call('PEXPIRE', KEYS[1], reset)
end
return {1, math.floor(limit - est - 1), reset, 0}
