-- decide_many.lua — several requests' decisions in one call.
--
-- Redis spends most of a decision's time around the algorithm, not in it:
-- reading the command, finding the function, building KEYS and ARGV, one
-- TIME, turning the reply into RESP. When rategate has several decisions
-- queued for one server (single Redis or a Sentinel primary: keys of any
-- slot), it sends them as one FCALL of this function, and pays that once.
-- Only the function library holds it (lua.go makes the part below this
-- file's "@driver" line the function rg_decide_many, next to rg_decide,
-- which is decide.lua's driver; a decision goes straight to decide.lua's
-- rg_one or rg_all).
--
-- KEYS     every decision's keys, one decision after another
-- ARGV[1]  m, the number of decisions
-- ARGV[2]  r, the number of check shapes: the distinct rule numbers and
--          costs the batch's checks use (a batch's decisions mostly share a
--          few rules, and a cost of 1)
-- then per shape (6 values): algorithm code, limit, period_us, burst,
--          shadow 0|1, cost
-- then per decision, by its first value t:
--          t > 0    one check, of shape t, on the Redis clock (TIME)
--          t < 0    -t checks on the Redis clock, their -t shapes next
--          t = 0    the general form: n, its number of checks, its now (µs,
--                   or 0 for the Redis clock), then its n shapes
--          A shape is named by its number written as Lua writes it ("1",
--          "2", ...: rategate sends them so): the arguments are strings,
--          and a table keyed by the string finds the shape without the
--          tonumber that would parse each (strtod, the dearest part of
--          reading an argument).
-- Reply    one flat array: the call's instant (µs, from TIME), then
--          decision after decision, decide.lua's reply for it (2 + 4n
--          values for n checks) or, for a decision of the form t > 0, its
--          check's four values alone (allowed, remaining, reset_us,
--          retry_us: it was decided at the call's instant, and it admitted
--          when it allowed or its shape is a shadow), or a single error
--          reply when it failed (a WRONGTYPE key, say): the others are
--          decided all the same. (Flat because Redis turns a table per
--          decision into its reply at a cost of its own, more than its
--          numbers; and each value left out of the reply is one Redis
--          writes and rategate reads less.)
--
-- Each decision is decide.lua run on its own keys, in order, all inside one
-- atomic call: the same answers as m calls sent back to back at one
-- instant. TIME is read once, before any decision, and decisions that use
-- the Redis clock share it (nothing else runs between them). The layout is
-- checked before anything is decided, and each decision's own arguments
-- are read inside its pcall (or, for a decision of one check, where
-- nothing can fail), so a malformed call fails whole, having
-- written nothing, and a failing decision fails alone. A decision that
-- fails may have written what it wrote before its error, exactly as the
-- same decision alone would have. An error entry carries the error's text
-- without the "script: ..." suffix Redis adds to a whole call's error.

-- The helpers stand above the "@driver" line: lua.go puts them at the
-- library's top level, defined once at FUNCTION LOAD, not as closures of
-- every call (each closure and each growing table of a call is an
-- allocation Redis pays on every batch).

-- dm_whole reports a count: a whole number, at least lo (a fraction would
-- make the layout check and the decisions' walk disagree).
local function dm_whole(x, lo)
  return x and x >= lo and x == math.floor(x)
end

-- dm_general is a decision of the general form (t = 0) whose values start
-- at ARGV[a] and keys at KEYS[k], written into out at p: it returns out,
-- or an error reply.
local function dm_general(KEYS, ARGV, k, a, clock, shapes, out, p)
  local n, now = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if now == 0 then now = clock end
  if n == 1 then
    local s = shapes[ARGV[a + 3]]
    if not s then
      return redis.error_reply('rategate: decide_many check 1 has no shape')
    end
    return rg_one(out, p, KEYS[k], now, s[1], s[2], s[3], s[4], s[6], s[5])
  end
  return rg_all(KEYS, ARGV, k, a + 3, n, now, shapes, out, p - 1)
end

-- @driver: the function's body.
local m, r = tonumber(ARGV[1]), tonumber(ARGV[2])
if not dm_whole(m, 0) or not dm_whole(r, 0) then
  return redis.error_reply('rategate: decide_many wants m and r first')
end
-- shapes[name] is {code, limit, period, burst, shadow, cost}; counts[x] is
-- tonumber(x) for a decision's first value that names no shape (t <= 0,
-- looked up once per call: a batch's decisions of several checks mostly
-- share one count).
local shapes, counts = {}, {}
for i = 1, r do
  local b = 3 + 6 * (i - 1)
  local s = {tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), ARGV[b + 4] == '1',
    tonumber(ARGV[b + 5])}
  if not (s[1] and s[2] and s[3] and s[4] and s[6]) then
    return redis.error_reply('rategate: decide_many shape ' .. i .. ' has a value that is not a number')
  end
  shapes[tostring(i)] = s
end
-- The layout, checked against #KEYS and #ARGV before the first decision
-- runs; the decisions below walk it again the same way (keeping where
-- each starts would cost three growing tables per call). total is the
-- reply's length once every decision answered.
local k, a, total = 1, 3 + 6 * r, 1
for j = 1, m do
  local x = ARGV[a]
  local t, n = nil, nil
  if shapes[x] then
    t, n, a, total = 1, 1, a + 1, total + 4
  else
    t = counts[x]
    if not t then
      t = tonumber(x)
      if t then counts[x] = t end
    end
    if t and t < 0 then
      n = -t
      a = a + 1 + n
    elseif t == 0 then
      n = tonumber(ARGV[a + 1])
      if n then a = a + 3 + n end
    elseif t then
      n = 1 -- a shape that does not exist: the decision fails alone
      a = a + 1
      total = total + 4
    end
  end
  if not dm_whole(n, 1) then
    return redis.error_reply('rategate: decide_many decision ' .. j .. ' has no check count')
  end
  if t <= 0 then total = total + 2 + 4 * n end
  k = k + n
end
if k - 1 ~= #KEYS or a - 1 ~= #ARGV then
  return redis.error_reply('rategate: decide_many keys or arguments do not match its decisions')
end
local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- out is the reply; p is where the next decision's values go, hi the
-- highest index that may hold a value once every decision ran (a failing
-- decision may leave values behind, and its error takes one value). Lua 5.1 cannot size a table up front, except through a
-- constructor ending in a call of many results, which sizes it once: out
-- starts as total values (ARGV's, all overwritten or cleared below), so it
-- is not grown seven times on the way. (unpack's results must fit Lua's
-- stack: past a few thousand, out grows as it goes.)
local out, p, hi = nil, 2, 0
if total <= 4000 then
  out, hi = {clock, unpack(ARGV, 1, total - 1)}, total
else
  out = {clock}
end
k, a = 1, 3 + 6 * r
for j = 1, m do
  local x = ARGV[a]
  local s, n, size, ok, res = shapes[x], 1, 4, true, nil
  if s then
    ok, res = pcall(rg_one, out, p, KEYS[k], clock, s[1], s[2], s[3], s[4], s[6], s[5], true)
    a = a + 1
  else
    local t = counts[x]
    if t > 0 then
      res = redis.error_reply('rategate: decide_many check 1 has no shape')
      a = a + 1
    elseif t < 0 then
      n = -t
      size = 2 + 4 * n
      ok, res = pcall(rg_all, KEYS, ARGV, k, a + 1, n, clock, shapes, out, p - 1)
      a = a + 1 + n
    else
      n = tonumber(ARGV[a + 1])
      size = 2 + 4 * n
      ok, res = pcall(dm_general, KEYS, ARGV, k, a, clock, shapes, out, p)
      a = a + 3 + n
    end
  end
  k = k + n
  if ok and res == out then
    p = p + size
  else
    if type(res) == 'table' and res.err then
      out[p] = redis.error_reply(res.err)
    else
      out[p] = redis.error_reply(tostring(res))
    end
    if p + size - 1 > hi then hi = p + size - 1 end
    p = p + 1
  end
end
for i = p, hi do
  out[i] = nil
end
return out
