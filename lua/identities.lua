-- rategate identity overrides: change one stored override and announce the
-- change, all at once.
--
-- KEYS[1]  the hash of every identity override, <prefix>:{identities}
--          (field "<rule> <identity>", value the override's JSON)
-- KEYS[2]  the change counter, <prefix>:{identities}:version
-- ARGV[1]  the pub/sub channel, <prefix>:identities
-- ARGV[2]  the field
-- ARGV[3]  the new value; "" deletes the field
-- ARGV[4]  a set: the most fields the hash may hold (a new field beyond it
--          is refused); a delete: "" or the value the field must still
--          hold to be deleted (an expired override's retirement never
--          removes a newer one)
--
-- Reply: {status, version}, both integers
--   status  1  changed: version is the counter after the change, and
--              "<version>\n<field>\n<value>" was published on ARGV[1]
--   status  0  nothing to change (the value is already stored, or the field
--              to delete is missing or holds another value): the counter
--   status -1  refused, the hash is full: the counter
--
-- The hash, the counter and the announcement change in one script, so a
-- listener that hears version v after v-2 knows it missed one change, and
-- one that reads the counter knows whether it has heard everything.
--
-- redis-cli --eval identities.lua 'rg:{identities}' 'rg:{identities}:version' , rg:identities 'api acme' '{"limit":5}' 100000

local hash, counter = KEYS[1], KEYS[2]
local channel, field, value, arg = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local function version()
  return tonumber(redis.call('GET', counter) or '0')
end

local current = redis.call('HGET', hash, field)
if value ~= '' then
  if current == value then
    return {0, version()}
  end
  if not current and redis.call('HLEN', hash) >= tonumber(arg) then
    return {-1, version()}
  end
  redis.call('HSET', hash, field, value)
else
  if not current or (arg ~= '' and current ~= arg) then
    return {0, version()}
  end
  redis.call('HDEL', hash, field)
end
local v = redis.call('INCR', counter)
redis.call('PUBLISH', channel, v .. '\n' .. field .. '\n' .. value)
return {1, v}
