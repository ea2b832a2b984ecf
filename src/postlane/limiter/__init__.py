"""The global rate limiter: one ceiling per provider account (contract points 5 and 6).

``open_limiter(None)`` or ``"memory://"`` gives the in-process limiter for the embedded mode;
``"redis://host:port/db"`` the shared one for several processes or hosts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from postlane.errors import ConfigurationError
from postlane.limiter.base import MAX_BATCH, UNLIMITED_RATE, DailyQuota, RateLimiter, Reservation
from postlane.limiter.memory import MemoryLimiter

if TYPE_CHECKING:
    from postlane.limiter.redis import RedisLimiter

__all__ = [
    "MAX_BATCH",
    "UNLIMITED_RATE",
    "DailyQuota",
    "MemoryLimiter",
    "RateLimiter",
    "RedisLimiter",
    "Reservation",
    "open_limiter",
]

_REDIS_SCHEMES = ("redis", "rediss")


def __getattr__(name: str) -> Any:
    """``RedisLimiter`` is imported on first use: redis is an extra (``postlane[redis]``)."""
    if name == "RedisLimiter":
        from postlane.limiter.redis import RedisLimiter

        return RedisLimiter
    raise AttributeError(f"module 'postlane.limiter' has no attribute {name!r}")


def open_limiter(
    url: str | None,
    *,
    rate: float | None,
    burst: int = 1,
    quota: DailyQuota | None = None,
    account: str = "default",
) -> RateLimiter:
    """Build the limiter a URL names. Nothing connects until the first call.

    Every process that passes the same Redis URL and ``account`` shares one ceiling; the
    memory limiter is per process, so use it only when one process sends for the account.
    ``rate=None`` with a ``quota``: a daily quota and no per-second ceiling.
    """
    if url is None:
        return MemoryLimiter(rate=rate, burst=burst, quota=quota)
    if not isinstance(url, str):
        raise ConfigurationError(f"limiter URL must be a string or None, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigurationError(f"cannot parse limiter URL {_redact(url)!r}: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme == "memory":
        if parts.netloc or parts.path or parts.query:
            raise ConfigurationError(
                f"limiter URL {_redact(url)!r}: memory:// takes no host, path or options"
            )
        return MemoryLimiter(rate=rate, burst=burst, quota=quota)
    if scheme in _REDIS_SCHEMES:
        if not parts.hostname:
            raise ConfigurationError(
                f"limiter URL {_redact(url)!r} has no host; expected redis://host:port/db"
            )
        from postlane.limiter.redis import RedisLimiter

        return RedisLimiter.from_url(url, rate=rate, burst=burst, quota=quota,
                                     account=account)
    raise ConfigurationError(
        f"unsupported limiter URL {_redact(url)!r}: use memory:// (one process) or "
        "redis://host:port/db (shared by processes and hosts)"
    )


def _redact(url: str) -> str:
    """The URL without its password, fit for an error message or a log line."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparseable URL>"
    if not password:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
