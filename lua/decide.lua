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
-- Each algorithm decides without writing what an admission writes and hands
-- that back as plain values; rg_put writes them. One check is written at
-- once if it allows. Several are all decided first and written only when no
-- non-shadow check denied: a denied request consumes nothing. (An algorithm
-- may rewrite a record written under another limit or period while it
-- decides; that changes no count. See each lua/<algo>.lua.)

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
  local a, rem, reset, retry, w1, w2, w3, w4 = rg_check(code, key, now, limit, period, burst, cost, true)
  if not a then
    return redis.error_reply('rategate: unknown algorithm code ' .. tostring(code))
  end
  local admitted = a
  if a == 1 then
    if w1 then rg_put(code, key, now, limit, period, burst, w1, w2, w3, w4) end
  elseif shadow then
    admitted = 1
  end
  if bare then
    out[p], out[p + 1], out[p + 2], out[p + 3] = a, rem, reset, retry
  else
    out[p], out[p + 1], out[p + 2], out[p + 3], out[p + 4], out[p + 5] = admitted, now, a, rem, reset, retry
  end
  return out
end

-- rg_all decides a request of n checks all-or-nothing, for this driver and
-- decide_many.lua's: its keys are KEYS[k0 .. k0+n-1]; its numbers start at
-- ARGV[a0], 6 per check as this file's header says, or, when shapes is given
-- (decide_many.lua's layout), 1 per check: the index of its shape in shapes
-- ({code, limit, period, burst, shadow, cost}). The numbers are read where
-- they stand, not copied into tables of this file's layout first. The
-- reply (2 + 4n values) goes into reply from index b + 1 on, a new table
-- when reply is nil; rg_all returns that table, or an error reply, having
-- perhaps written some values already (decide_many.lua clears them).
local function rg_all(KEYS, ARGV, k0, a0, n, now, shapes, reply, b)
  if not reply then reply, b = {}, 0 end
  reply[b + 1], reply[b + 2] = 1, now
  -- pending writes, 10 values per allowed check: code, limit, period, burst,
  -- the four the algorithm hands back for its put, and the remaining and
  -- reset a zero-cost look would report, when it hands them back (sized for
  -- two checks, grown beyond)
  local pend = {false, false, false, false, false, false, false, false, false, false,
    false, false, false, false, false, false, false, false, false, false}
  if shapes then
    -- Each check's shape, read first: a check naming no shape fails the
    -- decision before any check ran (a check may rewrite a record it reads
    -- under a changed rule).
    for i = 1, n do
      local s = shapes[tonumber(ARGV[a0 + i - 1])]
      if not s then
        return redis.error_reply('rategate: decide_many check ' .. i .. ' has no shape')
      end
      pend[(i - 1) * 10 + 1] = s
    end
  end
  for i = 1, n do
    local q = (i - 1) * 10
    local code, limit, period, burst, cost, shadow, given
    if shapes then
      local s = pend[q + 1]
      code, limit, period, burst, shadow, cost = s[1], s[2], s[3], s[4], s[5], s[6]
      pend[q + 1] = false
    else
      local b = a0 + 6 * (i - 1)
      given = ARGV[b]
      code, limit, period, burst = tonumber(given), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
      cost, shadow = tonumber(ARGV[b + 4]), ARGV[b + 5] == '1'
    end
    local a, rem, reset, retry, w1, w2, w3, w4, lrem, lreset = rg_check(code, KEYS[k0 + i - 1], now, limit, period,
      burst, cost, false)
    if not a then
      return redis.error_reply('rategate: unknown algorithm code ' .. tostring(given or code))
    end
    if a == 0 and not shadow then reply[b + 1] = 0 end
    local o = b + 3 + (i - 1) * 4
    reply[o], reply[o + 1], reply[o + 2], reply[o + 3] = a, rem, reset, retry
    if a == 1 and w1 then
      pend[q + 1], pend[q + 2], pend[q + 3], pend[q + 4], pend[q + 5] = code, limit, period, burst, w1
      pend[q + 6], pend[q + 7], pend[q + 8], pend[q + 9], pend[q + 10] = w2, w3, w4, lrem, lreset
    end
  end

  if reply[b + 1] == 1 then
    for i = 1, n do
      local q = (i - 1) * 10
      if pend[q + 1] then
        rg_put(pend[q + 1], KEYS[k0 + i - 1], now, pend[q + 2], pend[q + 3], pend[q + 4],
          pend[q + 5], pend[q + 6], pend[q + 7], pend[q + 8])
      end
    end
    return reply
  end

  -- Denied: nothing is written; rules that would have taken something
  -- report their quota as it stands, what a zero-cost look reports: as the
  -- algorithm handed it back, or asked again (an algorithm may hand back
  -- none).
  for i = 1, n do
    local q = (i - 1) * 10
    if pend[q + 1] then
      local o = b + 3 + (i - 1) * 4
      if pend[q + 9] then
        reply[o + 1], reply[o + 2] = pend[q + 9], pend[q + 10]
      else
        reply[o], reply[o + 1], reply[o + 2], reply[o + 3] = rg_check(pend[q + 1], KEYS[k0 + i - 1], now,
          pend[q + 2], pend[q + 3], pend[q + 4], 0, false)
      end
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
  return rg_one({}, 1, KEYS[1], now, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]),
    tonumber(ARGV[6]), ARGV[7] == '1')
end

return rg_all(KEYS, ARGV, 1, 2, n, now, nil)
