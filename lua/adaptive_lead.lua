-- adaptive_lead.lua — take or renew the lease of one adaptive rule.
--
-- KEYS[1]  the rule's lease: "<prefix>:{adaptive}:lease:<rule>" (a string
--          holding the holder's instance name, with a TTL)
-- ARGV[1]  this instance's name
-- ARGV[2]  the lease's time to live, ms
-- Reply    1 when this instance holds the lease now (renewed or taken), 0
--          when another instance holds it
--
-- One instance at a time evaluates each adaptive rule's signal: the holder.
-- It renews the lease every evaluation; when it dies or stalls, the lease
-- expires (Redis's clock) and the next instance to ask takes it.
--
-- By hand: redis-cli --eval lua/adaptive_lead.lua rg:{adaptive}:lease:api , me 15000

local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
