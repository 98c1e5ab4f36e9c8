-- fixed_window.lua (bench/minimal) — one counter per epoch-aligned window
-- w = floor(now / P); allow iff count_w + 1 <= L, then count_w += 1.
-- KEYS[1]  a hash: w = window index, n = its count; it expires at the window's end
-- ARGV[1]  limit L   ARGV[2] period P in ms
-- Reply    {allowed 0|1, remaining, reset ms, retry ms}
-- By hand: redis-cli --eval bench/minimal/fixed_window.lua min:g , 5 60000
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local limit, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local w = math.floor(now / period)
local reset = (w + 1) * period - now
local s = redis.call('HMGET', KEYS[1], 'w', 'n')
local n = 0
if tonumber(s[1]) == w then n = tonumber(s[2]) or 0 end
if n + 1 > limit then return {0, 0, reset, reset} end
if n == 0 then
  redis.call('HSET', KEYS[1], 'w', w, 'n', 1)
  redis.call('PEXPIRE', KEYS[1], reset)
else
  redis.call('HINCRBY', KEYS[1], 'n', 1)
end
return {1, limit - n - 1, reset, 0}
