-- A consecutive-failures breaker with a concurrency limit, as one Redis
-- Lua script: the peer `fusebox-bench redis-cpu` measures the fusebox
-- Redis module against. It does the work of the module's
--
--   {"breaker":{"mode":"consecutive","failures":5,"break":30000},
--    "limiter":{"kind":"concurrency","permits":N}}
--
-- policy for one key per call, with the same arguments the module gets:
--
--   EVALSHA sha 1 key acquire  now_ms ticket_hex policy_json
--   EVALSHA sha 1 key complete now_ms ticket_hex outcome
--
-- and replies in the module's shapes:
--
--   acquire:  {decision, reason, ticket, lease_ms, retry_after_ms}
--             (a Lua false is a RESP nil)
--   complete: {"stale", 0|1, "phase", PHASE}
--
-- Only this breaker and limiter are implemented (no ratio mode, backoff,
-- queueing or other limiter kinds): what the benchmark's policy uses.
--
-- The key is one hash:
--   now        the latest now_ms seen; a call with an earlier one is refused
--   phase      closed | open | half_open
--   epoch      bumped at every phase change; a ticket from an older epoch
--              is stale: its outcome frees the permit but is not counted
--   fails      consecutive failures while closed
--   open_until when an open breaker lets a probe through (ms)
--   probe      the ticket holding the half-open probe slot, or ""
--   held       permits held by live tickets
--   permits, failures, break   the policy last used at the key
--   t:<ticket> "<epoch>:<lease_until>" for each live ticket

local LEASE_MS = 30000 -- the module's default lease

local key = KEYS[1]
local op = ARGV[1]
local now = tonumber(ARGV[2])
local ticket = ARGV[3]
if not now or now < 0 then
  return redis.error_reply('ERR now_ms: must be a whole number of ms')
end
if not ticket or not string.match(ticket, '^%x+$') or #ticket > 32 then
  return redis.error_reply('ERR ticket: must be 1 to 32 hex digits')
end
ticket = string.lower(ticket)

local s = redis.call('HMGET', key, 'now', 'phase', 'epoch', 'fails', 'open_until',
  'probe', 'held', 'permits', 'failures', 'break')
local last = tonumber(s[1]) or 0
if now < last then
  return redis.error_reply('ERR now (' .. now .. ' ms) is earlier than the last time seen (' ..
    last .. ' ms)')
end
local phase = s[2] or 'closed'
local epoch = tonumber(s[3]) or 0
local fails = tonumber(s[4]) or 0
local open_until = tonumber(s[5]) or 0
local probe = s[6] or ''
local held = tonumber(s[7]) or 0

-- An open breaker whose break has ended is half-open.
if phase == 'open' and now >= open_until then
  phase = 'half_open'
  epoch = epoch + 1
  probe = ''
end

if op == 'acquire' then
  local ok, policy = pcall(cjson.decode, ARGV[4])
  if not ok or type(policy) ~= 'table' or type(policy.breaker) ~= 'table'
      or type(policy.limiter) ~= 'table' then
    return redis.error_reply('ERR policy: must be a JSON object with a breaker and a limiter')
  end
  local failures = tonumber(policy.breaker.failures)
  local brk = tonumber(policy.breaker['break'])
  local permits = tonumber(policy.limiter.permits)
  if policy.breaker.mode ~= 'consecutive' or not failures or failures < 1
      or not brk or brk < 1 or policy.limiter.kind ~= 'concurrency'
      or not permits or permits < 1 then
    return redis.error_reply('ERR policy: only a consecutive breaker (failures, break in ms) ' ..
      'with a concurrency limiter (permits) is supported')
  end
  local tfield = 't:' .. ticket
  if redis.call('HEXISTS', key, tfield) == 1 then
    return redis.error_reply('ERR ticket: the id is already in use')
  end

  local function store()
    redis.call('HSET', key, 'now', now, 'phase', phase, 'epoch', epoch, 'fails', fails,
      'open_until', open_until, 'probe', probe, 'held', held, 'permits', permits,
      'failures', failures, 'break', brk)
  end

  -- The breaker first: open blocks; half-open lets one probe through.
  if phase == 'open' then
    store()
    return {'blocked', 'open', false, false, open_until - now}
  end
  if phase == 'half_open' and probe ~= '' then
    store()
    return {'blocked', 'probe_in_flight', false, false, LEASE_MS}
  end

  -- Then the permits; when none is free, tickets whose lease ended give
  -- theirs back (a scan of the hash, only on this path).
  if held + 1 > permits then
    local all = redis.call('HGETALL', key)
    for i = 1, #all, 2 do
      local f = all[i]
      if string.sub(f, 1, 2) == 't:' then
        local until_ms = tonumber(string.match(all[i + 1], ':(%d+)$'))
        if until_ms and until_ms <= now then
          redis.call('HDEL', key, f)
          held = held - 1
        end
      end
    end
    if held + 1 > permits then
      store()
      return {'denied', 'no_permits', false, false, false}
    end
  end

  held = held + 1
  local decision = 'granted'
  if phase == 'half_open' then
    probe = ticket
    decision = 'probe'
  end
  redis.call('HSET', key, tfield, epoch .. ':' .. (now + LEASE_MS))
  store()
  return {decision, false, ticket, LEASE_MS, false}
elseif op == 'complete' then
  local outcome = string.lower(ARGV[4] or '')
  if outcome ~= 'success' and outcome ~= 'failure' and outcome ~= 'ignored' then
    return redis.error_reply('ERR outcome: must be success, failure or ignored')
  end
  local tfield = 't:' .. ticket
  local t = redis.call('HGET', key, tfield)
  if not t then
    return redis.error_reply('ERR ticket: not found; it is unknown, already completed, or its lease ended')
  end
  local t_epoch, t_until = string.match(t, '^(%d+):(%d+)$')
  t_epoch, t_until = tonumber(t_epoch), tonumber(t_until)
  redis.call('HDEL', key, tfield)
  held = held - 1
  if t_until <= now then
    redis.call('HSET', key, 'now', now, 'phase', phase, 'epoch', epoch, 'probe', probe,
      'held', held)
    return redis.error_reply('ERR ticket: not found; it is unknown, already completed, or its lease ended')
  end
  local stale = 0
  if t_epoch ~= epoch then
    stale = 1
  elseif outcome == 'success' then
    if phase == 'half_open' and probe == ticket then
      -- The probe succeeded: close.
      phase, epoch, probe = 'closed', epoch + 1, ''
    end
    fails = 0
  elseif outcome == 'failure' then
    local failures = tonumber(s[9]) or 5
    local brk = tonumber(s[10]) or 30000
    if phase == 'half_open' and probe == ticket then
      -- The probe failed: open again.
      phase, epoch, probe, open_until = 'open', epoch + 1, '', now + brk
      fails = 0
    elseif phase == 'closed' then
      fails = fails + 1
      if fails >= failures then
        phase, epoch, fails, open_until = 'open', epoch + 1, 0, now + brk
      end
    end
  elseif phase == 'half_open' and probe == ticket then
    -- An ignored probe frees the slot for another.
    probe = ''
  end
  redis.call('HSET', key, 'now', now, 'phase', phase, 'epoch', epoch, 'fails', fails,
    'open_until', open_until, 'probe', probe, 'held', held)
  return {'stale', stale, 'phase', string.upper(phase)}
end
return redis.error_reply('ERR op: must be acquire or complete')
