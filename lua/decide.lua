-- decide.lua — every rule that matched one request, decided all-or-nothing.
--
-- lua.go builds this script from the algorithm functions (the part of each
-- lua/<algo>.lua above its "@standalone" line), two dispatch functions it
-- writes from the algorithm table, rg_check and rg_put, and this file, so one
-- EVALSHA (or one FCALL of the function library) decides a whole request.
--
-- KEYS[i]  the key of check i (all in one hash slot on Redis Cluster)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME
-- ARGV[2+6(i-1) ...]  per check: algorithm code, limit, period_us, burst, cost, shadow 0|1
--          codes: 1 fixed_window, 2 sliding_log, 3 sliding_window, 4 gcra, 5 token_bucket
-- Reply    {admitted 0|1, now_us, then per check: allowed, remaining, reset_us, retry_us}
--
-- A request of one check: the algorithm writes its admission itself (its
-- solo argument). Several: each algorithm decides without writing what an
-- admission writes and hands that back as plain values, and rg_put writes
-- them once every check is decided, only when no non-shadow check denied:
-- a denied request consumes nothing. (An algorithm may rewrite a record
-- written under another limit or period while it decides; that changes no
-- count. See each lua/<algo>.lua.)

-- rg_one decides a request of one check (shadow: the check only reports),
-- for this driver and decide_many.lua's: it writes the reply's six values
-- (admitted, now, allowed, remaining, reset_us, retry_us) into out from
-- index p on, once decided, and returns out, or an error reply having
-- written nothing. bare leaves out the first two (decide_many.lua's reply
-- carries its instant once, and the caller knows admitted from allowed and
-- shadow). (decide_many.lua answers a whole batch as one flat array: a
-- table per decision costs Redis more to turn into its reply than the
-- numbers in it.)
local function rg_one(out, p, key, now, code, limit, period, burst, cost, shadow, bare)
  -- solo: the algorithm writes its admission itself
  local a, rem, reset, retry = rg_check(code, key, now, limit, period, burst, cost, true)
  if not a then
    return redis.error_reply('rategate: unknown algorithm code ' .. tostring(code))
  end
  local admitted = a
  if shadow then admitted = 1 end
  if bare then
    out[p], out[p + 1], out[p + 2], out[p + 3] = a, rem, reset, retry
  else
    out[p], out[p + 1], out[p + 2], out[p + 3], out[p + 4], out[p + 5] = admitted, now, a, rem, reset, retry
  end
  return out
end

-- rg_chain decides checks i to n of a request (see rg_all) and writes their
-- replies into reply from index o on, check i's first. before says whether
-- every non-shadow check before i allowed. It returns whether the request
-- is admitted (every non-shadow check allowed), or nil and an error reply.
-- The request is all-or-nothing: check i is decided, then the checks after
-- it, and only then, once the whole request's verdict is known, check i
-- writes what it counted, or, in a denied request, reports its quota as it
-- stands (what a zero-cost look reports: as the algorithm handed it back,
-- or asked again; an algorithm may hand back none). So every check reads
-- before any writes, and nothing waits in a table: what check i writes
-- stays in this call's locals while the rest are decided. (The checks of
-- one request have distinct keys, so the order of the writes does not
-- matter.)
local function rg_chain(KEYS, ARGV, k0, a0, i, n, now, shapes, reply, o, before)
  local code, limit, period, burst, cost, shadow, given
  if shapes then
    local s = shapes[ARGV[a0 + i - 1]]
    code, limit, period, burst, shadow, cost = s[1], s[2], s[3], s[4], s[5], s[6]
  else
    local b = a0 + 6 * (i - 1)
    given = ARGV[b]
    code, limit, period, burst = tonumber(given), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    cost, shadow = tonumber(ARGV[b + 4]), ARGV[b + 5] == '1'
  end
  local key = KEYS[k0 + i - 1]
  local a, rem, reset, retry, w1, w2, w3, w4, lrem, lreset = rg_check(code, key, now, limit, period, burst, cost, false)
  if not a then
    return nil, redis.error_reply('rategate: unknown algorithm code ' .. tostring(given or code))
  end
  local ok = before and (a == 1 or shadow)
  if i < n then
    local err
    ok, err = rg_chain(KEYS, ARGV, k0, a0, i + 1, n, now, shapes, reply, o + 4, ok)
    if ok == nil then return nil, err end
  end
  if a == 1 and w1 then
    if ok then
      rg_put(code, key, now, limit, period, burst, w1, w2, w3, w4)
    elseif lrem then
      rem, reset = lrem, lreset
    else
      a, rem, reset, retry = rg_check(code, key, now, limit, period, burst, 0, false)
    end
  end
  reply[o], reply[o + 1], reply[o + 2], reply[o + 3] = a, rem, reset, retry
  return ok
end

-- rg_all decides a request of n checks all-or-nothing, for this driver and
-- decide_many.lua's: its keys are KEYS[k0 .. k0+n-1]; its numbers start at
-- ARGV[a0], 6 per check as this file's header says, or, when shapes is given
-- (decide_many.lua's layout), 1 per check: the name of its shape in shapes
-- (a table {code, limit, period, burst, shadow, cost} under the argument as
-- it stands, "1", "2", ...). The reply (2 + 4n values) goes into reply from
-- index b + 1 on, a new table when reply is nil; rg_all returns that table,
-- or an error reply, having perhaps written some values already
-- (decide_many.lua clears them).
local function rg_all(KEYS, ARGV, k0, a0, n, now, shapes, reply, b)
  if not reply then reply, b = {}, 0 end
  if shapes then
    -- Each check's shape, looked up first: a check naming no shape fails
    -- the decision before any check ran (a check may rewrite a record it
    -- reads under a changed rule).
    for i = 1, n do
      if not shapes[ARGV[a0 + i - 1]] then
        return redis.error_reply('rategate: decide_many check ' .. i .. ' has no shape')
      end
    end
  end
  local ok, err = rg_chain(KEYS, ARGV, k0, a0, 1, n, now, shapes, reply, b + 3, true)
  if ok == nil then return err end
  if ok then reply[b + 1] = 1 else reply[b + 1] = 0 end
  reply[b + 2] = now
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
  return rg_one({}, 1, KEYS[1], now, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]),
    tonumber(ARGV[6]), ARGV[7] == '1')
end

return rg_all(KEYS, ARGV, 1, 2, n, now, nil)
