"""What a backend tries again, how often, and how long it waits first: one value.

Only work that provably never took effect is tried again, and only a few kinds of it:

* a connection that broke while it was being opened (nothing of the call was sent);
* a statement, or a ``BEGIN``, that the driver refused to send because its pooled
  connection had been found closed (a restarted server, a killed backend);
* a read whose connection broke mid-statement (reads are idempotent).

A write that reached the server is never sent again: its outcome is the caller's to
decide (``ConnectionLost`` says whether it committed). Which failures are which is each
backend's to say (it knows its driver); how often and how long is this policy's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from .. import telemetry
from ..errors import ConfigError
from ..validate import is_int

__all__ = ["RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """How a backend retries what never took effect (see the module's docstring).

    Args:
        attempts: Tries in all, the first included (1: never try again). Default 2:
            a dead pooled connection costs one more try on a fresh one.
        backoff: Seconds before the second try; each later one waits twice as long as
            the one before, up to ``max_backoff``. Default 0: a dead connection is
            replaced at once (the pool's other connections are checked on checkout).
        max_backoff: The longest wait between two tries.

    Raises:
        ConfigError: ``attempts`` below 1, or a negative or non-numeric wait.
    """

    attempts: int = 2
    backoff: float = 0.0
    max_backoff: float = 1.0

    def __post_init__(self) -> None:
        if not is_int(self.attempts) or self.attempts < 1:
            raise ConfigError(
                f"RetryPolicy.attempts must be an int of at least 1, not {self.attempts!r}"
            )
        for name in ("backoff", "max_backoff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(
                    f"RetryPolicy.{name} must be a number of seconds >= 0, not {value!r}"
                )

    def tries(self) -> Iterator[int]:
        """The numbers of the tries, 1 to ``attempts``."""
        return iter(range(1, self.attempts + 1))

    def last(self, attempt: int) -> bool:
        """Whether ``attempt`` is the last try."""
        return attempt >= self.attempts

    def delay(self, attempt: int) -> float:
        """Seconds to wait after try ``attempt`` failed, before the next."""
        if self.backoff <= 0:
            return 0.0
        return float(min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))

    async def again(self, attempt: int, log: logging.Logger, backend: str, why: str) -> bool:
        """After try ``attempt`` failed in a way that may be retried: False on the last
        try (raise), else count and log the retry, wait its delay and return True."""
        if self.last(attempt):
            return False
        telemetry.retried(log, backend, why)
        wait = self.delay(attempt)
        if wait:
            await asyncio.sleep(wait)
        return True
