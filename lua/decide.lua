-- decide.lua — every rule that matched one request, decided all-or-nothing.
--
-- rategate prepends the algorithm functions (the part of each lua/<algo>.lua
-- above its "@standalone" line) to this file and loads the result as one
-- script, so one EVALSHA decides a whole request.
--
-- KEYS[i]  the key of check i (all in one hash slot on Redis Cluster)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME
-- ARGV[2+6(i-1) ...]  per check: algorithm code, limit, period_us, burst, cost, shadow 0|1
--          codes: 1 fixed_window, 2 sliding_log, 3 sliding_window, 4 gcra, 5 token_bucket
-- Reply    {admitted 0|1, now_us, then per check: allowed, remaining, reset_us, retry_us}
--
-- Phase 1 asks every algorithm without writing; phase 2 commits all of them
-- only when no non-shadow check denied. A denied request consumes nothing.

local algorithms = {ALGORITHM_TABLE}

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local n = #KEYS
local reply = {1, now}
local commits = {}
local admitted = 1
for i = 1, n do
  local b = 2 + (i - 1) * 6
  local algo = algorithms[tonumber(ARGV[b])]
  if not algo then
    return redis.error_reply('rategate: unknown algorithm code ' .. tostring(ARGV[b]))
  end
  local a, rem, reset, retry, commit = algo(KEYS[i], now, tonumber(ARGV[b + 1]),
    tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]))
  if a == 0 and ARGV[b + 5] ~= '1' then admitted = 0 end
  local o = 3 + (i - 1) * 4
  reply[o], reply[o + 1], reply[o + 2], reply[o + 3] = a, rem, reset, retry
  -- cost 0 is a look: never written
  if a == 1 then commits[i] = (ARGV[b + 4] ~= '0' and commit) or false end
end

if admitted == 1 then
  for i = 1, n do
    if commits[i] then commits[i]() end
  end
  return reply
end

-- Denied: nothing is written; rules that would have allowed report their
-- quota as it stands (a zero-cost look).
reply[1] = 0
for i = 1, n do
  if commits[i] ~= nil then
    local b = 2 + (i - 1) * 6
    local algo = algorithms[tonumber(ARGV[b])]
    local a, rem, reset, retry = algo(KEYS[i], now, tonumber(ARGV[b + 1]),
      tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), 0)
    local o = 3 + (i - 1) * 4
    reply[o], reply[o + 1], reply[o + 2], reply[o + 3] = a, rem, reset, retry
  end
end
return reply
