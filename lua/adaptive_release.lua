-- adaptive_release.lua — give up the lease of one adaptive rule.
--
-- KEYS[1]  the rule's lease: "<prefix>:{adaptive}:lease:<rule>"
-- ARGV[1]  this instance's name
-- Reply    1 when released, 0 when this instance did not hold it
--
-- An instance shutting down releases its leases, so another one takes over
-- at its next evaluation instead of waiting for the TTL. Only the holder's
-- release counts: a late one never ends a successor's lease.
--
-- By hand: redis-cli --eval lua/adaptive_release.lua rg:{adaptive}:lease:api , me

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
