-- MWRA: every state transition of the lease scheduler, one atomic script (leases.py calls it and
-- documents the keys). The script is this file, then fairshare.lua (the pass), then ops.lua.
--
-- KEYS[1] = the namespace prefix "mrl:sched:{ns}:"; every key below starts with it and shares its
-- hash tag, so one Redis Cluster slot holds a namespace (the script derives its keys from it).
-- ARGV[1] = op (register | submit | cancel | status | renew | release | tick), ARGV[2] = now in ms
-- ('' = Redis TIME, so every replica reads one clock), ARGV[3] = event stream MAXLEN, ARGV[4] =
-- tombstone seconds, ARGV[5] = aging, ARGV[6] = most grants per pass, ARGV[7] = estimate EWMA
-- alpha, ARGV[8] = backfill slack, ARGV[9] = anticipation ms; the op's own arguments follow from ARGV[10].
--
-- Every op that frees devices or queues a request ends with `pass()`: grant in fair-share order
-- (fairshare.py states the rule; this is its only implementation), which first drops the requests
-- past their liveness deadline. `tick` also keeps the requests its replica waits on alive, sweeps
-- expired leases and trims the event stream.
-- Replies are {status list, grants}; grants = (rid, token, devices, expires, policy, worker, phase)
-- per grant the pass made, flat; a lease in a status list is those same seven.
local P = KEYS[1]
local OP = ARGV[1]
local NOW
if ARGV[2] ~= '' then
  NOW = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local A = 10  -- first op argument

local function key(s) return P .. s end
local function split(s)
  local t = {}
  for w in string.gmatch(s, '%S+') do t[#t + 1] = w end
  return t
end

-- The tombstone of an ended lease, "token why policy run at detail" (tabs): as a list, or nil.
local function tombstone(id)
  local t = redis.call('GET', key('ended:' .. id))
  if not t then return nil end
  local f = {}
  for v in string.gmatch(t .. '\t', '([^\t]*)\t') do f[#f + 1] = v end
  return f
end

-- -- fast paths: a renewal in time, a look at a request ------------------------------------------
local EXPIRED_RENEWAL = false
if OP == 'renew' then
  -- ARGV[A..] = lease id, fencing token, ttl ms (0: the lease's own)
  local id, tok = ARGV[A], ARGV[A + 1]
  local f = redis.call('HMGET', key('lease:' .. id), 'tok', 'x', 'ttl', 'd', 'p', 'w', 'ph')
  if not f[1] then
    local e = tombstone(id)
    if not e then return {{'unknown'}, {}} end
    if e[1] ~= tok then return {{'stale', e[1]}, {}} end
    return {{'lost', e[2], e[6]}, {}}
  end
  if f[1] ~= tok then return {{'stale', f[1]}, {}} end
  if tonumber(f[2]) > NOW then
    local ttl = tonumber(ARGV[A + 2])
    if ttl <= 0 then ttl = tonumber(f[3]) end
    local x = NOW + ttl
    redis.call('HSET', key('lease:' .. id), 'x', x, 'ttl', ttl)
    redis.call('ZADD', key('expiry'), x, id)
    return {{'ok', id, f[1], f[4], x, f[5], f[6], f[7]}, {}}
  end
  EXPIRED_RENEWAL = true  -- ended below, with a pass for its devices
elseif OP == 'status' then
  -- ARGV[A] = rid
  local rid = ARGV[A]
  local L = redis.call('HMGET', key('lease:' .. rid), 'tok', 'd', 'x', 'p', 'w', 'ph')
  if L[1] then return {{'granted', rid, L[1], L[2], L[3], L[4], L[5], L[6]}, {}} end
  local f = redis.call('HMGET', key('req:' .. rid), 'p', 'st', 'why')
  if f[2] == 'refused' then return {{'refused', f[3]}, {}} end
  if f[1] then return {{'queued'}, {}} end
  local e = tombstone(rid)
  return {{'gone', e and e[2] or ''}, {}}
end

local MAXLEN, TOMB, AGING = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local LIMIT, ALPHA, SLACK, ANTICIPATE = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local function num(v, default) if v then return tonumber(v) end return default end
local function fmt(x) return string.format('%.17g', x) end
local function node_of(d) return string.match(d, '^(.*)/') end
local function hash(k)
  local flat, t = redis.call('HGETALL', k), {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end
local function by_node(devs)
  local t = {}
  for _, d in ipairs(devs) do
    local nd = node_of(d)
    t[nd] = t[nd] or {}
    table.insert(t[nd], d)
  end
  return t
end

-- Per-policy state (pstate: p|vt, p|adv, p|wt, p|held, p|usage, p|est|phase, p|back, p|backk), read once,
-- written once.
local S, dirty = nil, {}
local function state()
  S = S or hash(key('pstate'))
  return S
end
local function put(field, value)
  state()[field] = value
  dirty[field] = true
end
local function finish(reply)
  local args = {}
  for field, _ in pairs(dirty) do args[#args + 1], args[#args + 2] = field, fmt(tonumber(S[field])) end
  if #args > 0 then redis.call('HSET', key('pstate'), unpack(args)) end
  return reply
end

-- An event is one field e = "type id policy worker phase run token devices expires at why" (tabs).
local function emit(kind, id, L)
  redis.call('XADD', key('events'), '*', 'e', table.concat({kind, id, L.p or '', L.w or '', L.ph or '', L.r or '',
    L.tok or '0', L.d or '', L.x or '0', NOW, L.why or ''}, '\t'))
end

-- Free devices: nfree holds node -> its free device ids, space-separated and sorted, for the nodes
-- that have any (a pass reads only those).
local function set_free(nd, ids)
  if #ids == 0 then return redis.call('HDEL', key('nfree'), nd) end
  table.sort(ids)
  redis.call('HSET', key('nfree'), nd, table.concat(ids, ' '))
end

-- -- inventory ---------------------------------------------------------------------------------
-- Devices with memory >= m: (total, most on one node, that node), from the summary register keeps.
local function capacity(m)
  local best, summary = nil, nil
  for M, v in pairs(hash(key('cap'))) do
    local mm = tonumber(M)
    if mm >= m and (best == nil or mm < best) then best, summary = mm, v end
  end
  if not summary then return 0, 0, '' end
  local t = split(summary)
  return tonumber(t[1]), tonumber(t[2]), t[3] or ''
end

local function recompute_capacity()
  redis.call('DEL', key('cap'))
  local per, distinct = {}, {}
  for _, nd in ipairs(redis.call('SMEMBERS', key('nodes'))) do
    per[nd] = redis.call('HVALS', key('node:' .. nd))
    for _, v in ipairs(per[nd]) do distinct[v] = true end
  end
  for M, _ in pairs(distinct) do
    local mm, total, most, where = tonumber(M), 0, 0, ''
    for nd, mems in pairs(per) do
      local c = 0
      for _, v in ipairs(mems) do if tonumber(v) >= mm then c = c + 1 end end
      total = total + c
      if c > most or (c == most and nd < where) then most, where = c, nd end
    end
    redis.call('HSET', key('cap'), M, total .. ' ' .. most .. ' ' .. where)
  end
end

local function listing(names)  -- sorted, the first 16, for a message
  table.sort(names)
  if #names == 0 then return 'none' end
  if #names <= 16 then return table.concat(names, ', ') end
  return table.concat(names, ', ', 1, 16) .. ', ... (' .. #names .. ' in all)'
end

-- Whether the inventory can ever grant h, and why not: a pinned request needs every device it names,
-- each with >= m bytes; any other, k devices with >= m bytes (on one node with same_node).
local function possible(h)
  for _, d in ipairs(h.pin or {}) do
    local nd = node_of(d)
    local mem = redis.call('HGET', key('node:' .. nd), d)
    if not mem then
      local there = redis.call('HKEYS', key('node:' .. nd))
      local known = nd .. ' has ' .. listing(there)
      if #there == 0 then
        known = 'no node ' .. nd .. '; the nodes are ' .. listing(redis.call('SMEMBERS', key('nodes')))
      end
      return false, 'pins ' .. d .. ', which is not in the inventory (' .. known .. '); pin devices that ' ..
        'Inventory lists'
    end
    if tonumber(mem) < h.m then
      return false, 'pins ' .. d .. ', which has ' .. mem .. ' bytes, less than min_memory_bytes ' .. h.m ..
        '; pin larger devices or ask for less memory'
    end
  end
  if h.pin then return true, '' end
  local total, most, where = capacity(h.m)
  local ok = total >= h.k and (not h.s or most >= h.k)
  return ok, 'asks for ' .. h.k .. ' device(s) with >= ' .. h.m .. ' bytes' .. (h.s and ' on one node' or '') ..
    '; the inventory has ' .. total .. ' such device(s), at most ' .. most .. ' on one node' ..
    (where ~= '' and (' (' .. where .. ')') or '') .. '; ask for fewer devices or less memory, or register more'
end

-- -- leases ------------------------------------------------------------------------------------
-- Ending a lease frees its devices (a live lease's devices are registered and owned by it: a device
-- that leaves the inventory revokes its lease first, `gone`) and settles its policy's virtual time
-- with what it really used:
--   vt[p] += k * (actual - est) / w        (the grant charged k * est / w in advance: adv[p])
local function end_lease(id, why, detail, gone)
  local L = hash(key('lease:' .. id))
  if not L.tok then return nil end
  local devs = split(L.d)
  redis.call('HDEL', key('owner'), unpack(devs))
  for nd, ds in pairs(by_node(devs)) do
    redis.call('ZREM', key('ends:' .. nd), unpack(ds))
    local free = split(redis.call('HGET', key('nfree'), nd) or '')
    for _, d in ipairs(ds) do
      if not (gone and gone[d]) then free[#free + 1] = d end
    end
    set_free(nd, free)
  end
  local stop = why == 'expired' and math.min(NOW, tonumber(L.x)) or NOW  -- an expired holder lost it at x
  local k, actual, s = tonumber(L.k), math.max(0, stop - tonumber(L.g)), state()
  put(L.p .. '|held', num(s[L.p .. '|held'], 0) - k)
  put(L.p .. '|vt', num(s[L.p .. '|vt'], 0) + k * (actual - tonumber(L.est)) / tonumber(L.wt))
  put(L.p .. '|adv', num(s[L.p .. '|adv'], 0) - k * tonumber(L.est) / tonumber(L.wt))
  put(L.p .. '|usage', num(s[L.p .. '|usage'], 0) + k * actual)
  if why == 'released' then  -- the holder's own measure of its phase length
    local ek = L.p .. '|est|' .. L.ph
    local old = num(s[ek], nil)
    put(ek, old and (old + ALPHA * (actual - old)) or actual)
    -- anticipation: a holder that released is expected back at once (its next phase), so its policy
    -- stays active until NOW + ANTICIPATE, and a pass keeps its k devices for it while it would be
    -- first in the order (fairshare.py)
    if ANTICIPATE > 0 and redis.call('HEXISTS', key('heads'), L.p) == 0 then
      put(L.p .. '|back', NOW + ANTICIPATE)
      put(L.p .. '|backk', k)
    end
  end
  redis.call('DEL', key('lease:' .. id))
  redis.call('ZREM', key('expiry'), id)
  redis.call('SET', key('ended:' .. id), table.concat({L.tok, why, L.p, L.r, NOW, detail}, '\t'), 'EX', TOMB)
  L.why = detail
  emit(why, id, L)
  return L
end

-- -- requests ----------------------------------------------------------------------------------
-- A queued request is the entry "rid k m s ttl enq phase worker run [pins]" in its policy's FIFO q:<p>
-- (pins: the device ids it is pinned to, comma-separated, in order; none: any devices);
-- heads holds p -> its first entry (a policy with waiting requests has one); req:<rid> holds p,
-- the entry and, once refused, st and why; resv holds rid -> "node shadow" of its reservation
-- (node '*': any nodes, or a pinned request's several).
local function parse(entry, p)
  if not entry then return nil end
  local f, pin = split(entry), nil
  if f[10] then
    pin = {}
    for d in string.gmatch(f[10], '[^,]+') do pin[#pin + 1] = d end
  end
  return {rid = f[1], k = tonumber(f[2]), m = tonumber(f[3]), s = f[4] == '1', ttl = tonumber(f[5]),
          enq = tonumber(f[6]), ph = f[7], w = f[8], r = f[9], pin = pin, p = p, e = entry}
end

local function set_head(p)
  local first = redis.call('LINDEX', key('q:' .. p), 0)
  if first then redis.call('HSET', key('heads'), p, first) else redis.call('HDEL', key('heads'), p) end
  return first
end

local function unqueue(rid, p, entry)
  redis.call('LREM', key('q:' .. p), 1, entry)
  if redis.call('HGET', key('heads'), p) == entry then set_head(p) end
  redis.call('ZREM', key('reqdl'), rid)
  redis.call('HDEL', key('resv'), rid)
end

-- A waiting request lives until its deadline in reqdl, which the replica serving its Acquire pushes
-- forward every sweep (tick); past it, that replica has died and nobody would take the lease: drop it.
-- All of them, unbounded: a pass must never grant one (after a replica with n waiters dies, n entries once).
local function drop_abandoned()
  for _, rid in ipairs(redis.call('ZRANGEBYSCORE', key('reqdl'), '-inf', NOW)) do
    local f = redis.call('HMGET', key('req:' .. rid), 'p', 'e')
    if f[1] then unqueue(rid, f[1], f[2]) else redis.call('ZREM', key('reqdl'), rid) end
    redis.call('DEL', key('req:' .. rid))
  end
end

local function refuse(h, why)
  unqueue(h.rid, h.p, h.e)
  redis.call('HSET', key('req:' .. h.rid), 'st', 'refused', 'why', why)
  redis.call('EXPIRE', key('req:' .. h.rid), TOMB)
  emit('refused', h.rid, {p = h.p, w = h.w, ph = h.ph, r = h.r, why = why})
end
