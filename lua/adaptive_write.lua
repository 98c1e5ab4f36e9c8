-- adaptive_write.lua — store one adaptive rule's decision, only as the
-- lease's holder.
--
-- KEYS[1]  the rule's lease: "<prefix>:{adaptive}:lease:<rule>"
-- KEYS[2]  the records: the hash "<prefix>:{adaptive}" (field = rule name,
--          value = JSON), in the same hash slot as the lease
-- ARGV[1]  this instance's name
-- ARGV[2]  the rule's name
-- ARGV[3]  the record (JSON)
-- Reply    1 when written, 0 when this instance does not hold the lease
--          (nothing written)
--
-- The check and the write are one step: an instance that stalled past its
-- lease, while another took over, cannot overwrite the new holder's
-- decision when it wakes up.
--
-- By hand: redis-cli --eval lua/adaptive_write.lua rg:{adaptive}:lease:api rg:{adaptive} , me api '{"factor":1.5}'

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
