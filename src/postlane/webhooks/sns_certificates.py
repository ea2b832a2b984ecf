"""Amazon SNS signing certificates: fetched without blocking, bounded in time, cached.

SES events arrive as SNS notifications signed with a certificate whose URL the message
names. The URL is checked strictly before anything is fetched (``check_cert_url``: https,
``sns.<region>.amazonaws.com`` exactly, a ``.pem`` path), then fetched with
``httpx.AsyncClient`` under a timeout, and kept for a day: SNS signs with a handful of
certificates, so nearly every notification is verified without a request.

A fetch that fails for reasons of the network or of Amazon (connect error, timeout, 5xx)
raises ``CertificateUnavailable``, which the API answers with 503 so that SNS retries
later; a certificate that is missing (4xx), too large or not a certificate is a
``WebhookRejected`` (401). Neither is ever a 500.

``base_url`` exists for tests only: it fetches the certificate's path from a local
stand-in instead of the Amazon host, after the message's URL has passed the same strict
check. It is a constructor argument and nothing else: no option, variable or file of the
app sets it (``create_app`` builds the default one).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from urllib.parse import urlsplit

import httpx

from postlane.errors import PostlaneError
from postlane.webhooks.signatures import WebhookRejected, check_cert_url

MAX_CERT_BYTES = 64 * 1024


class CertificateUnavailable(PostlaneError):
    """The signing certificate could not be fetched now (network, timeout, 5xx): the
    notification is neither accepted nor rejected; SNS delivers it again later."""


class SnsCertificates:
    def __init__(self, *, timeout_s: float = 5.0, ttl_s: float = 24 * 3600,
                 max_entries: int = 32, base_url: str | None = None) -> None:
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._base_url = base_url.rstrip("/") if base_url else None
        self._cache: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self.fetches = 0
        """Requests made (for tests and curiosity: the cache should keep this small)."""

    async def get(self, url: str) -> bytes:
        """The PEM certificate at ``url`` (checked by ``check_cert_url`` first)."""
        check_cert_url(url)
        cached = self._fresh(url)
        if cached is not None:
            return cached
        lock = self._locks.setdefault(url, asyncio.Lock())
        async with lock:  # one fetch per URL at a time; the others take its result
            cached = self._fresh(url)
            if cached is not None:
                return cached
            pem = await self._fetch(url)
            self._cache[url] = (time.monotonic(), pem)
            self._cache.move_to_end(url)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        self._locks.pop(url, None)
        return pem

    def _fresh(self, url: str) -> bytes | None:
        entry = self._cache.get(url)
        if entry is None or time.monotonic() - entry[0] > self.ttl_s:
            return None
        return entry[1]

    async def _fetch(self, url: str) -> bytes:
        target = url if self._base_url is None else self._base_url + urlsplit(url).path
        self.fetches += 1
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False,
                                         trust_env=False) as client, \
                    client.stream("GET", target) as response:
                if response.status_code >= 500:
                    raise CertificateUnavailable(
                        f"the SNS certificate host answered {response.status_code}")
                if response.status_code != 200:
                    raise WebhookRejected(
                        f"no SNS certificate at SigningCertURL ({response.status_code})")
                body = b""
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_CERT_BYTES:
                        raise WebhookRejected("the SNS certificate is implausibly large")
        except httpx.HTTPError as exc:
            raise CertificateUnavailable(
                f"cannot fetch the SNS certificate: {type(exc).__name__}") from None
        if b"-----BEGIN CERTIFICATE-----" not in body:
            raise WebhookRejected("SigningCertURL did not return a PEM certificate")
        return body
