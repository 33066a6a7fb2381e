package ratelimit

import "github.com/redis/go-redis/v9"

// script is a Lua script with its source, which run sends (EVAL) to a Redis
// that does not know the script yet.
type script struct {
	*redis.Script
	src string
}

func newScript(src string) script { return script{redis.NewScript(src), src} }

// luaCommon is the Lua every script starts with: the clock, GCRA and the
// calendar of budget windows. Every instant and theoretical arrival time
// (TAT) is an integer count of microseconds from Redis's own TIME, so that
// every replica shares one clock, and Lua's doubles hold it exactly until
// the year 2255; a TAT is stored with string.format('%d'), since tostring
// would print 1.8e15 as "1.8e+15" and lose the microseconds.
const luaCommon = `
local WINDOW = 60000000
local SLACK_MS = 1000
local DAY = 86400000000
-- GRACE is how long at least an expired lease stays in its subject's lease
-- set, so that the settlement of a request that outlived LeaseTTL, or one
-- replayed after an outage, still applies once.
local GRACE = DAY
-- MAX_TAT is 2^53 µs (the year 2255), the largest instant a double holds
-- exactly.
local MAX_TAT = 9007199254740992

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- gcra_cost is n emission intervals of a bucket refilling limit per minute,
-- rounded down so that a full bucket admits exactly limit single requests
-- (gcra.go's rateCost, in µs instead of ns).
local function gcra_cost(n, limit)
  if n <= 0 then return 0 end
  return math.floor(n * WINDOW / limit)
end

-- budget_reserve mirrors gcra.go's budgetReserve: the estimate clamped to
-- what is left of the budget (held: settled usage and reservations), or nil
-- when nothing is left, which refuses even a zero estimate.
local function budget_reserve(held, estimate, limit)
  if held >= limit then return nil end
  return math.min(estimate, limit - held)
end

-- HELD_MIN and HELD_MAX are gcra.go's heldRetryMin and heldRetryMax (µs).
local HELD_MIN, HELD_MAX = 1000000, 60000000

-- held_retry mirrors gcra.go's heldRetry, in µs; oldest is nil when no open
-- lease is known.
local function held_retry(oldest, typical, now, until_)
  local wait = HELD_MAX
  if oldest then wait = math.min(math.max(oldest + typical - now, HELD_MIN), HELD_MAX) end
  return math.max(math.min(wait, until_ - now), 0)
end

-- rebill moves a budget counter, never below zero (a missing counter is
-- zero). INCRBY creates a missing counter; it then equals delta and gets the
-- TTL of its window (end_ms) plus a day, for late settlements.
local function rebill(key, limit, delta, end_ms)
  if limit <= 0 or delta == 0 then return end
  local v = redis.call('INCRBY', key, delta)
  if v < 0 then
    redis.call('DEL', key)
  elseif v == delta then
    redis.call('PEXPIREAT', key, end_ms + 86400000)
  end
end

-- tat_of returns max(TAT, now): a missing or stale key is a full bucket.
local function tat_of(key, now)
  local v = redis.call('GET', key)
  if not v then return now end
  local tat = tonumber(v)
  if tat == nil or tat < now then return now end
  return tat
end

-- store_tat keeps the key exactly as long as the bucket is not full, and
-- returns the TAT it stored. A TAT beyond MAX_TAT (a debt of years, from an
-- absurd usage) is pinned there, as gcra.go's satAdd pins it shut: beyond it
-- '%d' and PX would overflow and could wrap the bucket open.
local function store_tat(key, tat, now)
  if tat > MAX_TAT then tat = MAX_TAT end
  if tat > now then
    redis.call('SET', key, string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000) + SLACK_MS)
  else
    redis.call('DEL', key)
  end
  return tat
end

local function used_of(key)
  local v = redis.call('GET', key)
  if not v then return 0 end
  return tonumber(v) or 0
end

-- civil and days_from_civil convert between days since 1970-01-01 and the
-- proleptic Gregorian calendar (H. Hinnant, "chrono-Compatible Low-Level Date
-- Algorithms"); Redis's Lua has no os.date.
local function civil(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m
  if mp < 10 then m = mp + 3 else m = mp - 9 end
  if m <= 2 then y = y + 1 end
  return y, m, d
end

local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp
  if m > 2 then mp = m - 3 else mp = m + 9 end
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- windows names the UTC day and month holding now (the formats of Go's
-- dayWindow and monthWindow) and returns the instants (µs) they end, and the
-- instant the month started.
local function windows(now)
  local days = math.floor(now / DAY)
  local y, m, d = civil(days)
  local ny, nm = y, m + 1
  if nm == 13 then ny, nm = y + 1, 1 end
  return string.format('%04d-%02d-%02d', y, m, d), (days + 1) * DAY,
         string.format('%04d-%02d', y, m), days_from_civil(ny, nm, 1) * DAY,
         days_from_civil(y, m, 1) * DAY
end
`

// admitScript checks every limit of one subject and reserves all of them only
// if all admit. A budget with nothing left is spent if its settled usage (the
// counter less its ":res" counter, read only then) is at the limit, and held
// otherwise; a held budget's retry is held_retry's, from the oldest live lease
// admitted in the window (the lease set's scores are admissions plus the TTL).
//
// KEYS: rpm, tpm, leases. ARGV: limits rpm, tpm, conc, tpd, cpd, cpm; tokens;
// cost; lease id; lease TTL (µs); subject base ("{tag}:"); concurrency retry
// (µs); TPM reservation (tokens clamped to the TPM limit, gcra.go's
// tpmReserve); typical request duration (µs, 0 if unknown); the key of the
// generation of Redis's data and the generation expected (both empty: not
// checked). A generation other than the one expected refuses to decide,
// with an error reply starting TOLLGATE_GENERATION, before anything is
// read or written (generation.go). The generation key is outside KEYS: it
// is checked only on a single Redis, never on a Cluster.
//
// Reply: allowed, now, refused kind (-1), retry (µs), rpm TAT-now, tpm
// TAT-now, conc used, tpd held, cpd held, cpm held, day left (µs), month left
// (µs), tpd reserved, cpd reserved, cpm reserved, hold kept (0/1), then, when
// refused, the tpd, cpd and cpm reservations of requests in flight (0 when
// allowed or not read); the window lengths are 0 for a subject without
// budgets. Rates and counts are after the reservation when allowed,
// untouched when refused (and nothing is reserved).
var admitScript = newScript(luaCommon + `
if ARGV[15] ~= '' then
  local g = redis.call('GET', ARGV[15])
  if g ~= ARGV[16] then
    return redis.error_reply('TOLLGATE_GENERATION ' .. (g and 'changed' or 'none'))
  end
end
local now = now_us()
local rpm_l, tpm_l, conc_l = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tpd_l, cpd_l, cpm_l = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local tokens, cost = tonumber(ARGV[7]), tonumber(ARGV[8])
local lease, ttl, base, conc_retry = ARGV[9], tonumber(ARGV[10]), ARGV[11], tonumber(ARGV[12])
local tpm_n, typical = tonumber(ARGV[13]), tonumber(ARGV[14])
local budgets = tpd_l > 0 or cpd_l > 0 or cpm_l > 0
local tracked = conc_l > 0 or tpm_l > 0 or budgets

-- Every refusing limit is seen; the one that frees last is reported, so
-- that its RetryAfter is a time at which a retry can pass.
local refused, retry = -1, 0
local function refuse(kind, after)
  if refused < 0 or after > retry then refused, retry = kind, after end
end

local rpm_tat, rpm_new = now, now
if rpm_l > 0 then
  rpm_tat = tat_of(KEYS[1], now)
  rpm_new = rpm_tat + gcra_cost(1, rpm_l)
  if rpm_new - now > WINDOW then refuse(0, rpm_new - now - WINDOW) end
end
local tpm_tat, tpm_new = now, now
if tpm_l > 0 then
  tpm_tat = tat_of(KEYS[2], now)
  tpm_new = tpm_tat + gcra_cost(tpm_n, tpm_l)
  if tpm_new - now > WINDOW then refuse(1, tpm_new - now - WINDOW) end
end
local conc_used = 0
if conc_l > 0 then
  -- Leases of replicas that died without settling stop counting at their
  -- expiry.
  conc_used = redis.call('ZCOUNT', KEYS[3], string.format('(%d', now), '+inf')
  if conc_used >= conc_l then refuse(2, conc_retry) end
end
local day_end, month_end = now, now
local tpd_key, cpd_key, cpm_key
local tpd_used, cpd_used, cpm_used = 0, 0, 0
local tpd_n, cpd_n, cpm_n = 0, 0, 0
local tpd_res, cpd_res, cpm_res = 0, 0, 0
-- budget_refuse refuses a budget with nothing left (held of limit, in the
-- window from wstart to wend whose counter is key) and returns the
-- reservations of requests in flight it holds.
local function budget_refuse(kind, key, held, limit, wstart, wend)
  local res = math.min(used_of(key .. ':res'), held)
  if held - res >= limit then
    refuse(kind, wend - now)
    return res
  end
  local oldest, until_ = nil, wend
  local first = redis.call('ZRANGEBYSCORE', KEYS[3], string.format('(%d', math.max(now, wstart + ttl)), '+inf',
                           'WITHSCORES', 'LIMIT', 0, 1)
  if first[2] then
    local expiry = tonumber(first[2])
    oldest, until_ = expiry - ttl, math.min(wend, expiry)
  end
  refuse(kind, held_retry(oldest, typical, now, until_))
  return res
end
if budgets then
  local day, month, month_start
  day, day_end, month, month_end, month_start = windows(now)
  tpd_key, cpd_key, cpm_key = base .. 'tpd:' .. day, base .. 'cpd:' .. day, base .. 'cpm:' .. month
  if tpd_l > 0 then
    tpd_used = used_of(tpd_key)
    tpd_n = budget_reserve(tpd_used, tokens, tpd_l)
    if not tpd_n then tpd_n = 0; tpd_res = budget_refuse(3, tpd_key, tpd_used, tpd_l, day_end - DAY, day_end) end
  end
  if cpd_l > 0 then
    cpd_used = used_of(cpd_key)
    cpd_n = budget_reserve(cpd_used, cost, cpd_l)
    if not cpd_n then cpd_n = 0; cpd_res = budget_refuse(4, cpd_key, cpd_used, cpd_l, day_end - DAY, day_end) end
  end
  if cpm_l > 0 then
    cpm_used = used_of(cpm_key)
    cpm_n = budget_reserve(cpm_used, cost, cpm_l)
    if not cpm_n then cpm_n = 0; cpm_res = budget_refuse(5, cpm_key, cpm_used, cpm_l, month_start, month_end) end
  end
end

if refused >= 0 then
  return {0, now, refused, retry, rpm_tat - now, tpm_tat - now, conc_used,
          tpd_used, cpd_used, cpm_used, day_end - now, month_end - now, 0, 0, 0, 0, tpd_res, cpd_res, cpm_res}
end

if rpm_l > 0 then rpm_tat = store_tat(KEYS[1], rpm_new, now) end
if tpm_l > 0 then tpm_tat = store_tat(KEYS[2], tpm_new, now) end
if tracked then
  redis.call('ZADD', KEYS[3], string.format('%d', now + ttl), lease)
  -- The set must outlive its newest lease by GRACE. Its TTL is extended an
  -- hour beyond that at a time, so that most admissions only read it (a
  -- PEXPIRE costs several times a PTTL); leases expired more than GRACE ago
  -- (of replicas that died without settling) are pruned then too.
  local keep = math.ceil((ttl + GRACE) / 1000) + SLACK_MS
  if redis.call('PTTL', KEYS[3]) < keep then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('(%d', now - GRACE))
    redis.call('PEXPIRE', KEYS[3], keep + 3600000)
  end
  if conc_l > 0 then conc_used = conc_used + 1 end
end
-- charge adds a reservation to a budget window. A window's counter outlives
-- it by a day, for late settlements; the TTL is set when INCRBY created the
-- counter (it then equals n), since every later write is in the same window.
local function charge(key, used, n, wend)
  if n <= 0 then return used end
  local v = redis.call('INCRBY', key, n)
  if v == n then redis.call('PEXPIREAT', key, math.floor(wend / 1000) + 86400000) end
  return v
end
-- reserve counts a reservation in the window's ":res" counter, with the TTL
-- of the counter beside it. That counter falls back to 0 whenever every
-- request in flight has settled, and is kept then: after INCRBY, a value of n
-- is a new counter only if it has no TTL yet, which a PTTL (a read) tells
-- before a PEXPIREAT (a write).
local function reserve(key, n, wend)
  if n <= 0 then return end
  key = key .. ':res'
  if redis.call('INCRBY', key, n) == n and redis.call('PTTL', key) < 0 then
    redis.call('PEXPIREAT', key, math.floor(wend / 1000) + 86400000)
  end
end
if tpd_l > 0 then tpd_used = charge(tpd_key, tpd_used, tpd_n, day_end); reserve(tpd_key, tpd_n, day_end) end
if cpd_l > 0 then cpd_used = charge(cpd_key, cpd_used, cpd_n, day_end); reserve(cpd_key, cpd_n, day_end) end
if cpm_l > 0 then cpm_used = charge(cpm_key, cpm_used, cpm_n, month_end); reserve(cpm_key, cpm_n, month_end) end
-- A clamped reservation is also kept under the lease, as long as the lease
-- can be settled, for a settlement that does not know it: the undo of an
-- admission whose reply never came. An unclamped one is the estimate, which
-- every settlement knows.
local held = 0
if (tpd_l > 0 and tpd_n < tokens) or (cpd_l > 0 and cpd_n < cost) or (cpm_l > 0 and cpm_n < cost) then
  redis.call('SET', base .. 'hold:' .. lease, string.format('%d %d %d', tpd_n, cpd_n, cpm_n),
             'PX', math.ceil((ttl + GRACE) / 1000) + SLACK_MS)
  held = 1
end
return {1, now, -1, 0, rpm_tat - now, tpm_tat - now, conc_used,
        tpd_used, cpd_used, cpm_used, day_end - now, month_end - now, tpd_n, cpd_n, cpm_n, held, 0, 0, 0}
`)

// settleScript corrects one subject's reservation to the real usage; with
// ARGV[14] = 1 and a real usage of zero it undoes an admission entirely. For
// a subject with a lease set it does nothing unless the lease is still in
// it, so that a lease is settled at most once, and an undo of an admission
// that never ran does nothing. Each budget counter is moved by the real
// usage less the reservation, and the ":res" counter beside it gives the
// reservation back.
//
// KEYS: rpm, tpm, leases, tpd, cpd, cpm (budget keys of the lease's admission
// windows), hold (the lease's kept hold). ARGV: limits rpm, tpm, conc, tpd,
// cpd, cpm; TPM delta (actual − clamped reservation); actual tokens; actual
// cost; tpd, cpd, cpm reserved; lease id; refund one request (0/1); day end
// (ms); month end (ms); hold mode; subject base; lease TTL (µs).
//
// Hold mode 0: the reservations are known and nothing was kept. 1: they are
// known and a hold was kept, which is deleted. 2: the admission's reply never
// came: the kept hold, if any, gives the reservations (otherwise they are the
// estimates passed), and the lease's expiry minus the TTL gives its admission
// time and so its windows (KEYS 4-6 are then ignored).
//
// Reply: applied (0/1), now, rpm TAT-now, tpm TAT-now. The rates (and now)
// are read only for a refund, the one caller that reports them; otherwise
// they are 0.
var settleScript = newScript(luaCommon + `
local rpm_l, tpm_l, conc_l = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tpd_l, cpd_l, cpm_l = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local tpm_delta, tokens, cost = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local tpd_n, cpd_n, cpm_n = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local lease, refund = ARGV[13], ARGV[14] == '1'
local day_end_ms, month_end_ms = tonumber(ARGV[15]), tonumber(ARGV[16])
local hold_mode = ARGV[17]
local tpd_key, cpd_key, cpm_key = KEYS[4], KEYS[5], KEYS[6]
local budgets = tpd_l > 0 or cpd_l > 0 or cpm_l > 0

if budgets and hold_mode == '2' then
  local score = redis.call('ZSCORE', KEYS[3], lease)
  if not score then return {0, 0, 0, 0} end
  local day, dend, month, mend = windows(tonumber(score) - tonumber(ARGV[19]))
  local base = ARGV[18]
  tpd_key, cpd_key, cpm_key = base .. 'tpd:' .. day, base .. 'cpd:' .. day, base .. 'cpm:' .. month
  day_end_ms, month_end_ms = dend / 1000, mend / 1000
  local v = redis.call('GET', KEYS[7])
  if v then
    local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
    if a then tpd_n, cpd_n, cpm_n = tonumber(a), tonumber(b), tonumber(c) end
    redis.call('DEL', KEYS[7])
  end
end
if (conc_l > 0 or tpm_l > 0 or budgets) and
   redis.call('ZREM', KEYS[3], lease) == 0 then
  return {0, 0, 0, 0}
end
if hold_mode == '1' then redis.call('DEL', KEYS[7]) end

local now = 0
if refund or (tpm_l > 0 and tpm_delta ~= 0) then now = now_us() end

-- adjust is gcra.go's rateSettle: a charge is taken from the bucket as it
-- is now and may put it in debt; a refund never takes the TAT below now (a
-- bucket is never more than full).
local function adjust(key, delta, limit)
  local tat = tat_of(key, now)
  if delta >= 0 then
    tat = tat + gcra_cost(delta, limit)
  else
    tat = math.max(tat - gcra_cost(-delta, limit), now)
  end
  return store_tat(key, tat, now) - now
end

local rpm_d, tpm_d = 0, 0
if refund and rpm_l > 0 then rpm_d = adjust(KEYS[1], -1, rpm_l) end
if tpm_l > 0 then
  if tpm_delta ~= 0 then tpm_d = adjust(KEYS[2], tpm_delta, tpm_l)
  elseif refund then tpm_d = tat_of(KEYS[2], now) - now end
end

-- The real usage is charged in full, also beyond a clamped reservation. A
-- reserved counter that has vanished (a settlement a day after its window)
-- is not left negative: rebill deletes it.
rebill(tpd_key, tpd_l, tokens - tpd_n, day_end_ms)
rebill(cpd_key, cpd_l, cost - cpd_n, day_end_ms)
rebill(cpm_key, cpm_l, cost - cpm_n, month_end_ms)
rebill(tpd_key .. ':res', tpd_l, -tpd_n, day_end_ms)
rebill(cpd_key .. ':res', cpd_l, -cpd_n, day_end_ms)
rebill(cpm_key .. ':res', cpm_l, -cpm_n, month_end_ms)
if not refund then return {1, 0, 0, 0} end
return {1, now, rpm_d, tpm_d}
`)

// chargeScript adds usage admitted elsewhere (by a Failover's fallback while
// Redis was down) to one subject's budget counters in the windows of its
// admission, once per charge id: the marker, set by the same script, makes a
// replay after a lost reply a no-op. The marker lives as long as the counters
// it charged; a charge whose counters have already expired is ignored.
//
// KEYS: tpd, cpd, cpm, marker. ARGV: limits tpd, cpd, cpm; tokens; cost; day
// end (ms); month end (ms). Reply: 1 if charged, 0 if not.
var chargeScript = newScript(luaCommon + `
local tpd_l, cpd_l, cpm_l = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens, cost = tonumber(ARGV[4]), tonumber(ARGV[5])
local day_end_ms, month_end_ms = tonumber(ARGV[6]), tonumber(ARGV[7])
local last_ms = day_end_ms
if cpm_l > 0 then last_ms = month_end_ms end
local keep = last_ms + 86400000 - math.floor(now_us() / 1000)
if keep <= 0 then return 0 end
if not redis.call('SET', KEYS[4], '1', 'NX', 'PX', string.format('%d', keep)) then return 0 end
rebill(KEYS[1], tpd_l, tokens, day_end_ms)
rebill(KEYS[2], cpd_l, cost, day_end_ms)
rebill(KEYS[3], cpm_l, cost, month_end_ms)
return 1
`)

// raiseScript raises one subject's budget counters to at least what a
// ledger says was used: idempotent, so replicas raising to the same figures
// raise once, and a counter already past them is left alone.
//
// KEYS: tpd, cpd, cpm. ARGV: tokens-per-day, cost-per-day, cost-per-month
// limits (0: not raised), tokens and cost of the day, cost of the month, day
// end (ms), month end (ms). Reply: 1.
var raiseScript = newScript(luaCommon + `
local lims = {tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])}
local to = {tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])}
local ends = {tonumber(ARGV[7]), tonumber(ARGV[7]), tonumber(ARGV[8])}
for i = 1, 3 do
  local d = to[i] - used_of(KEYS[i])
  if lims[i] > 0 and d > 0 then rebill(KEYS[i], lims[i], d, ends[i]) end
end
return 1
`)

// peekScript reads one subject's state without changing it.
//
// KEYS: rpm, tpm, leases. ARGV: subject base. Reply: now, rpm TAT-now, tpm
// TAT-now, live leases, tpd held, cpd held, cpm held, day left (µs), month
// left (µs), tpd reserved, cpd reserved, cpm reserved.
var peekScript = newScript(luaCommon + `
local now = now_us()
local base = ARGV[1]
local day, day_end, month, month_end = windows(now)
local tpd, cpd, cpm = base .. 'tpd:' .. day, base .. 'cpd:' .. day, base .. 'cpm:' .. month
return {now, tat_of(KEYS[1], now) - now, tat_of(KEYS[2], now) - now,
        redis.call('ZCOUNT', KEYS[3], string.format('(%d', now), '+inf'),
        used_of(tpd), used_of(cpd), used_of(cpm), day_end - now, month_end - now,
        used_of(tpd .. ':res'), used_of(cpd .. ':res'), used_of(cpm .. ':res')}
`)

// raiseRatesScript empties one subject's rate buckets to at least a floor:
// each bucket full no sooner than its floor from now (Redis's clock), a
// bucket already emptier left alone (generation.go's RaiseRates).
//
// KEYS: rpm, tpm. ARGV: µs until the RPM bucket is full, the same for TPM
// (0: not raised). Reply: 1.
var raiseRatesScript = newScript(luaCommon + `
local now = now_us()
for i = 1, 2 do
  local d = tonumber(ARGV[i])
  if d > 0 and tat_of(KEYS[i], now) < now + d then store_tat(KEYS[i], now + d, now) end
end
return 1
`)
