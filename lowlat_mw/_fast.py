"""Fast constructors of frozen, slotted dataclasses for the hot paths (a Request per stream, its ModelRequest).

A named seam of issue 39: its invariant is that ``maker(cls, ...)(*values)`` equals ``cls(**dict(zip(given,
values)))`` field for field (tests/test_codec.py compares them for every field); it builds no code from text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

__all__ = ["maker"]


def maker(cls: type, *given: str) -> Callable[..., Any]:
    """A constructor of `cls` (a frozen, slotted dataclass) for a hot path: it takes the fields `given`, in
    that order, and gives the others their defaults, without ``__init__``'s keyword handling and frozen
    ``__setattr__`` calls (one slot store per field, through the slot's own descriptor: about 2x faster). It
    skips ``__post_init__``: the caller makes only values that pass its checks."""
    if "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    slots = {f.name: f for f in fields(cls)}
    unknown = set(given) - set(slots)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)}")
    constants: list[Any] = []  # the other fields' defaults, in the order of their setters
    setters = [getattr(cls, name).__set__ for name in given]  # each slot's descriptor: no frozen check
    made: list[tuple[Callable[[Any, Any], None], Callable[[], Any]]] = []  # (setter, default factory)
    for name, f in slots.items():
        if name in given:
            continue
        if f.default is not MISSING:
            setters.append(getattr(cls, name).__set__)
            constants.append(f.default)
        elif f.default_factory is not MISSING:
            made.append((getattr(cls, name).__set__, f.default_factory))
        else:
            raise TypeError(f"{cls.__name__}.{name} has no default: give it")
    return _make(cls, len(given), tuple(setters), tuple(constants), tuple(made))


def _make(cls: type, n: int, setters: tuple[Callable[[Any, Any], None], ...], constants: tuple[Any, ...],
          made: tuple[tuple[Callable[[Any, Any], None], Callable[[], Any]], ...]) -> Callable[..., Any]:
    """The constructor: a new object of `cls`, its `n` given values and then `constants` stored through `setters`
    in turn, and a new object of each default factory in `made`. The given values of the arities the hot paths use
    (4: a Request the fast decoder reads; 7: a stream's ModelRequest) are stored one statement each: a loop over
    them cost about 0.6 µs a call more."""
    new = object.__new__
    fixed = tuple(zip(setters[n:], constants, strict=True))
    name = f"make_{cls.__name__}"

    def defaults(obj: Any) -> Any:  # the other fields: their defaults, a new object of each default factory
        for put, value in fixed:
            put(obj, value)
        for put, factory in made:
            put(obj, factory())
        return obj

    if n == 4:
        s0, s1, s2, s3 = setters[:4]

        def make(a: Any, b: Any, c: Any, d: Any) -> Any:
            obj = new(cls)
            s0(obj, a)
            s1(obj, b)
            s2(obj, c)
            s3(obj, d)
            return defaults(obj)
    elif n == 7:
        s0, s1, s2, s3, s4, s5, s6 = setters[:7]

        def make(a: Any, b: Any, c: Any, d: Any, e: Any, f: Any, g: Any) -> Any:  # type: ignore[misc]
            obj = new(cls)
            s0(obj, a)
            s1(obj, b)
            s2(obj, c)
            s3(obj, d)
            s4(obj, e)
            s5(obj, f)
            s6(obj, g)
            return defaults(obj)
    else:
        given = setters[:n]

        def make(*values: Any) -> Any:  # type: ignore[misc]
            if len(values) != n:
                raise TypeError(f"{name}() takes {n} positional arguments but {len(values)} were given")
            obj = new(cls)
            for put, value in zip(given, values, strict=True):
                put(obj, value)
            return defaults(obj)

    make.__qualname__ = make.__name__ = name
    return make
