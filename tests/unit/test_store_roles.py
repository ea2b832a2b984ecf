"""``Store`` is the union of its roles, and nothing more: every operation an engine
implements is declared by a role a consumer can name (``postlane.store.roles``)."""

from __future__ import annotations

import inspect

from postlane.store import roles
from postlane.store.base import Store

ROLES = [cls for _, cls in inspect.getmembers(roles, inspect.isclass)
         if cls.__module__ == roles.__name__]


def _declared(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items()
            if getattr(value, "__isabstractmethod__", False)}


def test_store_inherits_every_role() -> None:
    assert ROLES and all(role in Store.__mro__ for role in ROLES)


def test_every_operation_belongs_to_a_role_and_store_adds_none() -> None:
    in_roles = set().union(*(_declared(role) for role in ROLES))
    assert set(Store.__abstractmethods__) == in_roles
    assert _declared(Store) == set()


def test_each_role_says_who_uses_it() -> None:
    for role in ROLES:
        doc = " ".join((role.__doc__ or "").split())
        assert "Used by" in doc, f"{role.__name__}: say who uses this role"
