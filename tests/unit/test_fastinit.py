"""``core.fastinit.frozen_init``: the quicker ``__init__`` must be the dataclass's own in
every way a caller can see: signature, defaults, factories, keyword-only fields, frozen."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from postlane.core.fastinit import frozen_init
from postlane.core.message import Delivery, EnqueueResult, Message
from postlane.core.outcomes import Outcome
from postlane.core.policy import Decision
from postlane.core.records import Claim, Transition


def _record_class() -> type[Any]:
    @dataclass(frozen=True, slots=True)
    class Record:
        a: int
        b: str = "b"
        c: list[int] = field(default_factory=list)
        d: dict[str, int] = field(default_factory=dict, kw_only=True)
        e: float | None = field(default=None, kw_only=True)

    return Record


Plain = _record_class()
Quick = frozen_init(_record_class())


@given(a=st.integers(), b=st.one_of(st.none(), st.text(max_size=5)),
       c=st.one_of(st.none(), st.lists(st.integers(), max_size=3)),
       e=st.one_of(st.none(), st.floats(allow_nan=False)))
def test_the_same_instance_as_the_dataclass_init_for_any_arguments(
        a: int, b: str | None, c: list[int] | None, e: float | None) -> None:
    args: list[Any] = [a] + ([b] if b is not None else [])
    args += [c] if b is not None and c is not None else []
    kwargs: dict[str, Any] = {"e": e} if e is not None else {}
    plain, quick = Plain(*args, **kwargs), Quick(*args, **kwargs)
    assert dataclasses.astuple(plain) == dataclasses.astuple(quick)
    assert repr(plain).replace("Record", "") == repr(quick).replace("Record", "")


def test_factories_give_each_instance_its_own_value() -> None:
    one, two = Quick(1), Quick(2)
    assert one.c == [] and one.d == {}
    assert one.c is not two.c and one.d is not two.d


def test_the_instance_stays_frozen_and_replace_works() -> None:
    record = Quick(1, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.a = 2  # type: ignore[misc]
    assert dataclasses.replace(record, b="y") == Quick(1, "y")


def test_keyword_only_fields_stay_keyword_only_and_bad_calls_fail_as_before() -> None:
    with pytest.raises(TypeError):
        Quick(1, "b", [], {})  # d is keyword-only
    with pytest.raises(TypeError):
        Quick()  # a is required
    with pytest.raises(TypeError):
        Quick(1, f=2)  # no such field


@pytest.mark.parametrize("cls", [Claim, Transition, Decision, Outcome, Message, Delivery,
                                 EnqueueResult])
def test_the_records_keep_their_dataclass_signature(cls: type[Any]) -> None:
    parameters = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, f in zip(parameters, fields, strict=True):
        kind = (inspect.Parameter.KEYWORD_ONLY if f.kw_only
                else inspect.Parameter.POSITIONAL_OR_KEYWORD)
        assert parameter.kind is kind, f.name
        if f.default is not dataclasses.MISSING:
            assert parameter.default == f.default, f.name
        elif f.default_factory is dataclasses.MISSING:
            assert parameter.default is inspect.Parameter.empty, f.name


def test_only_frozen_slotted_dataclasses_without_post_init() -> None:
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (NoSlots, NotFrozen, Checked):
        with pytest.raises(TypeError):
            frozen_init(cls)
