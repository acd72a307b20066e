-- MWRA: the scheduling pass — weighted fair share, aging, reservations and backfill
-- (fairshare.py states the rule). Part of the one script leases.py loads: scheduler.lua, then this,
-- then ops.lua; it uses scheduler.lua's helpers and state and defines pass() for ops.lua.
local F, memo = nil, {mem = {}, nmin = {}, ntotal = {}, resv = {}}

local function members(nd)
  local m = F.members[nd]
  if type(m) == 'string' then
    m = split(m)
    F.members[nd] = m
  end
  return m
end

local function fits_memory(d, m)  -- every device has >= 0 bytes: no lookup for the common m = 0
  if m == 0 then return true end
  local v = memo.mem[d]
  if not v then
    v = num(redis.call('HGET', key('node:' .. node_of(d)), d), 0)
    memo.mem[d] = v
  end
  return v >= m
end

local function node_fits_all(nd, m)  -- every device of nd has >= m bytes
  if m == 0 then return true end
  local v = memo.nmin[nd]
  if not v then
    v = num(redis.call('HGET', key('nodemin'), nd), 0)
    memo.nmin[nd] = v
  end
  return m <= v
end

-- Registered devices of node nd with enough memory for h (free or not).
local function node_capacity(nd, h)
  if node_fits_all(nd, h.m) then
    local v = memo.ntotal[nd]
    if not v then
      v = redis.call('HLEN', key('node:' .. nd))
      memo.ntotal[nd] = v
    end
    return v
  end
  local c = 0
  for _, v in ipairs(redis.call('HVALS', key('node:' .. nd))) do if tonumber(v) >= h.m then c = c + 1 end end
  return c
end

local function estimate(h) return num(state()[h.p .. '|est|' .. h.ph], h.ttl) end

-- Free devices of node nd that h may take: enough memory, not reserved by R.
local function usable(nd, h, R)
  local c = F.n[nd] or 0
  if c == 0 then return 0 end
  if node_fits_all(nd, h.m) and (R == nil or (R.n[nd] or 0) == 0) then return c end
  local u = 0
  for _, d in ipairs(members(nd)) do
    if fits_memory(d, h.m) and not (R and R.d[d]) then u = u + 1 end
  end
  return u
end

-- Up to `want` free devices of node nd for which ok(d) holds, taken out of F.
local function take(nd, want, ok)
  local out, keep = {}, {}
  for _, d in ipairs(members(nd)) do
    if #out < want and ok(d) then out[#out + 1] = d else keep[#keep + 1] = d end
  end
  F.members[nd], F.n[nd], F.total = keep, F.n[nd] - #out, F.total - #out
  return out
end

local function fits(h, R) return function(d) return fits_memory(d, h.m) and not (R and R.d[d]) end end

-- Which of the devices a pinned request names are free (a set).
local function free_pins(h)
  local named, free = {}, {}
  for _, d in ipairs(h.pin) do named[d] = true end
  for nd, _ in pairs(by_node(h.pin)) do
    for _, d in ipairs(members(nd) or {}) do if named[d] then free[d] = true end end
  end
  return free
end

-- A pinned request's devices, in its order, when every one is free and outside R; else nil.
local function pick_pins(h, R)
  local free = free_pins(h)
  for _, d in ipairs(h.pin) do
    if not free[d] or (R and R.d[d]) then return nil end
  end
  for nd, ds in pairs(by_node(h.pin)) do take(nd, #ds, function(d) return free[d] end) end
  return h.pin
end

-- Devices for h outside R, or nil. Pinned: its own. One node: best fit (the fullest node that fits,
-- which keeps large holes for large gangs). Several nodes: fewest nodes (the emptiest first).
local function pick(h, R)
  if h.k > F.total then return nil end
  if h.pin then return pick_pins(h, R) end
  if h.s or h.k == 1 then
    local best, bu = nil, nil
    for nd, c in pairs(F.n) do
      if c >= h.k then
        local u = usable(nd, h, R)
        if u >= h.k and (bu == nil or u < bu or (u == bu and nd < best)) then best, bu = nd, u end
      end
    end
    return best and take(best, h.k, fits(h, R)) or nil
  end
  local list, sum = {}, 0
  for nd, c in pairs(F.n) do
    if c > 0 then
      local u = usable(nd, h, R)
      if u > 0 then list[#list + 1], sum = {nd, u}, sum + u end
    end
  end
  if sum < h.k then return nil end
  table.sort(list, function(a, b) if a[2] ~= b[2] then return a[2] > b[2] end return a[1] < b[1] end)
  local out = {}
  for _, e in ipairs(list) do
    if #out >= h.k then break end
    for _, d in ipairs(take(e[1], h.k - #out, fits(h, R))) do out[#out + 1] = d end
  end
  return out
end

-- A reservation, made for each request in order that does not fit, ahead of the one that does: the
-- free devices it will take are held back, on one node it keeps while it waits and that no request
-- ahead of it has reserved (a request finding none reserves nothing this pass). Its shadow time is
-- when enough busy devices are expected to free up: the (k - reserved)-th smallest expected end
-- (grant + est, kept per node in ends:<node>), never later than it was (resv keeps it), so
-- backfills cannot push it back. R gathers them: R.strict = the earliest shadow; R.shadow = the
-- earliest shadow + SLACK * est of its request, by which a backfill onto reserved devices must end.
local function choose_node(h, R)  -- the node with the most free devices h may use, not reserved yet
  local best, bu = nil, -1
  for n, _ in pairs(F.n) do
    if not R.nodes[n] and node_capacity(n, h) >= h.k then
      local u = usable(n, h, R)
      if u > bu or (u == bu and n < best) then best, bu = n, u end
    end
  end
  if best then return best end
  for _, n in ipairs(redis.call('SMEMBERS', key('nodes'))) do  -- no free device anywhere it fits: any node
    if not R.nodes[n] and node_capacity(n, h) >= h.k then return n end
  end
  return nil
end

-- A pinned request reserves those of its devices that are free and not reserved ahead of it; its shadow
-- is when the last of its leased devices is expected to end (one reserved ahead counts as free now, which
-- only makes backfills more careful). Returns its node ('*': several) and the shadow.
local function reserve_pins(h, R)
  local free, nd, shadow = free_pins(h), node_of(h.pin[1]), NOW
  for _, d in ipairs(h.pin) do
    local n = node_of(d)
    if n ~= nd then nd = '*' end
    if not free[d] then
      shadow = math.max(shadow, num(redis.call('ZSCORE', key('ends:' .. n), d), NOW))
    elseif not R.d[d] then
      R.d[d], R.n[n] = true, (R.n[n] or 0) + 1
    end
  end
  return nd, shadow
end

-- The node a request of k devices reserves on, with the devices it will take there, and its shadow; nil
-- when it finds no node (see above).
local function reserve_node(h, R, m)
  local scope
  if h.s or h.k == 1 then
    if not m.nd or node_capacity(m.nd, h) < h.k or R.nodes[m.nd] then
      m.nd, m.sh, m.ends = choose_node(h, R), nil, nil
      if not m.nd then return nil end
    end
    R.nodes[m.nd] = true
    scope = {m.nd}
  else
    m.nd, scope = '*', redis.call('SMEMBERS', key('nodes'))
  end
  local got = 0
  for _, n in ipairs(scope) do
    if (F.n[n] or 0) > 0 then
      for _, d in ipairs(members(n)) do
        if got < h.k and fits_memory(d, h.m) and not R.d[d] then
          R.d[d], R.n[n], got = true, (R.n[n] or 0) + 1, got + 1
        end
      end
    end
  end
  local need = h.k - got
  if #scope == 1 and h.m == 0 then  -- the need-th smallest expected end on the node, read directly
    local e = need > 0 and redis.call('ZRANGE', key('ends:' .. scope[1]), need - 1, need - 1, 'WITHSCORES') or {}
    return m.nd, e[2] and math.max(NOW, tonumber(e[2])) or NOW
  end
  if not m.ends then  -- expected ends of the busy devices in scope with enough memory, once a pass
    m.ends = {}
    for _, n in ipairs(scope) do
      local e = redis.call('ZRANGE', key('ends:' .. n), 0, -1, 'WITHSCORES')
      for i = 1, #e, 2 do
        if fits_memory(e[i], h.m) then m.ends[#m.ends + 1] = math.max(NOW, tonumber(e[i + 1])) end
      end
    end
    table.sort(m.ends)
  end
  return m.nd, m.ends[need] or NOW
end

local function reserve(h, R)
  local m = memo.resv[h.rid]
  if not m then
    local v = redis.call('HGET', key('resv'), h.rid)
    local f = v and split(v) or {}
    m = {nd = f[1], sh = num(f[2], nil)}
    memo.resv[h.rid] = m
  end
  local old, nd, shadow = {m.nd, m.sh}, nil, nil
  if h.pin then nd, shadow = reserve_pins(h, R) else nd, shadow = reserve_node(h, R, m) end
  if not nd then return false end
  m.nd = nd
  m.sh = (m.sh and math.min(m.sh, shadow)) or shadow
  if m.nd ~= old[1] or m.sh ~= old[2] then redis.call('HSET', key('resv'), h.rid, m.nd .. ' ' .. fmt(m.sh)) end
  R.shadow, R.strict = math.min(R.shadow, m.sh + SLACK * estimate(h)), math.min(R.strict, m.sh)
  return true
end

-- Grant h the devices `devs`: charge vt[p] += k * est / w; h leaves its FIFO; returns its next head.
local function grant(h, devs)
  local tok, est, s = redis.call('INCR', key('fence')), estimate(h), state()
  local wt, x, d = num(s[h.p .. '|wt'], 1), NOW + h.ttl, table.concat(devs, ' ')
  local owners, ends_at = {}, fmt(NOW + est)
  for _, dv in ipairs(devs) do owners[#owners + 1], owners[#owners + 2] = dv, h.rid end
  redis.call('HSET', key('owner'), unpack(owners))
  for nd, ds in pairs(by_node(devs)) do
    set_free(nd, F.members[nd])
    local ends = {}
    for _, dv in ipairs(ds) do ends[#ends + 1], ends[#ends + 2] = ends_at, dv end
    redis.call('ZADD', key('ends:' .. nd), unpack(ends))
  end
  redis.call('HSET', key('lease:' .. h.rid), 'p', h.p, 'w', h.w, 'ph', h.ph, 'r', h.r, 'k', h.k, 'd', d,
    'tok', tok, 'ttl', h.ttl, 'g', NOW, 'x', x, 'est', fmt(est), 'wt', fmt(wt))
  redis.call('ZADD', key('expiry'), x, h.rid)
  put(h.p .. '|held', num(s[h.p .. '|held'], 0) + h.k)
  put(h.p .. '|vt', num(s[h.p .. '|vt'], 0) + h.k * est / wt)
  put(h.p .. '|adv', num(s[h.p .. '|adv'], 0) + h.k * est / wt)
  redis.call('LPOP', key('q:' .. h.p))
  redis.call('DEL', key('req:' .. h.rid))
  redis.call('ZREM', key('reqdl'), h.rid)
  redis.call('HDEL', key('resv'), h.rid)
  emit('granted', h.rid, {p = h.p, w = h.w, ph = h.ph, r = h.r, tok = tok, d = d, x = x})
  return tok, d, x
end

local function pass()
  drop_abandoned()
  local out, heads = {}, {}
  for p, entry in pairs(hash(key('heads'))) do heads[p] = parse(entry, p) end
  if next(heads) == nil then return out end
  F = {n = {}, members = {}, total = 0}  -- the nodes with free devices
  for nd, ids in pairs(hash(key('nfree'))) do
    local _, c = string.gsub(ids, '%S+', '')
    F.members[nd], F.n[nd], F.total = ids, c, F.total + c
  end
  if F.total == 0 then return out end
  local s, active, W = state(), {}, 0
  for p, _ in pairs(heads) do active[p] = true end
  local back = {}  -- the policies expected back (anticipation): {vt, devices} each
  for field, v in pairs(s) do
    local p, what = string.match(field, '^([^|]*)|(%a+)$')
    if p and what == 'held' and tonumber(v) > 0 then active[p] = true end
    if p and what == 'back' and tonumber(v) > NOW and not heads[p] then
      active[p], back[p] = true, num(s[p .. '|backk'], 1)
    end
  end
  for p, _ in pairs(active) do W = W + num(s[p .. '|wt'], 1) end
  local D = redis.call('HLEN', key('dev'))
  -- aging: a second of waiting is worth the virtual time a fair share of the devices earns in a second
  local rate = AGING * D / W
  local rids = {}
  for _, h in pairs(heads) do rids[#rids + 1] = h.rid end
  for i, v in ipairs(redis.call('HMGET', key('resv'), unpack(rids))) do  -- the reservations kept
    if v then
      local f = split(v)
      memo.resv[rids[i]] = {nd = f[1], sh = tonumber(f[2])}
    end
  end
  local function over(p) return num(s[p .. '|held'], 0) >= D * num(s[p .. '|wt'], 1) / W end
  while #out / 7 < LIMIT and F.total > 0 do
    local order = {}
    for p, h in pairs(heads) do
      h.key = num(s[p .. '|vt'], 0) - rate * (NOW - h.enq)
      order[#order + 1] = h
    end
    table.sort(order, function(a, b)
      if a.key ~= b.key then return a.key < b.key end
      if a.enq ~= b.enq then return a.enq < b.enq end
      return a.rid < b.rid
    end)
    -- R: the reservations of the requests ahead that do not fit. A request of a policy at or over its
    -- fair share behind a waiting one of a policy under it only backfills (ends by R.shadow).
    local R, got, h, under_waits = {d = {}, n = {}, nodes = {}, shadow = math.huge, strict = math.huge}, nil, nil, false
    for _, c in ipairs(order) do
      h = c
      local ends, kept = NOW + estimate(h), 0
      for p, k in pairs(back) do  -- devices kept for the policies expected back that come before h
        if num(s[p .. '|vt'], 0) < h.key then kept = kept + k end
      end
      if F.total - h.k >= kept then  -- else h waits, as one that does not fit
        if not (under_waits and over(h.p)) or ends <= R.strict then got = pick(h, R) end
        if not got and next(R.d) and ends <= R.shadow then got = pick(h, nil) end
        if got then break end
      end
      under_waits = under_waits or not over(h.p)
      if not reserve(h, R) and not over(h.p) then R.shadow, R.strict = math.min(R.shadow, NOW), NOW end
    end
    if not got then break end
    local tok, d, x = grant(h, got)
    for _, v in ipairs({h.rid, tok, d, x, h.p, h.w, h.ph}) do out[#out + 1] = v end
    heads[h.p] = parse(set_head(h.p), h.p)
  end
  return out
end
