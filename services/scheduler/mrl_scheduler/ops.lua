-- MWRA: the ops of the scheduler script (after scheduler.lua and fairshare.lua): each reads its
-- arguments from ARGV[A..] and returns {status list, grants}.
if OP == 'register' then
  -- ARGV[A] = node, then (device id, index, memory bytes, kind) per device: the node's whole set.
  local nd = ARGV[A]
  local nk, new, revoke, gone, nrevoked, lowest = key('node:' .. nd), {}, {}, {}, 0, nil
  local old = hash(nk)
  for i = A + 1, #ARGV, 4 do new[ARGV[i]] = {ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]} end
  for d, _ in pairs(old) do
    if not new[d] then
      gone[d] = true
      redis.call('HDEL', key('dev'), d)
      redis.call('HDEL', nk, d)
      local o = redis.call('HGET', key('owner'), d)
      if o then revoke[o] = d end
    end
  end
  local free = {}
  for d, spec in pairs(new) do
    if not redis.call('HGET', key('owner'), d) then free[#free + 1] = d end
    redis.call('HSET', key('dev'), d, nd .. ' ' .. spec[1] .. ' ' .. spec[2] .. ' ' .. spec[3])
    redis.call('HSET', nk, d, spec[2])
    if lowest == nil or tonumber(spec[2]) < lowest then lowest = tonumber(spec[2]) end
  end
  set_free(nd, free)
  if lowest == nil then
    redis.call('SREM', key('nodes'), nd)
    redis.call('HDEL', key('nodemin'), nd)
  else
    redis.call('SADD', key('nodes'), nd)
    redis.call('HSET', key('nodemin'), nd, fmt(lowest))
  end
  for o, d in pairs(revoke) do
    if end_lease(o, 'revoked', 'device ' .. d .. ' left the inventory', gone) then nrevoked = nrevoked + 1 end
  end
  recompute_capacity()
  local nrefused = 0  -- waiting requests no inventory can satisfy any more
  for p, _ in pairs(hash(key('heads'))) do
    for _, entry in ipairs(redis.call('LRANGE', key('q:' .. p), 0, -1)) do
      local h = parse(entry, p)
      local ok, why = possible(h)
      if not ok then
        refuse(h, why)
        nrefused = nrefused + 1
      end
    end
  end
  return finish({{'ok', nrevoked, nrefused}, pass()})

elseif OP == 'submit' then
  -- ARGV[A..]: rid, policy, worker, phase, run, devices, min memory, same node (0/1), ttl ms,
  -- liveness ms (the request is dropped that long after now unless a tick keeps it alive), weight,
  -- most queued, most queued of one policy, pinned device ids (comma-separated; '': none)
  local rid, p = ARGV[A], ARGV[A + 1]
  local fields = {rid, ARGV[A + 5], ARGV[A + 6], ARGV[A + 7], ARGV[A + 8], NOW, ARGV[A + 3], ARGV[A + 2], ARGV[A + 4]}
  if ARGV[A + 13] ~= '' then fields[10] = ARGV[A + 13] end
  local entry = table.concat(fields, ' ')
  local ok, why = possible(parse(entry, p))
  if not ok then return {{'impossible', why}, {}} end
  drop_abandoned()   -- requests nobody keeps alive do not count against the queue caps
  if redis.call('ZCARD', key('reqdl')) >= tonumber(ARGV[A + 11]) then return {{'full'}, {}} end
  if redis.call('LLEN', key('q:' .. p)) >= tonumber(ARGV[A + 12]) then return {{'full_policy'}, {}} end
  if redis.call('EXISTS', key('req:' .. rid), key('lease:' .. rid), key('ended:' .. rid)) > 0 then
    return {{'duplicate'}, {}}
  end
  local head, s = redis.call('HGET', key('heads'), p), nil
  local ps = redis.call('HMGET', key('pstate'), p .. '|held', p .. '|back')
  if num(ps[2], 0) > 0 then put(p .. '|back', 0) end  -- back (anticipation ends)
  if not head and num(ps[1], 0) <= 0 and num(ps[2], 0) <= NOW then
    local heads = hash(key('heads'))
    s = state()
    -- a policy becoming active starts no earlier than the least-served active one (no banked
    -- credit), measured by what they have used: vt less the advance charges of their live leases
    local floor, settled = nil, function(q) return num(s[q .. '|vt'], 0) - num(s[q .. '|adv'], 0) end
    for q, _ in pairs(heads) do
      if floor == nil or settled(q) < floor then floor = settled(q) end
    end
    for field, c in pairs(s) do  -- active: holding devices, or released them and expected back
      local q, what = string.match(field, '^([^|]*)|(%a+)$')
      if q and q ~= p and ((what == 'held' and tonumber(c) > 0) or (what == 'back' and tonumber(c) > NOW)) and
          (floor == nil or settled(q) < floor) then floor = settled(q) end
    end
    if floor and floor > num(s[p .. '|vt'], 0) then put(p .. '|vt', floor) end
  end
  local wt = s and s[p .. '|wt'] or redis.call('HGET', key('pstate'), p .. '|wt')
  if num(wt, nil) ~= tonumber(ARGV[A + 10]) then put(p .. '|wt', ARGV[A + 10]) end
  redis.call('HSET', key('req:' .. rid), 'p', p, 'e', entry)
  redis.call('RPUSH', key('q:' .. p), entry)
  redis.call('ZADD', key('reqdl'), NOW + tonumber(ARGV[A + 9]), rid)
  if head then  -- it waits behind its policy's first request: nothing a pass could grant has changed
    return finish({{'ok', NOW}, {}})
  end
  redis.call('HSET', key('heads'), p, entry)
  return finish({{'ok', NOW}, pass()})

elseif OP == 'cancel' then
  -- ARGV[A] = rid: withdraw it if it still waits
  local rid = ARGV[A]
  local L = redis.call('HMGET', key('lease:' .. rid), 'tok', 'd', 'x', 'p', 'w', 'ph')
  if L[1] then return {{'granted', rid, L[1], L[2], L[3], L[4], L[5], L[6]}, {}} end
  local f = redis.call('HMGET', key('req:' .. rid), 'p', 'e', 'st', 'why')
  if f[3] == 'refused' then
    redis.call('DEL', key('req:' .. rid))
    return {{'refused', f[4]}, {}}
  end
  if not f[1] then
    local e = tombstone(rid)
    return {{'gone', e and e[2] or ''}, {}}
  end
  unqueue(rid, f[1], f[2])
  redis.call('DEL', key('req:' .. rid))
  return finish({{'cancelled'}, pass()})

elseif EXPIRED_RENEWAL then
  end_lease(ARGV[A], 'expired', 'not renewed before it expired')
  return finish({{'lost', 'expired', 'not renewed before it expired'}, pass()})

elseif OP == 'release' then
  -- ARGV[A..] = lease id, fencing token ('' = forced by an admin: revoked), detail
  local id, tok = ARGV[A], ARGV[A + 1]
  local f = redis.call('HMGET', key('lease:' .. id), 'tok', 'x')
  if not f[1] then
    local e = tombstone(id)
    if not e then return {{'unknown'}, {}} end
    if tok ~= '' and e[1] ~= tok then return {{'stale', e[1]}, {}} end
    return {{'already', e[2]}, {}}
  end
  if tok ~= '' and f[1] ~= tok then return {{'stale', f[1]}, {}} end
  if tok ~= '' and tonumber(f[2]) <= NOW then
    end_lease(id, 'expired', 'not renewed before it expired')
    return finish({{'already', 'expired'}, pass()})
  end
  end_lease(id, tok == '' and 'revoked' or 'released', ARGV[A + 2])
  return finish({{'released'}, pass()})

elseif OP == 'tick' then
  -- ARGV[A] = liveness ms, then the requests this replica's Acquires wait on: alive until now + liveness.
  -- Sweep leases past their expiry (the pass drops the requests nobody kept alive); trim the event stream.
  local alive = NOW + tonumber(ARGV[A])
  for i = A + 1, #ARGV do redis.call('ZADD', key('reqdl'), 'XX', alive, ARGV[i]) end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', key('expiry'), '-inf', NOW, 'LIMIT', 0, 256)) do
    end_lease(id, 'expired', 'not renewed before it expired')
  end
  redis.call('XTRIM', key('events'), 'MAXLEN', '~', MAXLEN)
  local out, free = pass(), 0
  for _, ids in ipairs(redis.call('HVALS', key('nfree'))) do
    local _, c = string.gsub(ids, '%S+', '')
    free = free + c
  end
  return finish({{'ok', redis.call('HLEN', key('dev')), free, redis.call('ZCARD', key('expiry')),
                  redis.call('ZCARD', key('reqdl'))}, out})
end
return redis.error_reply('unknown op ' .. tostring(OP))
