-- decide.lua — every rule that matched one request, decided all-or-nothing.
--
-- lua.go builds this script from records.lua, the algorithm functions (the
-- part of each lua/<algo>.lua above its "@standalone" line), the tables it
-- writes from the algorithm table (rg_algorithms and rg_puts: each
-- algorithm's function and its put by code)
-- and this file, so one EVALSHA (or one FCALL of the function library)
-- decides a whole request.
--
-- KEYS[i]  the key of check i (all in one hash slot on Redis Cluster)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME
-- ARGV[2+6(i-1) ...]  per check: algorithm code, limit, period_us, burst, cost, shadow 0|1
--          codes: 1 fixed_window, 2 sliding_log, 3 sliding_window, 4 gcra, 5 token_bucket
-- Reply    {admitted 0|1, now_us, then per check: allowed, remaining, reset_us, retry_us}
--
-- A request of one check: the algorithm writes its admission itself (its
-- solo argument). Several (rg_chain): a denied request consumes nothing.
-- A check whose admission only adds to a count writes it at once and
-- takes it off again if a later check denies; any other admission is
-- handed back as plain values and written by its put once every check is
-- decided, only when no non-shadow check denied. The last check is
-- decided when the others' verdicts are known: it writes itself when they
-- allowed. (An algorithm may rewrite a record written under another limit
-- or period while it decides; that changes no count. See each
-- lua/<algo>.lua.)

-- rg_shapes holds the shapes (decide_many.lua's: {code, limit, period,
-- burst, shadow, cost, algorithm, put}) parsed from decide calls'
-- arguments, by their text (the six joined by '|', which no number
-- holds: the text of six arguments that are numbers, or '0' and '1' for
-- the shadow flag, is theirs alone. A space would not do: tonumber takes
-- " 1", so cost "1" then shadow " 1" and cost "1 " then shadow "1"
-- joined by spaces are one text for two shapes),
-- rg_nshapes of them. A call's six numbers per check are mostly a few
-- rules' over and over, and tonumber costs Redis about 800 instructions
-- each (C's strtod): callgrind, one FCALL of decide per request, one
-- sliding_window rule 65,000 instructions per decision, three 158,000, of
-- which strtod 15,000. In the library the table lives as long as the
-- library (emptied at 4096 shapes); a script's lasts one call.
local rg_shapes, rg_nshapes = {}, 0

-- rg_shape returns the shape of the check whose six numbers start at
-- ARGV[b] (this file's header), or nil when its code names no algorithm.
local function rg_shape(ARGV, b)
  local text = ARGV[b] .. '|' .. ARGV[b + 1] .. '|' .. ARGV[b + 2] .. '|' .. ARGV[b + 3] .. '|' .. ARGV[b + 4] ..
    '|' .. ARGV[b + 5]
  local s = rg_shapes[text]
  if s then return s end
  local code = tonumber(ARGV[b])
  local algo = code and rg_algorithms[code]
  if not algo then return nil end
  s = {code, tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), ARGV[b + 5] == '1',
    tonumber(ARGV[b + 4]), algo, rg_puts[code]}
  if rg_nshapes >= 4096 then rg_shapes, rg_nshapes = {}, 0 end
  rg_shapes[text], rg_nshapes = s, rg_nshapes + 1
  return s
end

-- rg_one decides a request of one check, shape s (a shadow only reports),
-- and returns decide.lua's reply for it.
local function rg_one(key, now, s)
  -- solo: the algorithm writes its admission itself
  local a, rem, reset, retry = s[7](key, now, s[2], s[3], s[4], s[6], true)
  local admitted = a
  if s[5] then admitted = 1 end
  return {admitted, now, a, rem, reset, retry}
end

-- rg_maxbit: rg_chain marks at most 41 checks of a request written at
-- once (a bit each in one number, whole below 2^53); the rest hand back.
local rg_maxbit = 2 ^ 40

-- rg_careful counts down the requests that hand every write back after one
-- had its writes taken off again (rg_unwrite): a write and its undoing
-- cost Redis more than the handing back they save, so while later rules
-- deny (an API's limit under a flood) the chain stops writing at once.
-- It spans the calls of the function library (its top level lives as long
-- as the library) and changes what a decision costs, never what it
-- answers or leaves (but for a decision that fails: decide_many.lua's
-- header). The scripts (EVALSHA) never write at once: lua.go
-- starts their rg_careful at math.huge. A script starts afresh on every
-- call, so it could not learn from an undoing, and Redis refuses a
-- script's first write when it is out of memory, which a denied request
-- (writing nothing) must not meet.
local rg_careful = 0

-- rg_unwrite gives back, in a request that is denied, what checks i on
-- wrote at once (bit j - i of wrote: check j, shape shapes[j], key
-- KEYS[k0 + j - 1]), and puts in each one's reply its quota as a
-- zero-cost look then reports it. Such a write (solo "count") only added
-- the check's cost to the second number of its record, at byte 8, and
-- kept the expiry: taking the cost off again leaves the record byte for
-- byte as it was. The look reads the record from the table it was just
-- decoded into (the io of records.lua; a look writes nothing). Their
-- replies start at reply[p], as rg_chain laid them out.
local function rg_unwrite(KEYS, k0, i, now, shapes, reply, p, wrote)
  local j = i
  while wrote > 0 do
    local w = 3
    if reply[p] >= 0 then w = 2 end
    if wrote % 2 == 1 then
      local s, key = shapes[j], KEYS[k0 + j - 1]
      local v = redis.call('GET', key)
      local r = {struct.unpack(rg_formats[#v / 8], v)}
      r[#r] = nil -- unpack's last value: the position after the record
      r[2] = r[2] - s[6]
      redis.call('SETRANGE', key, '8', struct.pack('<d', r[2]))
      local _
      _, reply[p], reply[p + 1] = s[7](key, now, s[2], s[3], s[4], 0, false, {[key] = r})
    end
    wrote = (wrote - wrote % 2) / 2
    p, j = p + w, j + 1
  end
  rg_careful = 32
end

-- rg_chain decides checks i to n of a request and writes their replies into
-- reply from index o on, check i's first. The request's keys are KEYS[k0 ..
-- k0+n-1]; check j is shapes[j], {code, limit, period, burst, shadow, cost,
-- algorithm, put} (decide_many.lua's shapes; rg_all makes them from
-- ARGV), each with its algorithm (the callers refuse a request with an
-- unknown code before any check runs: a check may write at once). held[j]
-- says that check j's key is held in io (records.lua). before says whether
-- every non-shadow check before i allowed. A check's reply is two values
-- when it allowed (remaining, reset) and three when it denied (-remaining -
-- 1, reset, retry): decide_many.lua's layout, which rg_all spreads into
-- decide.lua's.
--
-- It returns whether the request is admitted (every non-shadow check
-- allowed) and the index after the last value written, or nil and an error
-- reply. The request is all-or-nothing: what a check counts is written
-- only if every non-shadow check allows, and a check of a denied request
-- reports its quota as it stands (what a zero-cost look reports: as the
-- algorithm handed it back, or asked again; an algorithm may hand back
-- none). Three ways, by how the check writes:
--   - the last check, every non-shadow check before it allowed: its
--     verdict is the request's (or, a shadow, changes nothing), so it
--     writes its admission at once, as a request of one check does;
--   - a check before it, while every check so far allowed, whose
--     admission only adds to a count, on a key the call does not hold
--     (fixed_window and sliding_window in the common case: the "count"
--     mode of their solo argument): it writes at once too, and if a later
--     check denies, rg_unwrite takes the cost off again. The common
--     request, every check allowing, so runs as a loop of one-check
--     decisions;
--   - any other admission is handed back as plain values, and this call
--     decides the checks after it by calling itself, then writes it (its
--     put) or, the request denied, reports the look. It stays in this
--     call's locals meanwhile: nothing waits in a table.
-- (The checks of one request have distinct keys, so the order of the
-- writes does not matter.) A check that fails (a key of another type)
-- fails the request, which may leave the admissions written before it
-- counted: the strict side. The loop reads a shape's fields only where
-- it needs them: each Lua operation, a table read among them, costs Redis
-- some 40 instructions.
local function rg_chain(KEYS, k0, i, n, now, shapes, reply, o, before, io, held)
  local ok, first, wrote, bit = before, o, 0, 1
  if rg_careful > 0 and i == 1 then rg_careful = rg_careful - 1 end
  for j = i, n do
    local s = shapes[j]
    local algo, key, hio = s[7], KEYS[k0 + j - 1], nil
    local took = false
    if held and held[j] then
      -- read into io when the call first needs it, here, after the checks
      -- before it ran (as the decision alone would: a check before may
      -- rewrite its record, and this read may fail)
      hio = io
      local r = io[key]
      if r == nil then
        io[key] = redis.call('GET', key)
      elseif ok and j == n and r then
        -- the last check, written at once: its record's shortcut, if any,
        -- admits it (records.lua)
        local rem, reset = rg_take(key, r, s[2], s[3], s[6])
        if rem then
          reply[o], reply[o + 1] = rem, reset
          o = o + 2
          took = true
        end
      end
    end
    if not took then
      -- true: write at once; "count": at once if only a count changes
      local mode = ok and (j == n or (not hio and rg_careful == 0 and bit <= rg_maxbit and 'count'))
      local a, rem, reset, retry, w1, w2, w3, w4, lrem, lreset = algo(key, now, s[2], s[3], s[4], s[6], mode, hio)
      if a ~= 1 then
        reply[o], reply[o + 1], reply[o + 2] = -rem - 1, reset, retry
        o = o + 3
        if not s[5] then ok = false end
      elseif not w1 then
        reply[o], reply[o + 1] = rem, reset
        o = o + 2
        if mode == 'count' and s[6] > 0 then wrote = wrote + bit end
      else
        -- handed back: while every check so far allowed, the checks after it
        -- decide (this call, calling itself) whether it is written
        local at, rec = o, ok
        o = o + 2
        if ok then
          local rest, after = rg_chain(KEYS, k0, j + 1, n, now, shapes, reply, o, true, io, held)
          if rest == nil then return nil, after end
          ok, o = rest, after
          if ok then s[8](key, now, s[2], s[3], s[4], w1, w2, w3, w4, hio) end
        end
        -- a check that allowed stays allowed (its place in the reply was
        -- taken for two values): in a denied request it reports its quota
        -- as a zero-cost look would
        if not ok then
          if lrem then
            rem, reset = lrem, lreset
          else
            local _
            _, rem, reset = algo(key, now, s[2], s[3], s[4], 0, false, hio)
          end
        end
        reply[at], reply[at + 1] = rem, reset
        if rec then break end
      end
    end
    bit = bit * 2
  end
  if not ok and wrote > 0 then rg_unwrite(KEYS, k0, i, now, shapes, reply, first, wrote) end
  return ok, o
end

-- rg_all decides a request of n checks all-or-nothing and returns decide.lua's
-- reply for it, or an error reply: its keys are KEYS[1 .. n], its numbers
-- from ARGV[2] on, made into rg_chain's shapes (a code that names no
-- algorithm fails the request before any check runs).
local function rg_all(KEYS, ARGV, n, now)
  local shapes = {}
  for i = 1, n do
    local b = 2 + 6 * (i - 1)
    shapes[i] = rg_shape(ARGV, b)
    if not shapes[i] then
      return redis.error_reply('rategate: unknown algorithm code ' .. tostring(ARGV[b]))
    end
  end
  local out = {}
  local ok, err = rg_chain(KEYS, 1, 1, n, now, shapes, out, 1, true)
  if ok == nil then return err end
  local reply, p = {1, now}, 1
  if not ok then reply[1] = 0 end
  for i = 1, n do
    local o, v = 3 + 4 * (i - 1), out[p]
    if v >= 0 then
      reply[o], reply[o + 1], reply[o + 2], reply[o + 3] = 1, v, out[p + 1], 0
      p = p + 2
    else
      reply[o], reply[o + 1], reply[o + 2], reply[o + 3] = 0, -v - 1, out[p + 1], out[p + 2]
      p = p + 3
    end
  end
  return reply
end

-- @driver: lua.go puts everything above this line at the top level of the
-- script and of the function library, and the rest in the script's body and
-- the library's decide function.
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local n = #KEYS
if n == 1 then
  local s = rg_shape(ARGV, 2)
  if not s then return redis.error_reply('rategate: unknown algorithm code ' .. tostring(ARGV[2])) end
  return rg_one(KEYS[1], now, s)
end

return rg_all(KEYS, ARGV, n, now)
