"""Pins the PyFlink internals that pyflink_ndb._pyflink reaches for (apache-flink 1.20)."""

from __future__ import annotations

from pyflink.common import Time, Types
from pyflink.datastream.state import StateTtlConfig, ValueStateDescriptor
from pyflink.fn_execution.datastream.embedded.operations import (
    OneInputOperation,
    TwoInputOperation,
)

from pyflink_ndb import _pyflink


def test_ttl_config_of_reads_the_descriptor():
    descriptor = ValueStateDescriptor("v", Types.INT())
    assert _pyflink.ttl_config_of(descriptor) is None
    config = StateTtlConfig.new_builder(Time.seconds(5)).build()
    descriptor.enable_time_to_live(config)
    assert _pyflink.ttl_config_of(descriptor) is config


class _Operation:
    def __init__(self, main):
        self._main_operation = main


def test_record_keys_are_seen_before_one_input_records():
    seen_keys = []
    main = OneInputOperation(lambda: None, lambda: None, lambda value: [value[1]])
    assert _pyflink.hook_record_keys(_Operation(main), seen_keys.append)
    assert list(main.process_element(("k1", "v1"))) == ["v1"]
    assert seen_keys == ["k1"]


def test_record_keys_are_seen_before_both_inputs():
    seen_keys = []
    main = TwoInputOperation(lambda: None, lambda: None, lambda v: [v[1]], lambda v: [v[1]])
    assert _pyflink.hook_record_keys(_Operation(main), seen_keys.append)
    main.process_element1(("a", 1))
    main.process_element2(("b", 2))
    assert seen_keys == ["a", "b"]


def test_unknown_operation_shape_is_left_alone():
    assert not _pyflink.hook_record_keys(object(), lambda key: None)
