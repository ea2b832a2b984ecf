"""Provider failover: a worker's ordered list of providers, each with its own ceiling,
limiter key and breaker.

A batch is sent through the first provider whose breaker lets it claim: the primary while
its breaker is closed (or this worker holds its probe), else the next. What goes to the next
provider is only ever a delivery that *certainly* did not reach the one before: a send that
failed before its point of no return, an account-level refusal, or a delivery never tried
there. An ambiguous attempt stays put until reconciled at the provider it went to (the same
key at two providers would be two emails), so each attempt's provider is written down
before it leaves (``postlane_delivery_routes``); one that was settled by that provider's
deduplication is *pinned* there for good. When the primary's probe succeeds its breaker
closes, and new batches go back to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from postlane.core.policy import ProviderTraits
from postlane.core.records import Route
from postlane.limiter.base import RateLimiter
from postlane.providers.base import Provider
from postlane.worker.breaker import FleetBreaker
from postlane.worker.pacer import Pacer


@dataclass(eq=False)
class ProviderRoute:
    """One provider of the worker's list and the fleet state that goes with it."""

    provider: Provider
    limiter: RateLimiter | None
    breaker: FleetBreaker
    pacer: Pacer
    traits: ProviderTraits
    position: int
    """0 for the primary, 1 for the first fallback..."""

    @property
    def name(self) -> str:
        """The provider account: the limiter key, the breaker's name and what the timeline,
        the dead letters and the ``provider`` metric label say."""
        return self.provider.account

    @property
    def closed(self) -> bool:
        """The breaker lets sends through (as far as this worker last read it)."""
        return self.breaker.state == "closed"


def traits_of(provider: Provider) -> ProviderTraits:
    caps = provider.capabilities
    return ProviderTraits(caps.deduplicates_by_key, caps.dedup_window, caps.can_lookup_by_key)


def deciding_traits(route: ProviderRoute, failover: bool) -> ProviderTraits:
    """The traits ``decide`` sees. With a fallback, an ambiguous attempt is never retried
    straight away on the strength of the provider's deduplication: it goes through the
    reconciler, which pins it to that provider first (a plain retry could be claimed into a
    batch for another provider)."""
    if not failover or not route.traits.deduplicates_by_key:
        return route.traits
    return ProviderTraits(False, route.traits.dedup_window, route.traits.can_lookup_by_key)


def attempted_at(route: Route | None, attempts: int) -> str | None:
    """The provider an ambiguous delivery's latest attempt (``attempts``, counted) went to,
    if it was recorded; None: the primary (workers without a fallback record nothing)."""
    if route is None or route.attempt != attempts:
        return None
    return route.provider
