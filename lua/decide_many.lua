-- decide_many.lua — several requests' decisions in one call.
--
-- Redis spends most of a decision's time around the algorithm, not in it:
-- reading the command, finding the function, building KEYS and ARGV, one
-- TIME, turning the reply into RESP. When rategate has several decisions
-- queued for one server (single Redis or a Sentinel primary: keys of any
-- slot), it sends them as one FCALL of this function, and pays that once.
-- Only the function library holds it (lua.go wraps this file as the
-- function rg_decide_many, next to rg_decide, which is decide.lua's driver;
-- a decision goes straight to decide.lua's rg_one or rg_all).
--
-- KEYS     every decision's keys, one decision after another
-- ARGV[1]  m, the number of decisions
-- ARGV[2]  r, the number of check shapes: the distinct rule numbers the
--          batch's checks use (a batch's decisions mostly share a few rules)
-- then per shape (5 values): algorithm code, limit, period_us, burst,
--          shadow 0|1
-- then per decision: n, its number of checks, its now (µs, or 0 for Redis
--          TIME), and per check 2 values: its shape (1..r) and its cost
-- Reply    m entries, entry j decide.lua's reply for decision j, or an error
--          reply when decision j failed (a WRONGTYPE key, say): the others
--          are decided all the same.
--
-- Each decision is decide.lua run on its own keys, in order, all inside one
-- atomic call: the same answers as m calls sent back to back at one
-- instant. TIME is read once, before any decision, and decisions that use
-- the Redis clock share it (nothing else runs between them). The layout is
-- checked before anything is decided, and each decision's own arguments
-- are read inside its pcall, so a malformed call fails whole, having
-- written nothing, and a failing decision fails alone. A decision that
-- fails may have written what it wrote before its error, exactly as the
-- same decision alone would have. An error entry carries the error's text
-- without the "script: ..." suffix Redis adds to a whole call's error.

local m, r = tonumber(ARGV[1]), tonumber(ARGV[2])
if not m or not r then
  return redis.error_reply('rategate: decide_many wants m and r first')
end
local shapes = {}
for i = 1, r do
  local b = 3 + 5 * (i - 1)
  shapes[i] = {tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), ARGV[b + 4] == '1'}
end
-- where each decision's keys and arguments start, checked against #KEYS
-- and #ARGV before the first decision runs
local ks, as = {}, {}
local k, a = 1, 3 + 5 * r
for j = 1, m do
  local n = tonumber(ARGV[a])
  if not n or n < 1 then
    return redis.error_reply('rategate: decide_many decision ' .. j .. ' has no check count')
  end
  ks[j], as[j] = k, a
  k, a = k + n, a + 2 + 2 * n
end
if k - 1 ~= #KEYS or a - 1 ~= #ARGV then
  return redis.error_reply('rategate: decide_many keys or arguments do not match its decisions')
end
local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- decide_one is decision j, from its offsets.
local function decide_one(k, a)
  local n = tonumber(ARGV[a])
  local now = tonumber(ARGV[a + 1])
  if now == 0 then now = clock end
  if n == 1 then
    local s = shapes[tonumber(ARGV[a + 2])]
    return rg_one(KEYS[k], now, s[1], s[2], s[3], s[4], tonumber(ARGV[a + 3]), s[5])
  end
  return rg_all(KEYS, ARGV, k, a + 2, n, now, shapes)
end

local out = {}
for j = 1, m do
  local ok, res = pcall(decide_one, ks[j], as[j])
  if not ok then
    if type(res) == 'table' and res.err then
      res = redis.error_reply(res.err)
    else
      res = redis.error_reply(tostring(res))
    end
  end
  out[j] = res
end
return out
