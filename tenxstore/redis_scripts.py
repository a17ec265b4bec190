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
    "PUT_SCRIPT",
    "PUT_SHA",
    "SCRIPTS",
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


def _sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()  # Redis names scripts so


PUT_SHA, FENCE_SHA, DROP_SHA = _sha(PUT_SCRIPT), _sha(FENCE_SCRIPT), _sha(DROP_SCRIPT)
SCRIPTS = {PUT_SHA: PUT_SCRIPT, FENCE_SHA: FENCE_SCRIPT, DROP_SHA: DROP_SCRIPT}


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
