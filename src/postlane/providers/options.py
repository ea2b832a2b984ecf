"""Provider URLs: the one way an adapter is configured, and where secrets are kept out of sight.

``smtp://user:pass@host:587?starttls=1&pool=4`` -- scheme, host, credentials, and options in
the query. Every adapter reads its options through ``ProviderURL`` so that an unknown option
is an error (a typo never silently falls back to a default), numbers are checked, and a
secret is held in a ``Secret``: it prints as ``***`` in a repr, a log line or an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

from postlane.core.redaction import redact_url
from postlane.errors import ConfigurationError

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class Secret:
    """A credential. ``str()``/``repr()`` never show it; ``reveal()`` does, on purpose."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def secret(url_value: str | None, env_name: str) -> Secret | None:
    """The secret from the URL if it has one, else from the environment variable."""
    value = url_value if url_value else os.environ.get(env_name)
    return Secret(value) if value else None


@dataclass
class ProviderURL:
    """A parsed provider URL whose options are consumed one by one, then checked for leftovers."""

    scheme: str
    host: str
    port: int | None
    username: str | None
    password: str | None
    path: str
    options: dict[str, str] = field(default_factory=dict)
    redacted: str = ""
    """The URL as it may be printed: the password replaced by ``***``."""

    @classmethod
    def parse(cls, url: str) -> ProviderURL:
        redacted = redact_url(url)
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ConfigurationError(f"bad provider URL {redacted!r}: {exc}") from None
        options = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        return cls(
            scheme=parts.scheme,
            host=parts.hostname or "",
            port=port,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            path=parts.path,
            options=options,
            redacted=redacted,
        )

    # -- reading options -------------------------------------------------------------------
    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.options.pop(name, None)
        return default if value is None or value == "" else value

    def number(self, name: str, default: float, *, minimum: float = 0.0) -> float:
        raw = self.options.pop(name, None)
        if raw is None or raw == "":
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ConfigurationError(
                f"{self.scheme}:// option {name}={raw!r} is not a number") from None
        if value != value or value < minimum:
            raise ConfigurationError(f"{self.scheme}:// option {name} must be >= {minimum:g}")
        return value

    def integer(self, name: str, default: int, *, minimum: int = 1) -> int:
        value = self.number(name, float(default), minimum=minimum)
        if value != int(value):
            raise ConfigurationError(f"{self.scheme}:// option {name} must be a whole number")
        return int(value)

    def flag(self, name: str, default: bool | None) -> bool | None:
        raw = self.options.pop(name, None)
        if raw is None or raw == "":
            return default
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ConfigurationError(f"{self.scheme}:// option {name}={raw!r} is not 0 or 1")

    def finish(self) -> None:
        """Refuse options nobody read: a misspelt option must not pass unnoticed."""
        if self.options:
            raise ConfigurationError(
                f"unknown option(s) {sorted(self.options)} in {self.redacted!r}"
            )
