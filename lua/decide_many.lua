-- decide_many.lua — several requests' decisions in one call.
--
-- Redis spends most of a decision's time around the algorithm, not in it:
-- reading the command, finding the function, building KEYS and ARGV, one
-- TIME, turning the reply into RESP. When rategate has several decisions
-- queued for one server (single Redis or a Sentinel primary: keys of any
-- slot), it sends them as one FCALL of this function, and pays that once.
-- Only the function library holds it (lua.go wraps this file as the
-- function rg_decide_many, next to rg_decide, which is decide.lua's driver;
-- a decision of one check goes straight to decide.lua's rg_one).
--
-- KEYS     every decision's keys, one decision after another
-- ARGV[1]  m, the number of decisions
-- then per decision: n, its number of checks, followed by exactly the ARGV
--          decide.lua takes for those n checks (1 + 6n values)
-- Reply    m entries, entry j decide.lua's reply for decision j, or an error
--          reply when decision j failed (a WRONGTYPE key, say): the others
--          are decided all the same.
--
-- Each decision is decide.lua run on its own keys, in order, all inside one
-- atomic call: the same answers as m calls sent back to back. Decisions
-- that use the Redis clock share one TIME, read by the first of them: they are
-- decided at one instant, as nothing else runs between them. A decision
-- that fails may have written what it wrote before its error, exactly as
-- the same decision alone would have.

local m = tonumber(ARGV[1])
local out = {}
local clock = false
local k, a = 1, 2
for j = 1, m do
  local n = tonumber(ARGV[a])
  local now = tonumber(ARGV[a + 1])
  if now == 0 then
    if not clock then
      local t = redis.call('TIME')
      clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = clock
  end
  local ok, r
  if n == 1 then
    ok, r = pcall(rg_one, KEYS[k], now, tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]),
      tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), ARGV[a + 7] == '1')
  else
    local keys, args = {}, {now}
    for i = 1, n do keys[i] = KEYS[k + i - 1] end
    for i = 2, 1 + 6 * n do args[i] = ARGV[a + i] end
    ok, r = pcall(rg_decide, keys, args)
  end
  if not ok then
    if type(r) == 'table' and r.err then
      r = redis.error_reply(r.err)
    else
      r = redis.error_reply(tostring(r))
    end
  end
  out[j] = r
  k, a = k + n, a + 2 + 6 * n
end
return out
