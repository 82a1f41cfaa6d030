"""How the bridge's bind info becomes options: job keys over the TaskManager's keys, and
the client's resolved default URL only when neither sets one."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pyflink_ndb.config import from_flink_keys
from pyflink_ndb.errors import ConfigurationError
from pyflink_ndb.runtime.bridge import parse_bind_info

BASE = {"operator_id": "abc", "subtask_index": 1, "parallelism": 2, "max_parallelism": 128,
        "attempt": 0, "key_group_start": 64, "key_group_end": 127,
        "restored_checkpoint_id": 7, "restored_epoch_offset": None,
        "checkpointing_enabled": True, "local_dirs": ["/tmp/x"], "job_id": "j1"}


def bind(job: dict, cluster: dict) -> tuple[dict, object]:
    return parse_bind_info(json.dumps({**BASE, "options": json.dumps(job),
                                       "cluster_options": cluster}))


def test_job_options_override_the_taskmanager_and_name_the_operator():
    keys, info = bind({"state.backend.ndb.cache.max-entries": "5",
                       "pyflink-ndb.operator": "counter",
                       "pyflink-ndb.default-url": "sqlite:////tmp/default.sqlite"},
                      {"state.backend.ndb.cache.max-entries": "50",
                       "state.backend.ndb.url": "mysql://root@db:3306/state"})
    options = from_flink_keys(keys)
    assert options.cache_max_entries == 5
    assert options.url == "mysql://root@db:3306/state"
    assert info.operator == "counter" and info.restored_checkpoint_id == 7
    assert (info.key_group_start, info.key_group_end, info.local_dir) == (64, 127, "/tmp/x")


def test_the_client_default_url_applies_only_when_nobody_sets_one():
    keys, _ = bind({"pyflink-ndb.default-url": "sqlite:////tmp/default.sqlite"}, {})
    assert from_flink_keys(keys).url == "sqlite:////tmp/default.sqlite"
    keys, info = bind({}, {})
    assert "state.backend.ndb.url" not in keys and info.operator == "abc"


def test_flinks_retained_count_is_the_largest_the_job_and_the_cluster_say():
    """Flink's JobManager keeps as many retained checkpoints as its own configuration says
    (the job's `-Dexecution.checkpointing.num-retained` is not read there): a breaker on a
    cluster of num-retained 3 ran a job with 1, and pyflink-ndb kept 1 + 1, so the oldest
    checkpoint Flink kept could not be restored. The default of `checkpoints.retained` is
    now the largest of the TaskManager's, the job's and the client's values."""
    cluster = {"execution.checkpointing.num-retained": "3"}
    job = {"state.checkpoints.num-retained": "1"}
    raw = {**BASE, "options": json.dumps(job), "cluster_options": cluster,
           "job_options": {"execution.checkpointing.num-retained": "2"}}
    keys, _ = parse_bind_info(json.dumps(raw))
    assert from_flink_keys(keys).checkpoints_retained == 3
    keys, _ = bind({"execution.checkpointing.num-retained": "4"}, cluster)
    assert from_flink_keys(keys).checkpoints_retained == 4
    keys, _ = bind({"state.backend.ndb.checkpoints.retained": "2"}, cluster)
    assert from_flink_keys(keys).checkpoints_retained == 2  # the package's own key decides
    keys, _ = bind({}, {})
    assert from_flink_keys(keys).checkpoints_retained is None


def test_a_retained_count_that_is_no_number_is_refused_by_name():
    keys, _ = bind({"execution.checkpointing.num-retained": "many"},
                   {"execution.checkpointing.num-retained": "3"})
    with pytest.raises(ConfigurationError, match="checkpoints.retained"):
        from_flink_keys(keys)


def restoring(states: object, **options: str) -> tuple[object, object]:
    raw = {**BASE, "options": json.dumps(options), "cluster_options": {}}
    if states != "absent":
        raw["restored_flink_keyed_states"] = states
    keys, info = parse_bind_info(json.dumps(raw))
    return from_flink_keys(keys), info


def test_keyed_state_of_flinks_backend_in_the_restored_snapshot_is_refused_by_name(caplog):
    """A savepoint taken with the switch off holds the operator's keyed state in Flink's
    backend; restored with the switch on it would be lost without a word (Flink keeps
    restored state that no operator registers). tests/test_switch_from_flink_state_flink.py
    runs it on Flink."""
    from pyflink_ndb.errors import StateCompatibilityError
    from pyflink_ndb.runtime.backend import check_flink_keyed_state

    options, info = restoring([{"name": "n", "kind": "VALUE"},
                               {"name": "buckets", "kind": "MAP"}])
    assert info.restored_flink_keyed_states == (("n", "VALUE"), ("buckets", "MAP"))
    with pytest.raises(StateCompatibilityError) as refused:
        check_flink_keyed_state(options, info)
    message = str(refused.value)
    assert "'n' (value), 'buckets' (map)" in message and "savepoint 7" in message
    assert "restore this snapshot with the switch off" in message
    assert "state.backend.ndb.restore.backend-change: ignore" in message

    options, info = restoring([{"name": "n", "kind": "VALUE"}],
                              **{"state.backend.ndb.restore.backend-change": "ignore"})
    with caplog.at_level("WARNING"):
        check_flink_keyed_state(options, info)  # ignored, said in the log
    assert "'n' (value)" in caplog.text and "ignored" in caplog.text

    for states in ([], "absent"):  # none restored; a bridge that does not send the field
        options, info = restoring(states)
        assert info.restored_flink_keyed_states == ()
        check_flink_keyed_state(options, info)
    caplog.clear()
    options, info = restoring(None)  # the bridge could not tell: said, not refused
    with caplog.at_level("WARNING"):
        check_flink_keyed_state(options, info)
    assert "could not list" in caplog.text

    # The snapshot's tokens are the operator's own (epoch = the restored checkpoint): the
    # Flink states are a copy carried since an earlier `ignore`; restored as usual.
    own = json.dumps({"fmt": 2, "branch": 1, "epoch": 7, "kg": [0, 127]})
    options, info = restoring([{"name": "n", "kind": "VALUE"}])
    info = dataclasses.replace(info, restored_tokens=(own,))
    assert check_flink_keyed_state(options, info) is True
    # Older tokens: a switch-off run carried an earlier switched run's snapshot; refused,
    # and with `ignore` neither is restored.
    older = json.dumps({"fmt": 2, "branch": 1, "epoch": 5, "kg": [0, 127]})
    info = dataclasses.replace(info, restored_tokens=(older,))
    with pytest.raises(StateCompatibilityError, match="checkpoint 5, which an earlier run"):
        check_flink_keyed_state(options, info)
    options, _ = restoring([], **{"state.backend.ndb.restore.backend-change": "ignore"})
    assert check_flink_keyed_state(options, info) is False

    with pytest.raises(ConfigurationError, match="restore.backend-change"):
        from_flink_keys({"state.backend.ndb.restore.backend-change": "drop"})
