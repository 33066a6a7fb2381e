package conversation

import "github.com/redis/go-redis/v9"

// The scripts below share one layout (see Redis): under the tag T, a
// conversation K is the hash T:c:K and its TTFT list T:t:K, T:active is the
// sorted set of active conversations scored by the µs of their last turn,
// and T:b:ID marks a batch (or an idle pop) ID as applied. Every key holds
// the hash tag of T, so a script may reach keys it computes from T and a
// member of T:active (in a Cluster they are on the node it runs on).
//
// Hash fields: n turns, e errors, i o cr cw rs tokens (input, output, cache
// read, cache write, reasoning), c cost in micro-dollars, f and l the first
// and last turn in µs since the epoch (doubles hold them exactly until the
// year 2255, so Lua compares them without loss), s the first turn's start
// (µs), tm the team of the first turn, kid and u the first key and end user
// named, as set once an agent's session header named it, out the outcome as JSON, and the breakdown's members (see
// redis_breakdown.go: m|G|N, n|G, g|G|N|C, a|G|N|A). Counters move by
// HINCRBY with the decimal strings the gateway sent, never through Lua
// numbers.

// luaMember is the Lua that names a breakdown member in hash h: name when
// group g has it or has room for it (fewer than limit members), else the
// overflow member '~' (which a replica's batch may name itself), marked
// but not counted.
const luaMember = `
local function member(h, g, name, limit)
  local mk = 'm|' .. g .. '|' .. name
  if redis.call('HEXISTS', h, mk) == 1 then return name end
  if name == '~' or tonumber(redis.call('HGET', h, 'n|' .. g) or '0') >= limit then
    redis.call('HSET', h, 'm|' .. g .. '|~', '1')
    return '~'
  end
  redis.call('HSET', h, mk, '1')
  redis.call('HINCRBY', h, 'n|' .. g, 1)
  return name
end
`

// luaTake is the Lua that reads one conversation whole and deletes it.
const luaTake = `
local function take(tag, key)
  local h, l = tag .. ':c:' .. key, tag .. ':t:' .. key
  local rec = {key, redis.call('HGETALL', h), redis.call('LRANGE', l, 0, -1)}
  redis.call('DEL', h, l)
  return rec
end
`

// batchScript applies one batch of deltas, once. KEYS[1] is the batch
// marker, KEYS[2] the active set, then each conversation's hash and TTFT
// list. ARGV[1] is the marker's TTL in seconds, ARGV[2] MaxActive, ARGV[3]
// MaxTTFTs, ARGV[4] the tag, then for each conversation: its key, n, e, i,
// o, cr, cw, rs, c, first, last, seen (µs; its score), team, the number of
// TTFTs and that many TTFTs (ns), start (µs, 0 for none), key id, end
// user, 1 when an agent's session header named it (else 0), and the
// breakdown's member operations (appendBreakdown): their
// count, then each one's group, name, cap, counters and attributes.
//
// It returns {1, evicted} when it applied the batch, where evicted are the
// conversations it removed (lowest score first) to keep at most MaxActive,
// each {key, HGETALL, LRANGE}; the marker keeps them, so a batch sent again
// after a lost reply returns {0, the same evicted} and applies nothing. The
// sender sets the marker back to '1' once it has them.
//
// Redis does not undo a script that fails halfway, so key types are
// checked before anything is written: a key of the wrong type fails the
// batch whole, and it is sent again once repaired.
var batchScript = redis.NewScript(luaTake + luaMember + `
local prev = redis.call('GET', KEYS[1])
if prev then
  if prev == '1' then return {0, {}} end
  return {0, cjson.decode(prev)}
end
for k = 2, #KEYS do
  local want = 'hash'
  if k == 2 then want = 'zset' elseif k % 2 == 0 then want = 'list' end
  local t = redis.call('TYPE', KEYS[k]).ok
  if t ~= 'none' and t ~= want then
    return redis.error_reply('WRONGTYPE conversation key ' .. KEYS[k] .. ' is a ' .. t)
  end
end
redis.call('SET', KEYS[1], '1', 'EX', ARGV[1])
local maxT = tonumber(ARGV[3])
local fields = {'n', 'e', 'i', 'o', 'cr', 'cw', 'rs', 'c'}
local a = 5
for k = 3, #KEYS, 2 do
  local h, l, key = KEYS[k], KEYS[k + 1], ARGV[a]
  local first, last, seen = ARGV[a + 9], ARGV[a + 10], ARGV[a + 11]
  if redis.call('EXISTS', h) == 0 then
    redis.call('DEL', l)
    redis.call('HSET', h, 'f', first, 'l', last, 'tm', ARGV[a + 12])
  else
    local f = redis.call('HGET', h, 'f')
    if not f or tonumber(first) < tonumber(f) then redis.call('HSET', h, 'f', first) end
    local lt = redis.call('HGET', h, 'l')
    if not lt or tonumber(last) > tonumber(lt) then redis.call('HSET', h, 'l', last) end
  end
  for j, name in ipairs(fields) do
    local v = ARGV[a + j]
    if v ~= '0' or j == 1 then redis.call('HINCRBY', h, name, v) end
  end
  local old = redis.call('ZSCORE', KEYS[2], key)
  if not old or tonumber(seen) > tonumber(old) then redis.call('ZADD', KEYS[2], seen, key) end
  local nt = tonumber(ARGV[a + 13])
  local room = math.min(maxT - redis.call('LLEN', l), nt)
  if room > 0 then
    local ts = {}
    for i = 1, room do ts[i] = ARGV[a + 13 + i] end
    redis.call('RPUSH', l, unpack(ts))
  end
  a = a + 14 + nt
  local start, kid, user, agent = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  a = a + 4
  if agent == '1' then redis.call('HSET', h, 'as', '1') end
  if start ~= '0' then
    local s = redis.call('HGET', h, 's')
    if not s or tonumber(start) < tonumber(s) then redis.call('HSET', h, 's', start) end
  end
  if kid ~= '' then redis.call('HSETNX', h, 'kid', kid) end
  if user ~= '' then redis.call('HSETNX', h, 'u', user) end
  local nm = tonumber(ARGV[a])
  a = a + 1
  for m = 1, nm do
    local g, name = ARGV[a], member(h, ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]))
    local nc = tonumber(ARGV[a + 3])
    a = a + 4
    for c = 1, nc do
      if ARGV[a + 1] ~= '0' then redis.call('HINCRBY', h, 'g|' .. g .. '|' .. name .. '|' .. ARGV[a], ARGV[a + 1]) end
      a = a + 2
    end
    local na = tonumber(ARGV[a])
    a = a + 1
    for c = 1, na do
      if ARGV[a + 1] ~= '' then redis.call('HSETNX', h, 'a|' .. g .. '|' .. name .. '|' .. ARGV[a], ARGV[a + 1]) end
      a = a + 2
    end
  end
end
local ev = {}
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[2])
if over > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #popped, 2 do ev[#ev + 1] = take(ARGV[4], popped[i]) end
  redis.call('SET', KEYS[1], cjson.encode(ev), 'EX', ARGV[1])
end
return {1, ev}
`)

// idleScript ends idle conversations, once. KEYS[1] is the active set,
// KEYS[2] the pop's marker; ARGV[1] the cutoff (µs: now − IdleTimeout),
// ARGV[2] how many to take at most, ARGV[3] the marker's TTL in seconds,
// ARGV[4] the tag. It removes the conversations scored at most the cutoff,
// lowest first, and returns each {key, HGETALL, LRANGE}; the marker keeps
// the answer, so a pop sent again after a lost reply returns the same
// conversations instead of losing them. The sender sets the marker back
// to '1' once it has them.
var idleScript = redis.NewScript(luaTake + `
local prev = redis.call('GET', KEYS[2])
if prev then
  if prev == '1' then return {} end
  return cjson.decode(prev)
end
local keys = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for i, key in ipairs(keys) do
  redis.call('ZREM', KEYS[1], key)
  out[i] = take(ARGV[4], key)
end
if #out > 0 then
  redis.call('SET', KEYS[2], cjson.encode(out), 'EX', ARGV[3])
else
  redis.call('SET', KEYS[2], '1', 'EX', ARGV[3])
end
return out
`)

// getScript reads one conversation: KEYS[1] its hash, KEYS[2] its TTFT
// list, and optionally KEYS[3] the marker of the unconfirmed batch that
// holds some of its turns. It returns {marker exists (0 or 1), HGETALL,
// LRANGE}, read at one instant.
var getScript = redis.NewScript(`
local applied = 0
if KEYS[3] then applied = redis.call('EXISTS', KEYS[3]) end
return {applied, redis.call('HGETALL', KEYS[1]), redis.call('LRANGE', KEYS[2], 0, -1)}
`)

// outcomeScript records an outcome: KEYS[1] the hash, KEYS[2] the TTFT
// list, ARGV[1] the outcome's JSON. It returns {0} when the conversation
// is not active, else {1 (recorded) or 2 (one was already), HGETALL,
// LRANGE}.
var outcomeScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local st = 1
if redis.call('HSETNX', KEYS[1], 'out', ARGV[1]) == 0 then st = 2 end
return {st, redis.call('HGETALL', KEYS[1]), redis.call('LRANGE', KEYS[2], 0, -1)}
`)
