-- gcra.lua (bench/minimal) — interval T = P/L, tolerance B*T: tat = max(stored, now),
-- new = tat + T; allow iff new - now <= B*T, then store new.
-- KEYS[1]  a string: the theoretical arrival time in µs; it expires when that passes
-- ARGV[1]  T in whole µs (rounded up)   ARGV[2] B*T in µs
-- Reply    {allowed 0|1, remaining, reset ms, retry ms}
-- By hand: redis-cli --eval bench/minimal/gcra.lua min:u:alice , 12000000 60000000
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local T, tau = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = math.max(tonumber(redis.call('GET', KEYS[1])) or now, now)
local new = tat + T
if new - now > tau then
  return {0, 0, math.ceil((tat - now) / 1000), math.ceil((new - now - tau) / 1000)}
end
redis.call('SET', KEYS[1], new, 'PX', math.ceil((new - now) / 1000))
return {1, math.floor((tau - (new - now)) / T), math.ceil((new - now) / 1000), 0}
