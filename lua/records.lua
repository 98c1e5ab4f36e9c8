-- records.lua — a decide_many call's held records, which every algorithm
-- can write to instead of Redis.
--
-- lua.go puts this file first in every script it assembles and in the
-- function library. Run alone (redis-cli --eval) an algorithm file never
-- calls it: its io is nil.
--
-- decide_many.lua holds the records of the keys a call names more than once
-- (a route's or the whole API's rule: one key for many requests) in a table
-- io: io[key] is the record (a string, or false: none), or, once an
-- algorithm that keeps it so has read it (fixed_window, sliding_window),
-- the record decoded: a list of its numbers, which that algorithm reads
-- and changes in place for the call's other decisions (no unpack and pack
-- per decision; a write of a whole record puts a string back). A count
-- changed in place (rg_set) marks the key written, keeping its expiry; the
-- call packs the list when it writes the key. rg_written[key] is true once
-- a decision of the call wrote it, rg_expiry[key] how long after the
-- call's instant it expires when a write of this call said so (nil: the
-- expiry it has in Redis; false: none); decide_many.lua sets both anew
-- for each call that holds keys. An algorithm given io reads the key from
-- io and writes it with rg_hold or rg_set; the call writes each written
-- key to Redis once, when it ends (dm_flush in decide_many.lua): one GET
-- and one write per key and call instead of one each per decision, the same
-- record and expiry as writing at once would leave (a call runs at one
-- instant, and nothing else runs during it).

local rg_written, rg_expiry

-- rg_quick holds, during a call that holds keys, the held records that
-- carry a shortcut (nil between calls; a call killed midway leaves its
-- table until the next one starts). An algorithm whose admissions at the
-- call's instant only add their cost to the record's count (r[2]), allowed
-- while base + count + cost <= limit (fixed_window: base 0; sliding_window:
-- the previous window's weighted count, which the instant fixes), leaves in
-- the decoded record r the base (r.b), the period it decided under (r.p)
-- and the reset an admission reports (r.z), and sets rg_quick[key] = r.
-- The call's later decisions on that key under the same period are then
-- admitted by rg_take in a few steps instead of a turn of the algorithm:
-- bench/redisinstr, one held sliding_window key, 19,830 → 17,730
-- instructions per decision. A denial, a cost of 0, another period, a
-- count that is not positive, or a record the call has since rewritten
-- (io[key] is no longer r) go the algorithm's way; an algorithm leaves no
-- shortcut on a record its next admission must rewrite. (The limit needs
-- no check: neither the base nor the reset depends on it.)
local rg_quick

-- rg_take admits cost on key's held record r by its shortcut and returns
-- the remaining and reset the algorithm would report, or nil when the
-- shortcut does not apply and the algorithm decides.
local function rg_take(key, r, limit, period, cost)
  if rg_quick[key] ~= r or r.p ~= period or cost <= 0 or r[2] <= 0 then return nil end
  -- sliding_window's verdict and remaining, the same doubles in the same
  -- order; fixed_window's (limit - count - cost) as the same whole number
  if r.b + r[2] + cost > limit then return nil end
  local c = r[2] + cost
  r[2], rg_written[key] = c, true
  local rem = math.floor(limit - (r.b + c))
  if rem < 0 then rem = 0 end
  return rem, r.z
end

-- rg_shortcut gives key's held record r a shortcut (rg_quick) in a call
-- that holds keys.
local function rg_shortcut(key, r, base, period, reset)
  if rg_quick and rg_quick[key] ~= r then
    r.b, r.p, r.z = base, period, reset
    rg_quick[key] = r
  end
end

-- rg_formats packs a decoded record of n numbers back into its string.
local rg_formats = {[2] = '<dd', [4] = '<dddd', [5] = '<ddddd'}

-- rg_set changes number i of key's record to x where the call holds it
-- decoded (a count-only write: the expiry stays), and reports whether it
-- did; false: the caller writes the whole record.
local function rg_set(io, key, i, x)
  local r = io[key]
  if type(r) ~= 'table' then return false end
  r[i], rg_written[key] = x, true
  return true
end

-- rg_hold is an algorithm's write of key: the record v (false: the key is
-- deleted), expiring ms after the call's instant, or keeping the expiry it
-- has (ms nil).
local function rg_hold(io, key, v, ms)
  io[key], rg_written[key] = v, true
  if not v then
    rg_expiry[key] = false
  elseif ms then
    rg_expiry[key] = ms
  end
end
