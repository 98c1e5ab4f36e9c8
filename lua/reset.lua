-- reset.lua — an operator's reset of one key (DELETE /v1/keys/...): the
-- record is deleted, and when it was live, a reset stamp is left beside it
-- for as long as the record would have lived.
--
-- KEYS[1]  the rule's key
-- ARGV[1]  its reset stamp's key, in the same slot: "<prefix>:{tag}:reset"
--          (limits.ResetStampKey; refund.lua names it the same way)
-- Reply    the record's PTTL before the reset (-2: there was none)
--
-- The stamp is not named in KEYS: it does not exist before
-- the reset, and a script naming one key present and one missing is
-- refused (TRYAGAIN) on both nodes while its slot is being migrated, so
-- the operator's reset would fail until the resharding ended. Unnamed, it
-- is written with redis.pcall: in a slot being migrated that write fails
-- and the reset goes without its stamp (the record is still deleted).
--
-- Why the stamp: a refund (refund.lua) gives back units a commit added to
-- the record, trusting that a record in force still holds them. A reset
-- erases them; an identity admitted again after it builds a new record
-- that the same refund would then lower, admitting more than the limit
-- (a late refund of decisions abandoned past redis.timeout: 6 in a window
-- of 3). The stamp holds the Redis time of the reset, and refund.lua gives
-- nothing back for a commit made at or before it. A commit's part of a
-- record ends when the record would have, so the stamp lives as long (and
-- a second more, for the clocks of a failover).
--
-- By hand: redis-cli --eval lua/reset.lua 'rg:{demo:1.2.3.4}:fw2' , 'rg:{demo:1.2.3.4}:reset'

local key = KEYS[1]
local ttl = redis.call('PTTL', key)
redis.call('DEL', key)
if ttl > 0 then
  local t = redis.call('TIME')
  redis.pcall('SET', ARGV[1], t[1] .. string.format('%06d', tonumber(t[2])), 'PX', ttl + 1000)
end
return ttl
