"""`key_copy`: what `ctx.get_current_key()` returns when it answers from the record
(pyflink_ndb/_pyflink.py). An unchangeable key is returned as it is; any other is a copy
equal to it that shares nothing changeable with it, so changing the answer cannot change
the record's key (tests/test_current_key_copy_flink.py shows it in a job)."""

from __future__ import annotations

import datetime
import decimal

import pytest
from pyflink.common import Row, RowKind

from pyflink_ndb._pyflink import key_copy

UNCHANGEABLE = [7, "N725MQ", 1.5, True, b"\x00k", None, datetime.date(2026, 12, 5),
                datetime.datetime(2026, 12, 5, 13, 0), datetime.time(13, 0),
                decimal.Decimal("1.10"), ("a", 1, None), ()]


@pytest.mark.parametrize("key", UNCHANGEABLE, ids=repr)
def test_an_unchangeable_key_is_returned_as_it_is(key):
    assert key_copy(key) is key


def test_a_row_is_copied_field_by_field_with_its_names_and_kind():
    key = Row(name="k0", part=Row(x=1, y=[2, 3]))
    key.set_row_kind(RowKind.UPDATE_AFTER)
    copied = key_copy(key)
    assert copied == key and copied is not key
    assert copied.get_row_kind() == RowKind.UPDATE_AFTER
    assert copied.as_dict(recursive=True) == {"name": "k0", "part": {"x": 1, "y": [2, 3]}}
    copied[0] = "changed"
    copied.part[0] = -1
    copied.part.y.append(4)
    assert key.as_dict(recursive=True) == {"name": "k0", "part": {"x": 1, "y": [2, 3]}}
    assert key_copy(Row("a", 1)) == Row("a", 1)


def test_a_changeable_pickled_key_is_a_deep_copy():
    nested = [1, {"a": [2]}]
    copied = key_copy(nested)
    assert copied == nested
    copied[1]["a"].append(9)
    copied.append(3)
    assert nested == [1, {"a": [2]}]

    mapping = {"k": [1]}
    copied_map = key_copy(mapping)
    copied_map["k"].append(2)
    assert mapping == {"k": [1]}

    mixed = ("a", [1])
    copied_tuple = key_copy(mixed)
    assert copied_tuple == mixed and copied_tuple is not mixed
    copied_tuple[1].append(2)
    assert mixed == ("a", [1])
