-- refund.lua — give back what the admitted part of a denied request consumed.
--
-- On Redis Cluster the rules of one request usually live in different hash
-- slots, and one script can only touch one slot. rategate then runs
-- decide.lua once per slot, in parallel; when some slot denies, the slots
-- that admitted (and so committed) are handed to this script, which undoes
-- their commits and reports their quota as it now stands. lua.go prepends
-- the algorithm functions and their <algo>_refund twins (the part of each
-- lua/<algo>.lua above its "@standalone" line) and fills in the two tables
-- below, for the script (RefundScript) and the function library alike.
--
-- KEYS[1..n]  the keys to refund (all in one hash slot)
-- KEYS[n+1]   this refund's marker, in the same slot: "<prefix>:{tag}:refund:<id>"
--             (none when ARGV[2] is 0)
-- ARGV[1]  now in microseconds, or 0 to use Redis TIME
-- ARGV[2]  how long the marker lives, ms; 0: no marker (a slot being
--          migrated refuses a script whose marker is missing, TRYAGAIN, on
--          either side: the caller then sends the refund unmarked, and
--          never again once it may have run). A marked refund that runs
--          this long or longer after its commit (at_us, below) gives
--          nothing back: its marker may have come and gone, set by a
--          resend that ran before this send, held up in the network, did
-- ARGV[3+8(i-1) ...]  per key: algorithm code, limit, period_us, burst, cost,
--          then what decide.lua reported for it when it committed: at_us (its
--          now), remaining, reset_us
-- Reply    {now_us, then per key: allowed, remaining, reset_us, retry_us}, each
--          a zero-cost look after the refund (decide.lua's shape for a rule
--          that would have allowed a denied request)
--
-- Exactly once: the marker is set with NX, and a refund whose marker exists
-- already gives nothing back, so a resend (a retry after a lost reply) cannot
-- return the quota twice. A refund only ever gives back what the request
-- still holds (see each <algo>_refund): a late or lost refund leaves the
-- limiter stricter than exact, never looser. An operator's reset erased
-- what a commit made before it held (reset.lua): a key whose reset stamp,
-- "<prefix>:{tag}:reset" beside it, is at or after the commit's time gets
-- nothing back. The stamp is read without being named in KEYS: it exists
-- only for a while after a reset, and a named missing key makes a slot
-- being migrated refuse the script (TRYAGAIN), which is why a refund there
-- is resent without its marker (cluster.go, unmark). Unnamed, a stamp
-- missing from a slot being migrated is an error, taken as no reset: such
-- refunds still run, and only a reset whose stamp has already moved to
-- the new node while the record has not (or that was made during the
-- migration, without a stamp: reset.lua) can be missed, for the
-- abandoned units of that one key.

local algorithms = {ALGORITHM_TABLE}
local refunds = {REFUND_TABLE}

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local n, fresh, life = #KEYS, true, tonumber(ARGV[2])
if life > 0 then
  n = n - 1
  fresh = redis.call('SET', KEYS[n + 1], '1', 'NX', 'PX', ARGV[2])
end
local reply = {now}
for i = 1, n do
  local b = 3 + (i - 1) * 8
  local code = tonumber(ARGV[b])
  local algo, refund = algorithms[code], refunds[code]
  if not algo or not refund then
    return redis.error_reply('rategate: unknown algorithm code ' .. tostring(ARGV[b]))
  end
  local limit, period, burst, cost = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
    tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  -- A marked send that runs once its marker could have ended (life ms
  -- after the commit at ARGV[b+5]: every earlier run of this refund set
  -- the marker at or after the commit) may be a copy of one that ran
  -- already, held up in the network: it gives nothing back (strict).
  if fresh and cost > 0 and (life <= 0 or now < tonumber(ARGV[b + 5]) + life * 1000) then
    -- the key's reset stamp, as limits.ResetStampKey names it (its hash
    -- tag, then ":reset"); a value that is not a time counts as a reset
    -- at or after the commit, an error as no stamp (above)
    local key, at = KEYS[i], tonumber(ARGV[b + 5])
    local o = string.find(key, '{', 1, true)
    local c = o and string.find(key, '}', o + 1, true)
    local stamp = '{' .. key .. '}:reset'
    if c and c > o + 1 then stamp = string.sub(key, 1, c) .. ':reset' end
    local v = redis.pcall('GET', stamp)
    if type(v) ~= 'string' or (tonumber(v) or at) < at then
      refund(key, now, limit, period, burst, cost, at, tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7]))
    end
  end
  local a, rem, reset, retry = algo(KEYS[i], now, limit, period, burst, 0)
  local o = 2 + (i - 1) * 4
  reply[o], reply[o + 1], reply[o + 2], reply[o + 3] = a, rem, reset, retry
end
return reply
