"""The cache's Lua scripts, the names Redis knows them by, and how they are run.

Three scripts guard every write of the cache (see :mod:`tenxstore.redis_cache`):
:data:`PUT_SCRIPT` stores an entry unless the key holds a newer one or a fence above
it, :data:`FENCE_SCRIPT` puts a fence in place of what is below it, and
:data:`DROP_SCRIPT` deletes an entry but never a fence. :data:`GET_SCRIPT` reads an
entry, and :data:`MASTER_SCRIPT` names the master. They run by ``EVALSHA`` (redis-py's
way); when Redis lost them (a restart, a promoted replica) they are loaded and the call
is sent again.

Every entry names the master that stored it: its replication id (``master_replid``),
which a master gets anew when it starts and when it is promoted. A read serves only an
entry of the master it reads (an entry of another is dropped: a miss), and a put only
lands on the master its caller knew before it read or wrote the database (else it
fences). So a replica promoted without the last writes and fences its old master took
never serves what it holds from before, nor takes a put that a lost fence would have
refused. Both refuse to run on a replica (``READONLY``: redis-py's Sentinel client then
asks the sentinels for the master again).

The name is a prefix in front of the JSON, never a member of it::

    m:<master_replid>:{"__checkpoint_version__":7,"__checkpoint_incarnation__":42,...}

so a process of a release before this one (during a rolling upgrade) never takes it
for a member of the state: the value is not JSON to it, a miss it logs and drops (the
database answers). Its put script does not read the prefixed head either, and may
replace the entry with one of its own, without the prefix: this release serves no
such value (a miss, then a refill through the guarded put), while its guard still
reads that value's version and incarnation, and fences (unchanged: no prefix) are
honoured by both releases.
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
    "GET_SCRIPT",
    "GET_SHA",
    "MASTER_SCRIPT",
    "MASTER_SHA",
    "PUT_SCRIPT",
    "PUT_SHA",
    "SCRIPTS",
    "run_pipeline",
    "run_script",
]

# The scripts read a key's head (entry or fence) the same way. Numbers travel as
# strings and are compared with tonumber (exact below 2**53); a number is never turned
# back into text inside the script (Lua would write 1e+15). An entry's head is the
# master that stored it (``m:`` and a replication id, 40 hex digits, and ``:``; none on
# an entry of an earlier release), its version and its incarnation: under 150 bytes.
# parse returns the incarnation, the version, whether it is a fence, and the master
# (nil: the entry names none).
_PARSE_HEAD = """
local function parse(key)
  local head = redis.call('GETRANGE', key, 0, 255)
  if head == '' then return nil end
  local i, v = string.match(head, '^{"__checkpoint_fence__":%[(%d+),(%d+)%]')
  if i then return i, v, true end
  local tag, at = string.match(head, '^m:(%x+):()')
  if at then head = string.sub(head, at) end
  v, i = string.match(head, '^ ?{"__checkpoint_version__":(%d+),"__checkpoint_incarnation__":(%d+)')
  if v then return i, v, false, tag end
  v = string.match(head, '^ ?{"__checkpoint_version__":(%d+)')
  if v then return '0', v, false, tag end
  return nil
end
local function below(i1, v1, i2, v2)
  local a, b = tonumber(i1), tonumber(i2)
  return a < b or (a == b and tonumber(v1) < tonumber(v2))
end
"""

# The master's identity, read in the script: a master's replication id is new when it
# starts (with or without a dump to load) and when it is promoted, and a replica shares
# its master's. None on a replica. INFO's replication section is its shortest (~350
# bytes) that says both.
_MASTER = """
local NOT_MASTER = 'READONLY tenxstore cache: this Redis is a replica, not the master'
local function master_id()
  local info = redis.call('INFO', 'replication')
  if not string.find(info, 'role:master', 1, true) then return nil end
  return string.match(info, 'master_replid:(%x+)')
end
"""

# KEYS[1] key   ARGV[1] incarnation ('' = unknown: keep the cached one's)   ARGV[2] version
# ARGV[3] ttl in ms (0: none)   ARGV[4] '' or the stdlib mark ' '   ARGV[5] the state's
# members after its '{' (',"a":1}' or '}')   ARGV[6] '1': only replace, never create
# ARGV[7] the master the caller knew before it read or wrote the database ('': none)
# ARGV[8] fence ttl in ms
# Stores 'm:<this master>:' and the entry's JSON. Returns {code, master}: code 1 when
# stored, 0 when the key holds an entry (of any master, or of an earlier release that
# names none) or a fence above it, 2 when the key is empty (or holds an entry that is
# not this master's) and ARGV[6] forbids creating it, 3 when ARGV[7] is not this
# master: what the caller read or wrote may predate a fence the master it knew took and
# this one never got, so it is not stored; a fence at its version is (an entry below it
# is replaced).
PUT_SCRIPT = (
    _PARSE_HEAD
    + _MASTER
    + """
local id = master_id()
if not id then return redis.error_reply(NOT_MASTER) end
local ci, cv, fence, tag = parse(KEYS[1])
if ARGV[7] ~= id then
  local fi, fv = ARGV[1], ARGV[2]
  if fi == '' then fi, fv = '9007199254740991', '0' end
  if not ci or below(ci, cv, fi, fv) then
    redis.call('SET', KEYS[1], '{"__checkpoint_fence__":[' .. fi .. ',' .. fv .. ']}',
      'PX', ARGV[8])
  end
  return {3, id}
end
if ARGV[6] == '1' and (not ci or (not fence and tag ~= id)) then return {2, id} end
local inc = ARGV[1]
if inc == '' then
  if fence then return {0, id} end
  inc = ci or '0'
end
if ci and below(inc, ARGV[2], ci, cv) then return {0, id} end
local value = 'm:' .. id .. ':' .. ARGV[4] .. '{"__checkpoint_version__":' .. ARGV[2]
  .. ',"__checkpoint_incarnation__":' .. inc .. ARGV[5]
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], value)
end
return {1, id}
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


# KEYS[1] key. Returns an entry of this master as it is stored (``m:<master>:`` and
# the JSON: the reader learns the master from it and cuts it off), {master} for a miss
# (no entry, a fence, or an entry of another master: dropped), and {master, value, 0}
# for a value that names no master (written by a release before this one, or not an
# entry at all: the reader drops it). A hit is one bulk string, not an array: the
# client parses one reply, not three (see benchmarks/cache_read.py).
GET_SCRIPT = (
    _MASTER
    + """
local id = master_id()
if not id then return redis.error_reply(NOT_MASTER) end
local value = redis.call('GET', KEYS[1])
if not value then return {id} end
local tag = string.match(value, '^m:(%x+):')
if tag then
  if tag == id then return value end
  redis.call('DEL', KEYS[1])
  return {id}
end
if string.sub(value, 1, 24) == '{"__checkpoint_fence__":' then return {id} end
return {id, value, 0}
"""
)

# KEYS[1] any key (where a cluster routes the call). Returns the master's id.
MASTER_SCRIPT = (
    _MASTER
    + """
local id = master_id()
if not id then return redis.error_reply(NOT_MASTER) end
return id
"""
)


def _sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()  # Redis names scripts so


PUT_SHA, FENCE_SHA, DROP_SHA = _sha(PUT_SCRIPT), _sha(FENCE_SCRIPT), _sha(DROP_SCRIPT)
GET_SHA, MASTER_SHA = _sha(GET_SCRIPT), _sha(MASTER_SCRIPT)
SCRIPTS = {
    PUT_SHA: PUT_SCRIPT,
    FENCE_SHA: FENCE_SCRIPT,
    DROP_SHA: DROP_SCRIPT,
    GET_SHA: GET_SCRIPT,
    MASTER_SHA: MASTER_SCRIPT,
}


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
