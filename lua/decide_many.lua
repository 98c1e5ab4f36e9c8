-- decide_many.lua — several requests' decisions in one call.
--
-- Redis spends most of a decision's time around the algorithm, not in it:
-- reading the command, finding the function, building KEYS and ARGV, one
-- TIME, each redis.call, turning the reply into RESP. When rategate has
-- several decisions queued for one server (single Redis or a Sentinel
-- primary: keys of any slot), it sends them as one FCALL of this function,
-- and pays what it can once. Only the function library holds it as a
-- function (lua.go makes the part below this file's "@driver" line the
-- function rg_decide_many, next to rg_decide, decide.lua's driver);
-- lua.DecideManyScript is the same code as a script, for servers that do
-- not run functions.
--
-- KEYS     every decision's keys, one decision after another
-- ARGV[1]  m, the number of decisions
-- ARGV[2]  r, the number of check shapes: the distinct rule numbers and
--          costs the batch's checks use (a batch's decisions mostly share a
--          few rules, and a cost of 1)
-- ARGV[3]  c, the number of combinations: the distinct lists of shapes the
--          decisions check (mostly one per set of rules a request meets)
-- then per shape (6 values): algorithm code, limit, period_us, burst,
--          shadow 0|1, cost
-- then per combination: n, its number of checks, then n shape numbers
-- then per decision one value x, its combination and how it is decided:
--          x > 0    on the Redis clock (TIME): combination x % 65536, and
--                   floor(x / 65536) a bit mask of its checks whose key
--                   the call holds (bit i-1 for check i: a key that more
--                   than one decision of the call names; see records.lua)
--          x < 0    combination -x at its own instant: the next value is
--                   its now (µs; 0: the Redis clock); it holds no key
--          A decision's keys are its combination's, in order.
-- Reply    one flat array: the call's instant (µs, from TIME), then
--          decision after decision, for each of its checks: remaining,
--          reset_us when it allowed; -remaining - 1, reset_us, retry_us
--          when it denied (retry_us -1: the cost can never fit); or a
--          single error reply when the decision failed (a WRONGTYPE key,
--          say): the others are decided all the same. A decision was
--          admitted when every check that is not a shadow allowed; it was
--          decided at the call's instant or at its own. (Flat because Redis
--          turns a table per decision into its reply at a cost of its own;
--          and each value left out is one Redis writes and rategate reads
--          less: an allowed check's retry is always 0.)
--
-- Each decision is decide.lua's run on its own keys, in order, all inside
-- one atomic call: the same answers as m calls sent back to back at one
-- instant. TIME is read once, before any decision, and decisions that use
-- the Redis clock share it (nothing else runs between them). The layout is
-- checked before anything is decided, so a malformed call fails whole,
-- having written nothing, and a failing decision fails alone. A decision
-- that fails (a key of another type, a record of another length) may keep
-- some of what the checks before its error admitted: a check written at
-- once (rg_chain) stays written, one handed back or held does not, so
-- the same decision alone, in a batch that holds its key, or while
-- rg_careful counts down may leave one count between its admissions and
-- none. It never leaves more than its admissions, and the caller answers
-- it as failed. An error entry carries the error's text without the
-- "script: ..." suffix Redis adds to a whole call's error.
--
-- Held keys (records.lua) are read once per call and written once, when
-- it ends, with what the last decision left; a call with a decision at its
-- own instant holds none. A key is decided by one algorithm (rategate's
-- keys end with their algorithm's suffix, limits/algorithm.go): a held
-- record, decoded, and its shortcut are taken for that algorithm's. (A decision's other keys are read one GET each:
-- MGET of a decision's keys measured no cheaper, key for key.) A write
-- that fails then fails the whole call: every decision of it gets the
-- error, as for a lost connection (an outcome the caller treats as
-- unknown).

-- The helpers stand above the "@driver" line: lua.go puts them at the
-- library's top level, defined once at FUNCTION LOAD, not as closures of
-- every call (each closure and each growing table of a call is an
-- allocation Redis pays on every batch).

-- dm_whole reports a count: a whole number, at least lo (a fraction would
-- make the layout check and the decisions' walk disagree).
local function dm_whole(x, lo)
  return x and x >= lo and x == math.floor(x)
end

-- dm_one decides a decision of one check, shape s, on key: allowed,
-- remaining, reset, retry; io (the call's held records) when the call
-- holds the key, loaded on first use.
local function dm_one(key, now, s, io)
  if io then
    local r = io[key]
    if r == nil then
      io[key] = redis.call('GET', key)
    elseif r then
      -- the record's shortcut, if any (records.lua)
      local rem, reset = rg_take(key, r, s[2], s[3], s[6])
      if rem then return 1, rem, reset, 0 end
    end
  end
  return s[7](key, now, s[2], s[3], s[4], s[6], true, io)
end

-- dm_decode reads a decision's value x (see the header) against the
-- combinations: {cb, n, held, own} with cb its combination, n its number of
-- checks, held the checks whose key the call holds (nil: none), own true
-- when its instant follows; nil when x names no combination (the keys the
-- decision takes are then unknown: the call fails whole).
local function dm_decode(x, combos)
  local v = tonumber(x)
  if not dm_whole(v, -65535) or v == 0 then return nil end
  if v < 0 then
    local cb = combos[-v]
    if not cb then return nil end
    return {cb, cb.n, nil, true}
  end
  local cb = combos[v % 65536]
  if not cb then return nil end
  local d = {cb, cb.n, nil, false}
  local mask = math.floor(v / 65536)
  if mask > 0 and not cb.bad then
    local held = {}
    for i = 1, cb.n do
      -- sliding_log keeps a sorted set: never held
      held[i] = mask % 2 == 1 and cb[i][1] ~= 2
      mask = math.floor(mask / 2)
    end
    d[3] = held
  end
  return d
end

-- dm_flush writes the held records the call changed (records.lua).
local function dm_flush(io)
  for key in pairs(rg_written) do
    local v, ms = io[key], rg_expiry[key]
    if type(v) == 'table' then v = struct.pack(rg_formats[#v], unpack(v)) end
    if not v then
      redis.call('DEL', key)
    elseif ms then
      redis.call('SET', key, v, 'PX', ms)
    elseif ms == false then
      redis.call('SET', key, v)
    else
      -- a record there is, of its algorithm's length (every write of
      -- this call kept its expiry): rewritten in place
      redis.call('SETRANGE', key, '0', v)
    end
  end
end

-- @driver: the function's body.
local m, r, c = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not dm_whole(m, 0) or not dm_whole(r, 0) or not dm_whole(c, 0) then
  return redis.error_reply('rategate: decide_many wants m, r and c first')
end
-- shapes[i] is {code, limit, period, burst, shadow, cost, the algorithm's
-- function, its put}; combos[i] the list of its shapes, n their number,
-- bad the error of a decision of it when one names no shape, or a shape
-- whose code names no algorithm.
local shapes, combos = {}, {}
local a = 4
for i = 1, r do
  local s = {tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), ARGV[a + 4] == '1',
    tonumber(ARGV[a + 5])}
  if not (s[1] and s[2] and s[3] and s[4] and s[6]) then
    return redis.error_reply('rategate: decide_many shape ' .. i .. ' has a value that is not a number')
  end
  s[7], s[8] = rg_algorithms[s[1]], rg_puts[s[1]]
  shapes[i] = s
  a = a + 6
end
for i = 1, c do
  local n = tonumber(ARGV[a])
  if not dm_whole(n, 1) then
    return redis.error_reply('rategate: decide_many combination ' .. i .. ' has no check count')
  end
  local cb = {n = n}
  for j = 1, n do
    local s = shapes[tonumber(ARGV[a + j])]
    if not s then
      cb.bad = redis.error_reply('rategate: decide_many check ' .. j .. ' has no shape')
    elseif not s[7] and not cb.bad then
      -- checked before any decision of it runs: a check before this one
      -- may write at once (rg_chain), and this one could not decide
      cb.bad = redis.error_reply('rategate: unknown algorithm code ' .. tostring(s[1]))
    end
    cb[j] = s
  end
  combos[i] = cb
  a = a + 1 + n
end
-- The layout, checked against #KEYS and #ARGV before the first decision
-- runs, each decision's value decoded once per distinct value (a batch's
-- decisions mostly share a few: decs). total bounds the reply's length.
local decs, held = {}, false
local k, total, first = 1, 1, a
for j = 1, m do
  local x = ARGV[a]
  local d = decs[x]
  if not d then
    d = dm_decode(x, combos)
    if not d then
      return redis.error_reply('rategate: decide_many decision ' .. j .. ' names no combination')
    end
    decs[x] = d
  end
  if d[4] then
    a = a + 2
  else
    a = a + 1
    if d[3] then held = true end
  end
  k = k + d[2]
  total = total + 3 * d[2]
end
if k - 1 ~= #KEYS or a - 1 ~= #ARGV then
  return redis.error_reply('rategate: decide_many keys or arguments do not match its decisions')
end
local io = nil
rg_quick = nil
if held then
  for _, d in pairs(decs) do
    if d[4] then held = false end
  end
  if held then io, rg_written, rg_expiry, rg_quick = {}, {}, {}, {} end
end
local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- out is the reply; p is where the next decision's values go, hi the
-- highest index that may hold a value once every decision ran (a failing
-- decision may leave values behind, and its error takes one value). Lua
-- 5.1 cannot size a table up front, except through a constructor ending in
-- a call of many results, which sizes it once: out starts as total values
-- (ARGV's, all overwritten or cleared below), so it is not grown seven
-- times on the way. (unpack's results must fit Lua's stack: past a few
-- thousand, out grows as it goes.)
local out, p, hi = nil, 2, 0
if total <= 4000 then
  out, hi = {clock, unpack(ARGV, 1, total - 1)}, total
else
  out = {clock}
end
k, a = 1, first
for _ = 1, m do
  local d = decs[ARGV[a]]
  local now, cb, n, dio, ok, x1, x2, x3, x4 = clock, d[1], d[2], nil, false, nil, nil, nil, nil
  if d[4] then
    now = tonumber(ARGV[a + 1])
    if now == 0 then now = clock end
    a = a + 2
  else
    a = a + 1
    if d[3] then dio = io end
  end
  if cb.bad then
    x1 = cb.bad
  elseif n == 1 then
    local hio = nil
    if dio and d[3][1] then hio = dio end
    ok, x1, x2, x3, x4 = pcall(dm_one, KEYS[k], now, cb[1], hio)
    if ok and x2 then
      if x1 == 1 then
        out[p], out[p + 1] = x2, x3
        p = p + 2
      else
        out[p], out[p + 1], out[p + 2] = -x2 - 1, x3, x4
        p = p + 3
      end
    else
      ok = false
    end
  else
    -- a decision of several checks, combination cb's (keys from KEYS[k]
    -- on), into out from p on: rg_chain answers whether it was admitted
    -- and the index after its last value, or nil and an error reply; d[3]
    -- says which of its keys dio holds (rg_chain reads each on first use)
    ok, x1, x2 = pcall(rg_chain, KEYS, k, 1, n, now, cb, out, p, true, dio, dio and d[3])
    if ok and x1 ~= nil then
      p = x2
    else
      ok = false
      if x2 then x1 = x2 end
    end
  end
  k = k + n
  if not ok then
    local e = x1
    if type(e) == 'table' and e.err then
      out[p] = redis.error_reply(e.err)
    else
      out[p] = redis.error_reply(tostring(e))
    end
    if p + 3 * n - 1 > hi then hi = p + 3 * n - 1 end
    p = p + 1
  end
end
for i = p, hi do
  out[i] = nil
end
rg_quick = nil
if io then dm_flush(io) end
return out
