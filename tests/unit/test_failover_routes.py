"""The pure rules of provider failover (``postlane.worker.routes``)."""

from __future__ import annotations

from datetime import timedelta

from postlane.core.policy import ProviderTraits
from postlane.core.records import Route
from postlane.worker.routes import ProviderRoute, attempted_at, deciding_traits


def test_an_ambiguous_attempt_is_asked_where_it_went() -> None:
    # The route written before the attempt that is now counted (attempts after it: 3).
    assert attempted_at(Route(1, "backup", 3), 3) == "backup"
    # A route of an earlier attempt says nothing about the latest one: the primary's.
    assert attempted_at(Route(1, "backup", 2), 3) is None
    # No route written (a worker without a fallback): the primary's.
    assert attempted_at(None, 3) is None


def test_deduplication_alone_never_retries_an_ambiguous_attempt_with_a_fallback() -> None:
    dedup = ProviderTraits(True, timedelta(days=1), False)
    route = ProviderRoute.__new__(ProviderRoute)
    route.traits = dedup
    assert deciding_traits(route, failover=False) == dedup
    assert deciding_traits(route, failover=True) == ProviderTraits(False, timedelta(days=1),
                                                                   False)
    lookup = ProviderTraits(False, None, True)
    route.traits = lookup
    assert deciding_traits(route, failover=True) == lookup
