"""The store against a model of the delivery state machine, driven by hypothesis.

Random enqueues (repeated keys included), claims, attempt starts, outcomes (sent, retry
with and without spending an attempt, dead, ambiguous), lease expiries (forced through a
side connection), rescues, cancels and ambiguous resolutions, with stale owners and stale
claim numbers mixed in. After every step the database must agree with the model: state,
attempts and claims per row, one owner per sending row and none otherwise, terminal rows
unchanged, and the per-state counts of ``stats()``.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from conftest import SideDB, msg, truncate_pg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from postlane import State, open_store
from postlane.core.states import TERMINAL_STATES
from postlane.store import Claim, Store, Transition

T = TypeVar("T")

KEYS = [f"k{i}" for i in range(8)]
LANES = ["interactive", "bulk"]
OWNERS = ["a", "b"]
LEASE = timedelta(seconds=60)
# Mostly the right claim number; sometimes a stale or a future one.
CLAIM_SKEW = st.sampled_from([0, 0, 0, -1, 1])

OUTCOMES = {  # what a worker reports -> (state, spends an attempt)
    "sent": (State.SENT, True), "retry": (State.PENDING, True),
    "throttled": (State.PENDING, False), "dead": (State.DEAD, True),
    "ambiguous": (State.AMBIGUOUS, True),
}

SQLITE_SETTINGS = settings(
    max_examples=80, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# A round trip costs more on PostgreSQL; fewer examples keep it near 15 s on 2 cores.
POSTGRES_SETTINGS = settings(SQLITE_SETTINGS, max_examples=40)


@dataclass
class Row:
    lane: str
    state: State = State.PENDING
    attempts: int = 0
    claims: int = 0
    owner: str | None = None
    started: bool = False
    expired: bool = False


class StoreMachine(RuleBasedStateMachine):
    def __init__(self, url: str) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.store: Store = open_store(url)
        try:
            self.run(self.store.open())
            self.run(self.store.migrate())
            if self.store.engine == "postgres":
                truncate_pg(url)
            self.side = SideDB(url)
        except BaseException:
            self.run(self.store.close())
            self.loop.close()
            raise
        self.rows: dict[int, Row] = {}
        self.ids: dict[str, int] = {}
        self.terminal: dict[int, State] = {}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.side.close()
            self.run(self.store.close())
        finally:
            self.loop.close()

    # -- helpers ---------------------------------------------------------------------------
    def pick(self, data: st.DataObject, states: set[State] | None = None) -> int:
        ids = sorted(i for i, r in self.rows.items() if states is None or r.state in states)
        return data.draw(st.sampled_from(ids), label="id")

    def pick_held(self, data: st.DataObject) -> tuple[int, str, int]:
        """Mostly a sending row as its holder would report it; sometimes anything at all
        (another owner, a stale or future claim number, a row in another state)."""
        if self.has(State.SENDING) and data.draw(st.sampled_from([True, True, True, False]),
                                                  label="honest"):
            id_ = self.pick(data, {State.SENDING})
            row = self.rows[id_]
            assert row.owner is not None
            return id_, row.owner, row.claims
        id_ = self.pick(data)
        owner = data.draw(st.sampled_from(OWNERS), label="owner")
        return id_, owner, self.rows[id_].claims + data.draw(CLAIM_SKEW, label="skew")

    def has(self, *states: State) -> bool:
        return any(r.state in states for r in self.rows.values())

    def holds(self, id_: int, owner: str, claims: int) -> bool:
        row = self.rows[id_]
        return row.state == State.SENDING and row.owner == owner and row.claims == claims

    # -- producing -------------------------------------------------------------------------
    @rule(key=st.sampled_from(KEYS), lane=st.sampled_from(LANES))
    def enqueue(self, key: str, lane: str) -> None:
        result = self.run(self.store.enqueue(msg(key, lane=lane)))
        if key in self.ids:
            assert (result.id, result.created) == (self.ids[key], False)
        else:
            assert result.created
            assert result.id not in self.rows
            self.ids[key] = result.id
            self.rows[result.id] = Row(lane=lane)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=4), lane=st.sampled_from(LANES))
    def enqueue_many(self, keys: list[str], lane: str) -> None:
        results = self.run(self.store.enqueue_many([msg(k, lane=lane) for k in keys]))
        assert [r.key for r in results] == keys
        for key, result in zip(keys, results, strict=True):
            if key in self.ids:
                assert (result.id, result.created) == (self.ids[key], False)
            else:
                assert result.created
                self.ids[key] = result.id
                self.rows[result.id] = Row(lane=lane)

    # -- the worker's path -----------------------------------------------------------------
    @rule(lane=st.sampled_from(LANES), owner=st.sampled_from(OWNERS),
          limit=st.integers(1, 3))
    def claim(self, lane: str, owner: str, limit: int) -> None:
        ready = {i for i, r in self.rows.items() if r.state == State.PENDING and r.lane == lane}
        got = self.run(self.store.claim_batch(lane, limit, owner, LEASE))
        ids = [d.id for d in got]
        assert len(ids) == len(set(ids)) == min(limit, len(ready))
        assert set(ids) <= ready
        # Oldest first: nothing left behind is due before anything taken.
        order = {i: (run_at, i) for i, run_at in self.side.query(
            "SELECT id, run_at FROM postlane_deliveries WHERE state = 'pending' OR id IN ("
            + ",".join(str(i) for i in [*ids, 0]) + ")")}
        if ids and ready - set(ids):
            assert max(order[i] for i in ids) <= min(order[i] for i in ready - set(ids))
        for d in got:
            row = self.rows[d.id]
            assert d.claims == row.claims + 1
            assert (d.state, d.lease_owner, d.attempts) == (State.SENDING, owner, row.attempts)
            row.state, row.owner, row.claims = State.SENDING, owner, d.claims
            row.started = row.expired = False

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def start_attempt(self, data: st.DataObject) -> None:
        id_, owner, claims = self.pick_held(data)
        row = self.rows[id_]
        expected = self.holds(id_, owner, claims) and not row.expired
        got = self.run(self.store.start_attempts(owner, [Claim(id_, claims)]))
        assert got == ({id_} if expected else set())
        if expected:
            row.started = True

    @precondition(lambda self: self.rows)
    @rule(data=st.data(),
          outcome=st.sampled_from(["sent", "retry", "throttled", "dead", "ambiguous"]))
    def report(self, data: st.DataObject, outcome: str) -> None:
        id_, owner, claims = self.pick_held(data)
        row = self.rows[id_]
        target, spend = OUTCOMES[outcome]
        t = Transition(id_, claims, target, outcome, delay_s=0.0, spend_attempt=spend,
                       dead_reason="permanent" if target == State.DEAD else None,
                       detail={"outcome": outcome})
        # The outcome of the holder stands even after its lease ran out, until rescued.
        expected = self.holds(id_, owner, claims)
        got = self.run(self.store.set_state_if_sending_many(owner, [t]))
        assert got == ({id_} if expected else set())
        if expected:
            row.state, row.owner = target, None
            row.attempts += int(spend)
            row.started = row.expired = False

    @rule(lane=st.sampled_from(LANES), owner=st.sampled_from(OWNERS),
          outcomes=st.lists(st.sampled_from(["sent", "retry", "throttled", "dead", "ambiguous",
                                              "unstarted", "hold"]), min_size=1, max_size=3))
    def work(self, lane: str, owner: str, outcomes: list[str]) -> None:
        """A worker's whole round: claim, start, report (or keep holding)."""
        got = self.run(self.store.claim_batch(lane, len(outcomes), owner, LEASE))
        ready = sum(1 for r in self.rows.values()
                    if r.state == State.PENDING and r.lane == lane)
        assert len(got) == min(len(outcomes), ready)
        for d in got:
            row = self.rows[d.id]
            assert (d.claims, d.attempts) == (row.claims + 1, row.attempts)
            row.state, row.owner, row.claims = State.SENDING, owner, d.claims
            row.started = row.expired = False
        outcomes = outcomes[:len(got)]
        to_start = [Claim(d.id, d.claims) for d, o in zip(got, outcomes, strict=True)
                    if o != "unstarted"]
        assert self.run(self.store.start_attempts(owner, to_start)) == {c.id for c in to_start}
        transitions = []
        for d, outcome in zip(got, outcomes, strict=True):
            self.rows[d.id].started = outcome != "unstarted"
            if outcome in ("unstarted", "hold"):
                continue
            target, spend = OUTCOMES[outcome]
            transitions.append(Transition(
                d.id, d.claims, target, outcome, delay_s=0.0, spend_attempt=spend,
                dead_reason="permanent" if target == State.DEAD else None,
                detail={"outcome": outcome}))
        applied = self.run(self.store.set_state_if_sending_many(owner, transitions))
        assert applied == {t.id for t in transitions}
        for t in transitions:
            row = self.rows[t.id]
            row.state, row.owner, row.started = t.state, None, False
            row.attempts += int(t.spend_attempt)

    @precondition(lambda self: self.has(State.SENDING))
    @rule(data=st.data())
    def lease_runs_out(self, data: st.DataObject) -> None:
        id_ = self.pick(data, {State.SENDING})
        self.side.expire_lease(id_)
        self.rows[id_].expired = True

    @rule()
    def rescue(self) -> None:
        expired = {i: r for i, r in self.rows.items()
                   if r.state == State.SENDING and r.expired}
        result = self.run(self.store.rescue_expired_leases())
        assert result.requeued == sorted(i for i, r in expired.items() if not r.started)
        assert result.ambiguous == sorted(i for i, r in expired.items() if r.started)
        for row in expired.values():
            if row.started:
                row.state, row.attempts = State.AMBIGUOUS, row.attempts + 1
            else:
                row.state = State.PENDING
            row.owner, row.started, row.expired = None, False, False

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        id_ = self.pick(data)
        row = self.rows[id_]
        expected = row.state in (State.PENDING, State.AMBIGUOUS)
        assert self.run(self.store.cancel(id_, "test")) is expected
        if expected:
            row.state = State.CANCELLED

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), skew=CLAIM_SKEW,
          to=st.sampled_from([State.SENT, State.PENDING, State.DEAD]))
    def resolve_ambiguous(self, data: st.DataObject, skew: int, to: State) -> None:
        # Mostly ambiguous rows, but any row: the guard must refuse the others.
        id_ = self.pick(data, {State.AMBIGUOUS} if self.has(State.AMBIGUOUS)
                        and data.draw(st.booleans(), label="ambiguous") else None)
        row = self.rows[id_]
        claims = row.claims + skew
        t = Transition(id_, claims, to, f"reconciled_{to}", delay_s=0.0,
                       spend_attempt=False, dead_reason="ambiguous_unresolved")
        expected = row.state == State.AMBIGUOUS and row.claims == claims
        got = self.run(self.store.set_state_if_ambiguous_many([t]))
        assert got == ({id_} if expected else set())
        if expected:
            row.state = to

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def database_matches_model(self) -> None:
        db = {r[0]: r[1:] for r in self.side.query(
            "SELECT id, state, attempts, claims, lease_owner, lease_expires_at, finished_at "
            "FROM postlane_deliveries d")}
        assert set(db) == set(self.rows)
        for id_, row in self.rows.items():
            state, attempts, claims, owner, lease_expires_at, finished_at = db[id_]
            # One "enqueued" entry, first, however often the key was sent.
            kinds = [e.kind for e in self.run(self.store.timeline(id_))]
            assert kinds[0] == "enqueued" and kinds.count("enqueued") == 1, kinds
            assert (state, attempts, claims) == (row.state, row.attempts, row.claims), id_
            if row.state == State.SENDING:
                assert owner == row.owner and owner is not None
                assert lease_expires_at is not None
            else:
                assert owner is None and lease_expires_at is None
            assert (finished_at is not None) == (row.state in TERMINAL_STATES)
            if row.state in TERMINAL_STATES:
                assert self.terminal.setdefault(id_, row.state) == row.state
        for id_, state in self.terminal.items():
            assert db[id_][0] == state, f"terminal row {id_} left {state}"

    @invariant()
    def stats_match_model(self) -> None:
        stats = self.run(self.store.stats())
        counts = Counter(str(r.state) for r in self.rows.values())
        assert stats.states == {str(s): counts.get(str(s), 0) for s in State}
        for lane in LANES:
            active = [r for r in self.rows.values() if r.lane == lane
                      and r.state in (State.PENDING, State.SENDING)]
            assert stats.lanes[lane].depth == len(active)
        dead = sum(1 for r in self.rows.values() if r.state == State.DEAD)
        assert sum(stats.dead_letters.values()) == dead

_files = itertools.count()


def test_store_state_machine_sqlite() -> None:
    tmp = tempfile.mkdtemp(prefix="postlane-stateful-")
    try:
        run_state_machine_as_test(
            lambda: StoreMachine(f"sqlite:///{tmp}/{next(_files)}.db"),
            settings=SQLITE_SETTINGS,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_store_state_machine_postgres(pg_url: str) -> None:
    run_state_machine_as_test(lambda: StoreMachine(pg_url), settings=POSTGRES_SETTINGS)
