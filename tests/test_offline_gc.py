"""`pyflink-ndb gc`: garbage collection on demand, over a namespace with a history of
lost notifications, an abandoned attempt and a released savepoint, while a subtask runs."""

from __future__ import annotations

from click.testing import CliRunner
from pyflink.common import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.checkpoint.offline_gc import collect_garbage_now
from pyflink_ndb.cli import main
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.serialization.keys import decode_key, split_key
from pyflink_ndb.serialization.values import decode_value
from pyflink_ndb.testing import LocalSubtask

KEYS = [f"k{i}" for i in range(60)]


def write(t: LocalSubtask, model: dict, tag: int, keys=KEYS) -> None:
    state = t.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    for k in keys:
        t.key(k)
        state.update((tag, k))
        model[k] = (tag, k)


def read(t: LocalSubtask) -> dict:
    state = t.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    out = {}
    for k in KEYS:
        t.key(k)
        if state.value() is not None:
            out[k] = state.value()
    return out


def test_gc_removes_what_nobody_needs_and_every_restorable_snapshot_stays_exact(
        store_kind, store_factory, local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=5, checkpoints_retained=1)
    models: dict[int, dict] = {}
    model: dict = {}
    a = LocalSubtask(store, options, local_dir=local_dir, job_id="job-a")
    for cid in range(1, 5):  # completions lost: the running collection never ran
        write(a, model, cid)
        a.snapshot(cid)
        models[cid] = dict(model)
    write(a, model, 5)
    a.snapshot(5, is_savepoint=True)
    models[5] = dict(model)
    write(a, model, 6)
    a.checkpoint(6)
    models[6] = dict(model)
    write(a, model, 7, KEYS[:10])
    a.snapshot(7)  # never completed: the attempt dies
    a.crash()

    b = LocalSubtask(store, options, restored_checkpoint_id=6, local_dir=local_dir,
                     job_id="job-a", attempt=1)
    model = dict(models[6])
    write(b, model, 8, KEYS[:30])
    b.checkpoint(8)
    models[8] = dict(model)
    write(b, model, 9, KEYS[:5])  # dirty, not yet checkpointed: b's own, untouchable

    runner = CliRunner()
    url = store.describe().split(" ")[0]
    released = runner.invoke(main, ["release", "--url", url, "--namespace", store.namespace,
                                    "--operator", "op", "--checkpoint", "5"])
    assert released.exit_code == 0, released.output
    before = store.count_rows()
    dry = runner.invoke(main, ["gc", "--url", url, "--namespace", store.namespace,
                               "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert store.count_rows() == before, "a dry run deletes nothing"
    done = runner.invoke(main, ["gc", "--url", url, "--namespace", store.namespace])
    assert done.exit_code == 0, done.output
    assert "removed" in done.output
    after = store.count_rows()
    assert after < before, (before, after, done.output)
    assert collect_garbage_now(store, "op").versions_deleted == 0, "nothing left to remove"

    # Readers, every restorable snapshot and the running subtask are untouched.
    committed = {decode_key(split_key(r["ukey"])[0]): decode_value(r["vbytes"])
                 for r in store.query_committed("op", "v")}
    assert committed == models[8]
    listed = {(r.branch, r.epoch) for r in store.list_snapshots("op")}
    assert (b.backend.protocol.branch, 8) in listed
    assert read(b) == model
    b.checkpoint(9)
    models[9] = dict(model)
    b.crash()
    listed = {r.epoch for r in store.list_snapshots("op")}
    assert 9 in listed
    for cid in sorted(models):  # each probe is a new job restoring that snapshot
        if cid not in listed:
            continue
        probe = LocalSubtask(store, NdbStateOptions(), restored_checkpoint_id=cid,
                             local_dir=local_dir, job_id=f"probe-{cid}")
        assert read(probe) == models[cid], cid
        probe.close()
