-- clamp_gcra.lua — cap one gcra key's TAT after its rule's tolerance shrank.
--
-- KEYS[1]  a gcra key (hash: t = TAT in whole µs, f = its fraction over L)
-- ARGV[1]  the new tolerance tau = B*P/L in whole µs (rounded down)
-- Reply    1 when the TAT was capped, 0 when it already fit (or the key is gone)
--
-- A TAT written under the old rule can lie further ahead than the new rule's
-- tolerance allows (a period shortened from 1h to 1m leaves an hour-long
-- TAT). Read as it is, it would keep the identity limited long after the new
-- rule would have let it through. Capping it at now + tau keeps what it
-- means — "this identity used its whole burst" — under the new numbers.
-- A TAT within the tolerance is left alone. limits.ClampGCRA runs this on
-- every gcra key of a rule whose tolerance shrinks (reload or runtime
-- override). It is no longer needed: gcra.lua caps a TAT beyond the
-- tolerance (and converts one written under another limit or period) at the
-- first decision under the new numbers. The l and p fields are left as they
-- are, as the memory store's twin (limits/migrate.go) leaves them.
--
-- By hand: redis-cli --eval lua/clamp_gcra.lua rg:{demo:1.2.3.4}:gc , 60000000

local t = tonumber(redis.call('HGET', KEYS[1], 't'))
if not t then return 0 end
local tau = tonumber(ARGV[1])
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000000 + tonumber(now[2])
if t <= now + tau then return 0 end
redis.call('HSET', KEYS[1], 't', string.format('%d', now + tau), 'f', '0')
redis.call('PEXPIRE', KEYS[1], math.max(math.ceil(tau / 1000), 1))
return 1
