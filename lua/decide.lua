-- decide.lua — every rule that matched one request, decided all-or-nothing.
--
-- lua.go builds this script from records.lua, the algorithm functions (the
-- part of each lua/<algo>.lua above its "@standalone" line), the tables it
-- writes from the algorithm table (rg_algorithms and rg_puts: each
-- algorithm's function and its put by code; rg_check calls one by code)
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
-- solo argument). Several: each algorithm but the last decides without
-- writing what an admission writes and hands that back as plain values, and
-- its put writes them once every check is decided, only when no non-shadow
-- check denied: a denied request consumes nothing. The last check is decided
-- when the others' verdicts are known: it writes itself when they allowed.
-- (An algorithm may rewrite a record written under another limit or period
-- while it decides; that changes no count. See each lua/<algo>.lua.)

-- rg_one decides a request of one check (shadow: the check only reports)
-- and returns decide.lua's reply for it, or an error reply.
local function rg_one(key, now, code, limit, period, burst, cost, shadow)
  -- solo: the algorithm writes its admission itself
  local a, rem, reset, retry = rg_check(code, key, now, limit, period, burst, cost, true)
  if not a then
    return redis.error_reply('rategate: unknown algorithm code ' .. tostring(code))
  end
  local admitted = a
  if shadow then admitted = 1 end
  return {admitted, now, a, rem, reset, retry}
end

-- rg_chain decides checks i to n of a request and writes their replies into
-- reply from index o on, check i's first. The request's keys are KEYS[k0 ..
-- k0+n-1]; its checks are src[i], a shape {code, limit, period, burst,
-- shadow, cost, algorithm, put} (decide_many.lua's), or, when a0 is given,
-- six numbers each in src (ARGV) from src[a0] on, as this file's header
-- says. held[i] says that check i's key is held in io (records.lua). before
-- says whether every non-shadow check before i allowed. A check's reply is
-- its four values, or, compact (decide_many.lua), two when it allowed
-- (remaining, reset) and three when it denied (-remaining - 1, reset,
-- retry).
--
-- It returns whether the request is admitted (every non-shadow check
-- allowed) and the index after the last value written, or nil and an error
-- reply. The request is all-or-nothing: check i is decided, then the checks
-- after it, and only then, once the whole request's verdict is known, check
-- i writes what it counted, or, in a denied request, reports its quota as
-- it stands (what a zero-cost look reports: as the algorithm handed it back,
-- or asked again; an algorithm may hand back none). So every check reads
-- before any writes, and nothing waits in a table: what check i writes
-- stays in this call's locals while the rest are decided. (The checks of
-- one request have distinct keys, so the order of the writes does not
-- matter.)
local function rg_chain(KEYS, k0, i, n, now, src, a0, reply, o, before, io, held, compact)
  -- s, a shape: its code, shadow and put are read only when needed (a
  -- table read costs Redis about as much as ten plain Lua operations)
  local code, limit, period, burst, cost, shadow, algo, put, s
  if a0 then
    local b = a0 + 6 * (i - 1)
    code, limit, period, burst = tonumber(src[b]), tonumber(src[b + 1]), tonumber(src[b + 2]), tonumber(src[b + 3])
    cost, shadow = tonumber(src[b + 4]), src[b + 5] == '1'
    if code then algo, put = rg_algorithms[code], rg_puts[code] end
    if not algo then code = src[b] end
  else
    s = src[i]
    limit, period, burst, cost, algo = s[2], s[3], s[4], s[6], s[7]
    if not algo then code = s[1] end
  end
  if not algo then
    return nil, redis.error_reply('rategate: unknown algorithm code ' .. tostring(code))
  end
  local key = KEYS[k0 + i - 1]
  local hio = nil
  if held and held[i] then
    -- read into io when the call first needs it, here, after the checks
    -- before it ran (as the decision alone would: a check before may
    -- rewrite its record, and this read may fail)
    hio = io
    if io[key] == nil then io[key] = redis.call('GET', key) end
  end
  -- The last check, every non-shadow check before it allowed: its verdict
  -- is the request's (or, a shadow, changes nothing), so it writes its
  -- admission at once, as a request of one check does, and hands nothing back.
  local a, rem, reset, retry, w1, w2, w3, w4, lrem, lreset = algo(key, now, limit, period, burst, cost, before and i == n, hio)
  local ok = before
  if a ~= 1 then
    if s then shadow = s[5] end
    ok = before and shadow
  end
  local w = 4
  if compact then
    if a == 1 then w = 2 else w = 3 end
  end
  local stop = o + w
  if i < n then
    local rest, after = rg_chain(KEYS, k0, i + 1, n, now, src, a0, reply, stop, ok, io, held, compact)
    if rest == nil then return nil, after end
    ok, stop = rest, after
  end
  if a == 1 and w1 then
    -- a check that allowed stays allowed (its place in a compact reply was
    -- taken for two values): in a denied request it reports its quota as
    -- a zero-cost look would
    if ok then
      if s then put = s[8] end
      put(key, now, limit, period, burst, w1, w2, w3, w4, hio)
    elseif lrem then
      rem, reset = lrem, lreset
    else
      local _
      _, rem, reset = algo(key, now, limit, period, burst, 0, false, hio)
    end
  end
  if not compact then
    reply[o], reply[o + 1], reply[o + 2], reply[o + 3] = a, rem, reset, retry
  elseif a == 1 then
    reply[o], reply[o + 1] = rem, reset
  else
    reply[o], reply[o + 1], reply[o + 2] = -rem - 1, reset, retry
  end
  return ok, stop
end

-- rg_all decides a request of n checks all-or-nothing and returns decide.lua's
-- reply for it, or an error reply: its keys are KEYS[1 .. n], its numbers
-- from ARGV[2] on.
local function rg_all(KEYS, ARGV, n, now)
  local reply = {1, now}
  local ok, err = rg_chain(KEYS, 1, 1, n, now, ARGV, 2, reply, 3, true)
  if ok == nil then return err end
  if not ok then reply[1] = 0 end
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
  return rg_one(KEYS[1], now, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]),
    tonumber(ARGV[6]), ARGV[7] == '1')
end

return rg_all(KEYS, ARGV, n, now)
