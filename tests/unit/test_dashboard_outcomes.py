"""The throughput page's arithmetic: minutes into ten-minute buckets over 24 hours, sent as a
rate per second, the rest as counts, every lane and series present."""

from __future__ import annotations

from postlane.core.records import OUTCOME_SERIES, OutcomeMinute
from postlane.dashboard.charts import per_second
from postlane.dashboard.fleet import BUCKET_S, WINDOW, outcome_charts

NOW = 1_800_000_000.0  # a multiple of 600: buckets start on it


def test_minutes_fall_into_buckets_and_totals() -> None:
    minutes = [
        OutcomeMinute(int(NOW) - 3600, "bulk", "sent", 600),
        OutcomeMinute(int(NOW) - 3540, "bulk", "sent", 600),  # the same ten minutes
        OutcomeMinute(int(NOW) - 60, "bulk", "dead", 2),
        OutcomeMinute(int(NOW) - 60, "sms", "throttled", 5),  # a lane not configured
    ]
    charts = outcome_charts(minutes, ("interactive", "bulk"), NOW)
    assert [c["lane"] for c in charts] == ["bulk", "interactive", "sms"]
    bulk = {s["outcome"]: s for s in charts[0]["series"]}
    assert list(bulk) == list(OUTCOME_SERIES)
    assert bulk["sent"]["total"] == 1200 and bulk["dead"]["total"] == 2
    assert bulk["sent"]["rate"] == 1200 / WINDOW.total_seconds()
    # The bucket holding both sent minutes peaks at 1,200 / 600 s = 2/s.
    assert "max 2.00/s" in str(bulk["sent"]["chart"])
    assert "max 2<" in str(bulk["dead"]["chart"]) and "last 24 h" in str(bulk["dead"]["chart"])
    assert all(s["total"] == 0 for s in charts[1]["series"])
    assert {s["outcome"]: s["total"] for s in charts[2]["series"]}["throttled"] == 5
    assert BUCKET_S == 600


def test_rates_read_as_people_say_them() -> None:
    assert per_second(0) == "0/s"
    assert per_second(1200 / 86400) == "0.01/s"
    assert per_second(3 / 86400) == "< 0.01/s"
    assert per_second(1234.5) == "1,234.50/s"
