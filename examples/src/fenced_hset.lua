-- Fenced HSET: applies a write to a hash only if its fencing token is not below the highest token this hash has
-- already accepted from the same shard (see docs/fencing.md).
--
-- KEYS[1]  the hash
-- ARGV[1]  the shard id (tokens are per shard: the hash keeps one highest token per shard that wrote it)
-- ARGV[2]  the writer's fencing token, a decimal integer below 2^53 (exact in a Lua number)
-- ARGV[3..] field, value, field, value, ...
--
-- Returns {1, token} when the write was applied (the token is now the highest stored), {0, stored} when it was
-- refused because `stored`, a higher token, was already accepted: the writer has lost the shard.
local token = tonumber(ARGV[2])
if token == nil or token < 0 or token >= 9007199254740992 or token % 1 ~= 0 then
  return redis.error_reply('ERR fencing token must be an integer in [0, 2^53)')
end
if #ARGV < 4 or #ARGV % 2 ~= 0 then
  return redis.error_reply('ERR expected shard, token and at least one field/value pair')
end
local fence = 'fence:' .. ARGV[1]
local stored = tonumber(redis.call('HGET', KEYS[1], fence) or '0')
if token < stored then
  return {0, stored}
end
local values = {}
for i = 3, #ARGV do
  values[#values + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], fence, ARGV[2], unpack(values))
return {1, token}
