"""A quicker ``__init__`` for the frozen records built once or more per send.

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__``
(a global lookup, an attribute lookup and a call per field), because its own
``__setattr__`` refuses. A worker builds several such records per send (``Outcome``,
``Decision``, ``Transition``, ``Claim``) and a claim a hundred ``Delivery`` rows: in a
profile of a no-op drain those ``__init__`` calls were the largest single item of the
worker's own code. ``frozen_init`` writes the same ``__init__`` with each field stored
through its slot's descriptor, bound once, the way ``dataclasses`` writes its own: same
signature, defaults and factories, and the instance stays frozen (assigning a field still
raises ``FrozenInstanceError``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

_FACTORY: Any = object()
"""The default of a parameter whose field has a ``default_factory``: call the factory."""


def frozen_init(cls: type[T]) -> type[T]:
    """Give ``cls`` (a ``@dataclass(frozen=True, slots=True)``) the quicker ``__init__``;
    apply it above the ``@dataclass`` decorator."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: frozen_init is for frozen, slotted dataclasses")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: frozen_init does not call __post_init__")
    namespace: dict[str, Any] = {"_FACTORY": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: frozen_init needs init fields only")
        name = f.name
        namespace[f"_set_{name}"] = cls.__dict__[name].__set__
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{name}"] = f.default
            parameter = f"{name}=_default_{name}"
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{name}"] = f.default_factory
            parameter = f"{name}=_FACTORY"
            body.append(f"    if {name} is _FACTORY: {name} = _factory_{name}()")
        else:
            parameter = name
        (keyword if f.kw_only else positional).append(parameter)
        body.append(f"    _set_{name}(__dataclass_self__, {name})")
    signature = ", ".join(["__dataclass_self__", *positional, *(["*", *keyword] if keyword
                                                                else [])])
    exec(f"def __init__({signature}):\n" + "\n".join(body or ["    pass"]), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
