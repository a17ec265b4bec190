"""The cache's Lua scripts, the names Redis knows them by, and how they are run.

Three scripts guard every write of the cache (see :mod:`tenxstore.redis_cache`):
:data:`PUT_SCRIPT` stores an entry unless the key holds a newer one or a fence above
it, :data:`FENCE_SCRIPT` puts a fence in place of what is below it, and
:data:`DROP_SCRIPT` deletes an entry but never a fence. They run by ``EVALSHA``
(redis-py's way); when Redis lost them (a restart) they are loaded and the call is
sent again.
"""

from __future__ import annotations

import hashlib
from typing import Any

from redis.exceptions import NoScriptError

__all__ = [
    "DROP_SCRIPT",
    "DROP_SHA",
    "FENCE_SCRIPT",
    "FENCE_SHA",
    "LG_ADVANCE_SCRIPT",
    "LG_PUT_SCRIPT",
    "LG_READ_SCRIPT",
    "LG_WRITES_SCRIPT",
    "PUT_SCRIPT",
    "PUT_SHA",
    "SCRIPTS",
    "run_keys",
    "run_pipeline",
    "run_script",
]

# Both scripts read a key's head (entry or fence) the same way. Numbers travel as
# strings and are compared with tonumber (exact below 2**53); a number is never turned
# back into text inside the script (Lua would write 1e+15).
_PARSE_HEAD = """
local function parse(key)
  local head = redis.call('GETRANGE', key, 0, 127)
  if head == '' then return nil end
  local i, v = string.match(head, '^{"__checkpoint_fence__":%[(%d+),(%d+)%]')
  if i then return i, v, true end
  v, i = string.match(head, '^ ?{"__checkpoint_version__":(%d+),"__checkpoint_incarnation__":(%d+)')
  if v then return i, v, false end
  v = string.match(head, '^ ?{"__checkpoint_version__":(%d+)')
  if v then return '0', v, false end
  return nil
end
local function below(i1, v1, i2, v2)
  local a, b = tonumber(i1), tonumber(i2)
  return a < b or (a == b and tonumber(v1) < tonumber(v2))
end
"""

# KEYS[1] key   ARGV[1] incarnation ('' = unknown: keep the cached one's)   ARGV[2] version
# ARGV[3] ttl in ms (0: none)   ARGV[4] '' or the stdlib mark ' '   ARGV[5] the state's
# members after its '{' (',"a":1}' or '}')   ARGV[6] '1': only replace, never create
# Returns 1 when stored, 0 when the key holds an entry or a fence above it, 2 when the
# key is empty and ARGV[6] forbids creating it.
PUT_SCRIPT = (
    _PARSE_HEAD
    + """
local ci, cv, fence = parse(KEYS[1])
if ARGV[6] == '1' and not ci then return 2 end
local inc = ARGV[1]
if inc == '' then
  if fence then return 0 end
  inc = ci or '0'
end
if ci and below(inc, ARGV[2], ci, cv) then return 0 end
local value = ARGV[4] .. '{"__checkpoint_version__":' .. ARGV[2]
  .. ',"__checkpoint_incarnation__":' .. inc .. ARGV[5]
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], value)
end
return 1
"""
)

# KEYS[1] key   ARGV[1] incarnation   ARGV[2] version   ARGV[3] fence ttl in ms
# Replaces what the key holds with a fence at (ARGV[1], ARGV[2]) unless it already holds
# an entry or a fence at or above it. Returns 1 when fenced.
FENCE_SCRIPT = (
    _PARSE_HEAD
    + """
local ci, cv = parse(KEYS[1])
if ci and not below(ci, cv, ARGV[1], ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], '{"__checkpoint_fence__":[' .. ARGV[1] .. ',' .. ARGV[2] .. ']}',
  'PX', ARGV[3])
return 1
"""
)


# KEYS[1] key. Deletes an entry (or anything else) but never a fence: a fence is
# dropped only by its expiry or replaced by something above it. Returns 1 when deleted.
DROP_SCRIPT = (
    _PARSE_HEAD
    + """
local _, _, fence = parse(KEYS[1])
if fence then return 0 end
return redis.call('DEL', KEYS[1])
"""
)


# The LangGraph head cache (see :mod:`tenxstore.cache_langgraph`). KEYS[1] is a head
# entry, KEYS[2] its thread's epoch (one hash slot: the thread is the keys' hash tag).
# An entry is its epoch token (16 characters), the checkpoint id's length in bytes (4
# digits), the checkpoint id, its pending writes' count (8 digits), then the body. An
# entry whose token is not the epoch's is a miss; every write of the thread gives the
# epoch a new token. Checkpoint ids are compared byte by byte (Lua's own comparison
# follows the server's locale).
_LG_HEAD = """
local function px(ms)
  if tonumber(ms) > 0 then return {'PX', ms} end
  return {}
end
local function newer(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end
-- whether key holds a head of epoch e at or past checkpoint cid with w writes
local function holds(key, e, cid, w)
  local head = redis.call('GETRANGE', key, 0, 1051)
  if string.sub(head, 1, 16) ~= e or #head < 28 then return false end
  local n = tonumber(string.sub(head, 17, 20))
  local c = string.sub(head, 21, 20 + n)
  return newer(c, cid) or (c == cid and tonumber(string.sub(head, 21 + n, 28 + n)) >= w)
end
"""

# ARGV[1] a fresh token, ARGV[2] epoch ttl ms. Returns {entry or '', epoch}: the entry
# only when its token is the epoch's. A thread without an epoch (never written through
# the cache, or its epoch expired or evicted) gets ARGV[1] as its epoch, before the
# reader reads the database: the lease its refill is put under.
LG_READ_SCRIPT = (
    _LG_HEAD
    + """
local e = redis.call('GET', KEYS[2])
if not e then
  redis.call('SET', KEYS[2], ARGV[1], unpack(px(ARGV[2])))
  return {'', ARGV[1]}
end
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 16) == e then return {v, e} end
return {'', e}
"""
)

# A refill. ARGV[1] the epoch its reader saw (LG_READ_SCRIPT made one if there was
# none), ARGV[2] checkpoint id, ARGV[3] writes count, ARGV[4] the entry after its
# token, ARGV[5] entry ttl ms. Stored (1) only while the epoch is the one its reader
# saw, and unless the key holds a later head of that epoch (a later checkpoint, or more
# writes of the same one). A refill never makes an epoch: with none (expired, evicted,
# flushed since the read) writes may have committed since, whose new epoch is gone.
LG_PUT_SCRIPT = (
    _LG_HEAD
    + """
local e = redis.call('GET', KEYS[2])
if not e or e ~= ARGV[1] then return 0 end
if holds(KEYS[1], e, ARGV[2], tonumber(ARGV[3])) then return 0 end
redis.call('SET', KEYS[1], e .. ARGV[4], unpack(px(ARGV[5])))
return 1
"""
)

# A put of the thread, after it committed. ARGV[1] the epoch seen before the put ('':
# none), ARGV[2] a new token, ARGV[3] the new head's entry after its token ('': none),
# ARGV[4] entry ttl ms, ARGV[5] epoch ttl ms, ARGV[6] its checkpoint id. An epoch's
# first 8 characters change with every write but the puts that store their head: the
# entry is stored (1) only when they are those of ARGV[1] (no delete, prune, copy or
# unstored put since it was read), and the key holds no head of the epoch at or past
# it (a later put's, or writes of that very checkpoint that landed first, see
# LG_WRITES_SCRIPT). The epoch always gets a new token: every other entry of the
# thread is a miss from here on.
LG_ADVANCE_SCRIPT = (
    _LG_HEAD
    + """
local e = redis.call('GET', KEYS[2])
local new = ARGV[2]
local same
if e then
  same = ARGV[1] ~= '' and string.sub(e, 1, 8) == string.sub(ARGV[1], 1, 8)
else
  same = ARGV[1] == ''
end
local store = ARGV[3] ~= '' and same and not (e and holds(KEYS[1], e, ARGV[6], 0))
if store and e then new = string.sub(e, 1, 8) .. string.sub(ARGV[2], 9, 16) end
redis.call('SET', KEYS[2], new, unpack(px(ARGV[5])))
if not store then return 0 end
redis.call('SET', KEYS[1], new .. ARGV[3], unpack(px(ARGV[4])))
return 1
"""
)

# A task's writes of checkpoint ARGV[1], after they committed. KEYS[1..n-1] the heads
# of its namespace (each reader's), KEYS[n] the epoch; ARGV[2] a fresh token (the
# epoch's, when there was none), ARGV[3] epoch ttl ms, ARGV[4] entry ttl ms. A key that
# holds no later checkpoint of the epoch gets a tombstone of ARGV[1] with every writes'
# count (a miss, that no refill or put of that checkpoint can replace under this
# epoch: they may have read it without these writes); the epoch stays, so the puts and
# heads of other checkpoints are not disturbed.
LG_WRITES_SCRIPT = (
    _LG_HEAD
    + """
local ek = KEYS[#KEYS]
local e = redis.call('GET', ek)
if not e then
  e = ARGV[2]
  redis.call('SET', ek, e, unpack(px(ARGV[3])))
end
for i = 1, #KEYS - 1 do
  local head = redis.call('GETRANGE', KEYS[i], 0, 1051)
  local keep = false
  if string.sub(head, 1, 16) == e and #head >= 28 then
    local n = tonumber(string.sub(head, 17, 20))
    keep = newer(string.sub(head, 21, 20 + n), ARGV[1])
  end
  if not keep then
    redis.call('SET', KEYS[i], e .. string.format('%04d', #ARGV[1]) .. ARGV[1] .. '99999999',
      unpack(px(ARGV[4])))
  end
end
return 1
"""
)


def _sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()  # Redis names scripts so


PUT_SHA, FENCE_SHA, DROP_SHA = _sha(PUT_SCRIPT), _sha(FENCE_SCRIPT), _sha(DROP_SCRIPT)
SCRIPTS = {PUT_SHA: PUT_SCRIPT, FENCE_SHA: FENCE_SCRIPT, DROP_SHA: DROP_SCRIPT}


async def run_keys(client: Any, script: str, keys: list[str], args: list[Any]) -> Any:
    """EVALSHA of ``script`` on several keys (one hash slot), loading it when Redis
    lost it (a restart)."""
    sha = _sha(script)
    try:
        return await client.evalsha(sha, len(keys), *keys, *args)
    except NoScriptError:
        await client.script_load(script)
        return await client.evalsha(sha, len(keys), *keys, *args)


async def run_script(client: Any, sha: str, script: str, key: str, args: list[Any]) -> Any:
    """EVALSHA, loading the script when Redis lost it (a restart)."""
    try:
        return await client.evalsha(sha, 1, key, *args)
    except NoScriptError:
        await client.script_load(script)
        return await client.evalsha(sha, 1, key, *args)


async def run_pipeline(client: Any, calls: list[tuple[str, str, list[Any]]]) -> list[Any]:
    """(sha, key, args) script calls in one pipeline; the scripts are loaded and the
    pipeline sent again when Redis lost them (a restart). The first failure is
    raised."""

    async def send() -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for sha, key, args in calls:
            pipe.evalsha(sha, 1, key, *args)
        done: list[Any] = await pipe.execute(raise_on_error=False)
        return done

    results = await send()
    if any(isinstance(r, NoScriptError) for r in results):
        for script in SCRIPTS.values():
            await client.script_load(script)
        results = await send()
    for failure in results:
        if isinstance(failure, Exception):
            raise failure
    return results
