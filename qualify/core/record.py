"""Typed value classes for the census path, made without `dataclasses`.

`@record` turns a class with annotated fields into what `@dataclass` would
make of it, for the subset the census types use: fields in annotation order,
defaults and `field(default_factory=...)`, `frozen=True` (assignment refused,
hashable by its fields), `order=True` (compared as the tuple of its fields),
explicit `__slots__`, equality by class and fields, a dataclass-style repr,
and `replace(obj, **changes)`. Pickling and copying are Python's own (the
class keeps a `__dict__` or its declared slots, as a dataclass does).

Why ours, not the standard library's: `python -m qualify inspect FILE` is
run once per library by users and scripts, and its start-up was most of
the time on small files. Importing `dataclasses` brings `inspect`, `ast`,
`dis` and `tokenize` (7-9 ms on the 2-core build host), and `@dataclass`
compiles each generated method separately (~8 per frozen class; 20 classes
on the census path: 1.5 ms each there). Here one `__init__` is compiled per
class (the only method whose speed matters: a library has up to 24k entries
and containers), and equality, ordering, hashing and repr are shared
functions over the fields (ARCHITECTURE.md, "Where we wrote our own code";
`nox -s bench-inventory` prints the start-up).

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

from operator import attrgetter


class FrozenInstanceError(AttributeError):
    """Assigning to a field of a frozen record (as dataclasses.FrozenInstanceError)."""


class _Factory:
    __slots__ = ("factory",)

    def __init__(self, factory) -> None:
        self.factory = factory


def field(*, default_factory):
    """A field whose default is made per instance (`field(default_factory=list)`)."""
    return _Factory(default_factory)


_FACTORY = object()  # an __init__ argument left out whose default is a factory's


def record(cls=None, *, frozen: bool = False, order: bool = False):
    """`@record`, `@record(frozen=True)`, `@record(frozen=True, order=True)`."""

    def wrap(cls):
        return _make(cls, frozen, order)

    return wrap if cls is None else wrap(cls)


def fields(obj_or_cls) -> tuple:
    """The field names, in order."""
    return obj_or_cls.__record_fields__


def replace(obj, **changes):
    """A copy of `obj` with some fields changed (as dataclasses.replace)."""
    names = obj.__record_fields__
    unknown = set(changes) - set(names)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field(s) {', '.join(sorted(unknown))}")
    return type(obj)(**{name: changes[name] if name in changes else getattr(obj, name) for name in names})


def _make(cls, frozen: bool, order: bool):
    own = cls.__dict__
    names = tuple(own.get("__annotations__", {}))
    for base in cls.__mro__[1:]:
        if "__record_fields__" in base.__dict__:
            raise TypeError(f"{cls.__name__}: records are not inherited from")
    defaults, factories, args, body = {}, {}, [], []
    for name in names:
        value = own.get(name, _FACTORY)
        if isinstance(value, _Factory):
            factories[name] = value.factory
            delattr(cls, name)
            args.append(f"{name}=_FACTORY")
            value = f"_f_{name}() if {name} is _FACTORY else {name}"
        elif value is not _FACTORY and not _is_slot(value):
            defaults[name] = value
            args.append(f"{name}=_d_{name}")
            value = name
        elif defaults or factories:
            raise TypeError(f"{cls.__name__}: field {name!r} without a default follows one with a default")
        else:
            args.append(name)
            value = name
        body.append(f"_set(self, {name!r}, {value})" if frozen else f"self.{name} = {value}")
    scope = {"_set": object.__setattr__, "_FACTORY": _FACTORY}
    scope.update({f"_d_{k}": v for k, v in defaults.items()})
    scope.update({f"_f_{k}": v for k, v in factories.items()})
    source = f"def __init__(self, {', '.join(args)}):\n " + "\n ".join(body or ["pass"])
    exec(compile(source, f"<record {cls.__qualname__}>", "exec"), scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    values = _getter(names)
    cls.__record_fields__ = names
    methods = {"__init__": init, "__repr__": _repr, "__eq__": _comparison(values, lambda a, b: a == b)}
    if frozen:
        methods.update(__hash__=lambda self: hash(values(self)), __setattr__=_refuse, __delattr__=_refuse)
    elif "__hash__" not in own:
        cls.__hash__ = None  # mutable and compared by value: unhashable, as a dataclass
    if order:
        methods.update(__lt__=_comparison(values, lambda a, b: a < b), __le__=_comparison(values, lambda a, b: a <= b),
                       __gt__=_comparison(values, lambda a, b: a > b), __ge__=_comparison(values, lambda a, b: a >= b))
    for name, method in methods.items():
        if name not in own:  # a method the class writes itself stays, as with @dataclass
            setattr(cls, name, method)
    return cls


def _is_slot(value) -> bool:
    """A member descriptor: what `__slots__` leaves in the class for a field (no default)."""
    return type(value).__name__ == "member_descriptor"


def _getter(names: tuple):
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


def _comparison(values, compare):
    def method(self, other):
        if other.__class__ is self.__class__:
            return compare(values(self), values(other))
        return NotImplemented

    return method


def _repr(self) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__record_fields__)
    return f"{type(self).__qualname__}({shown})"


def _refuse(self, name, *_value):
    raise FrozenInstanceError(f"cannot assign to field {name!r}")
