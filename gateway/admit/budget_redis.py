"""``RedisBudgetLedger``: session ledgers shared by every gateway replica (see
``gateway.admit.budget`` for the rule). Check-and-reserve is one Lua script on Redis' clock, so
two replicas admitting turns of one session concurrently see each other's reservations.

Per session two hashes under one hash tag (one cluster slot): ``{prefix}{<ledger id>}`` with
``budget_usd`` and ``spent_usd``, and ``…:holds`` with one field per request in flight,
``"<usd>:<expiry ms>"``; expired holds (a crashed gateway) do not count and are dropped at the
next reservation. Both expire ``session_ttl_s`` after the session's last request. USD as
decimal strings.
"""

from __future__ import annotations

from typing import Any

from gateway.admit.budget import BudgetEntry

# KEYS: 1 ledger hash, 2 holds hash. ARGV: 1 budget, 2 estimate, 3 request id, 4 hold ttl ms,
# 5 session ttl s. Returns {admitted (0/1), spent, reserved before this request}.
RESERVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reserved = 0
local holds = redis.call('HGETALL', KEYS[2])
for i = 1, #holds, 2 do
  local usd, exp = string.match(holds[i + 1], '^([^:]+):(%d+)$')
  if usd == nil or tonumber(exp) <= now then
    redis.call('HDEL', KEYS[2], holds[i])
  else
    reserved = reserved + tonumber(usd)
  end
end
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent_usd') or '0')
local budget = tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'budget_usd', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[5])
if spent + reserved >= budget then
  return {0, tostring(spent), tostring(reserved)}
end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[2] .. ':' .. tostring(now + tonumber(ARGV[4])))
redis.call('EXPIRE', KEYS[2], ARGV[5])
return {1, tostring(spent), tostring(reserved)}
"""

# KEYS: 1 ledger hash, 2 holds hash. ARGV: 1 request id, 2 actual cost, 3 session ttl s.
# A ledger deleted meanwhile (its session ended) stays deleted.
SETTLE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
if tonumber(ARGV[2]) ~= 0 then redis.call('HINCRBYFLOAT', KEYS[1], 'spent_usd', ARGV[2]) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


def _num(v: Any) -> float:
    return float(v.decode() if isinstance(v, bytes) else v)


class RedisBudgetLedger:
    """Ledgers in Redis. ``client``: a ``redis.asyncio.Redis`` with short timeouts
    (``from_url``); errors propagate (``SessionBudgets`` applies the fail mode)."""

    def __init__(self, client: Any, *, prefix: str = "speedgate:budget:",
                 reservation_ttl_s: float = 3600.0, session_ttl_s: float = 7 * 24 * 3600.0
                 ) -> None:
        self.client = client
        self.prefix = prefix
        self.hold_ttl_ms = int(reservation_ttl_s * 1000)
        self.session_ttl_s = int(session_ttl_s)
        self._reserve = client.register_script(RESERVE_LUA)
        self._settle = client.register_script(SETTLE_LUA)

    @classmethod
    def from_url(cls, url: str, timeout_s: float, **kwargs: Any) -> RedisBudgetLedger:
        """A ledger store on a new client for ``url`` with ``timeout_s`` socket timeouts."""
        from gateway.common.redis_client import redis_client

        client = redis_client(url, timeout_s=timeout_s, connect_timeout_s=timeout_s)
        return cls(client, **kwargs)

    def keys(self, ledger_id: str) -> list[str]:
        """The two Redis keys of a ledger."""
        base = f"{self.prefix}{{{ledger_id}}}"
        return [base, base + ":holds"]

    async def reserve(self, ledger_id: str, budget_usd: float, estimate_usd: float,
                      request_id: str) -> tuple[bool, BudgetEntry]:
        res = await self._reserve(keys=self.keys(ledger_id), args=[
            repr(budget_usd), repr(estimate_usd), request_id, self.hold_ttl_ms,
            self.session_ttl_s])
        return bool(int(res[0])), BudgetEntry(budget_usd, _num(res[1]), _num(res[2]))

    async def settle(self, ledger_id: str, request_id: str, actual_usd: float) -> None:
        await self._settle(keys=self.keys(ledger_id),
                           args=[request_id, repr(actual_usd), self.session_ttl_s])

    async def read(self, ledger_id: str) -> BudgetEntry | None:
        main, holds_key = self.keys(ledger_id)
        h = await self.client.hgetall(main)
        if not h:
            return None
        vals = {(k.decode() if isinstance(k, bytes) else k): _num(v) for k, v in h.items()}
        holds = await self.client.hgetall(holds_key)
        t = await self.client.time()
        now_ms = int(t[0]) * 1000 + int(t[1]) // 1000
        reserved = 0.0
        for v in holds.values():
            usd, _, exp = (v.decode() if isinstance(v, bytes) else v).partition(":")
            if exp.isdigit() and int(exp) > now_ms:
                reserved += float(usd)
        return BudgetEntry(vals.get("budget_usd", 0.0), vals.get("spent_usd", 0.0), reserved)

    async def delete(self, ledger_id: str) -> None:
        await self.client.delete(*self.keys(ledger_id))

    async def close(self) -> None:
        await self.client.aclose()
