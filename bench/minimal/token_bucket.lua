-- token_bucket.lua (bench/minimal) — B tokens refilled at L per P, starting full;
-- allow iff tokens >= 1, then tokens -= 1.
-- KEYS[1]  a hash: k = tokens at ts (fractional), ts = µs; it expires once full again
-- ARGV[1]  limit L   ARGV[2] period P in µs   ARGV[3] burst B
-- Reply    {allowed 0|1, remaining, reset ms, retry ms}
-- By hand: redis-cli --eval bench/minimal/token_bucket.lua min:u:alice , 5 60000000 5
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local limit, period, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local s = redis.call('HMGET', KEYS[1], 'k', 'ts')
local k = burst
if s[1] then k = math.min(burst, tonumber(s[1]) + math.max(now - tonumber(s[2]), 0) * limit / period) end
if k < 1 then
  return {0, 0, math.ceil((burst - k) * period / limit / 1000), math.ceil((1 - k) * period / limit / 1000)}
end
k = k - 1
local full = math.ceil((burst - k) * period / limit / 1000)
redis.call('HSET', KEYS[1], 'k', k, 'ts', now)
redis.call('PEXPIRE', KEYS[1], full)
return {1, math.floor(k), full, 0}
