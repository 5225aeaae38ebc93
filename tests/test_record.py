"""qualify/core/record.py: the census path's value classes behave as the dataclasses they replace."""

from __future__ import annotations

import copy
import pickle

import pytest

from qualify.core import arch, fatbin_model, record, summary


@record.record(frozen=True, order=True)
class Point:
    x: int
    y: int = 0


@record.record
class Bag:
    name: str
    items: list = record.field(default_factory=list)


def test_init_defaults_and_keywords():
    assert (Point(1).x, Point(1).y, Point(1, y=2).y, Point(y=3, x=4).x) == (1, 0, 2, 4)
    with pytest.raises(TypeError):
        Point()
    with pytest.raises(TypeError):
        Point(1, 2, 3)


def test_factories_are_per_instance():
    a, b = Bag("a"), Bag("b")
    a.items.append(1)
    assert b.items == [] and Bag("c", [2]).items == [2]


def test_equality_hash_order_repr():
    assert Point(1, 2) == Point(1, 2) and Point(1, 2) != Point(2, 1) and Point(1, 2) != (1, 2)
    assert len({Point(1, 2), Point(1, 2)}) == 1
    assert Point(1, 9) < Point(2, 0) and sorted([Point(2), Point(1)]) == [Point(1), Point(2)]
    assert repr(Point(1, 2)) == "Point(x=1, y=2)"
    with pytest.raises(TypeError):
        hash(Bag("a"))  # mutable and compared by value, as a dataclass
    with pytest.raises(TypeError):
        assert Point(1) < (1,)


def test_frozen_refuses_assignment():
    p = Point(1)
    with pytest.raises(record.FrozenInstanceError):
        p.x = 2
    with pytest.raises(AttributeError):
        del p.y


def test_pickle_copy_and_replace():
    p = Point(1, 2)
    for clone in (pickle.loads(pickle.dumps(p)), copy.copy(p), copy.deepcopy(p)):
        assert clone == p and clone is not p
    assert record.replace(p, y=5) == Point(1, 5) and record.fields(Point) == ("x", "y")
    with pytest.raises(TypeError, match="no field"):
        record.replace(p, z=1)


def test_slotted_records_keep_their_slots():
    entry = fatbin_model.Entry(0, 2, 120, arch.Variant.PLAIN, 0, "none", 64, 10, 0, 10, "no", True, None)
    assert not hasattr(entry, "__dict__")
    assert pickle.loads(pickle.dumps(entry)) == entry


def test_the_census_types_compare_as_before():
    cap = arch.Capability(12, 1)
    assert cap == arch.Capability.parse("sm_121") and cap > arch.Capability(12, 0) and {cap: 1}[arch.Capability(12, 1)]
    target = arch.CodeTarget.parse("sm_120a")
    assert pickle.loads(pickle.dumps(target)) == target and str(target) == "sm_120a"
    unit = summary.Unit("s", 0, 1, frozenset(), frozenset(), False, True)
    assert pickle.loads(pickle.dumps(unit)) == unit and hash(unit) == hash(copy.deepcopy(unit))


def test_a_field_without_a_default_after_one_with_is_refused():
    with pytest.raises(TypeError, match="without a default"):
        @record.record
        class Wrong:
            a: int = 1
            b: int
