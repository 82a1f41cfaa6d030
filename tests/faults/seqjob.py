"""The checkable job of the fault runs (pyflink_ndb.faults): FileSource of `key,seq` lines
→ ParseSequence (throttled through a control file) → key by key → RandomCrashes(
SequenceCheck) on tiered state → discarding sink.

Run with python for a MiniCluster (`python tests/faults/seqjob.py --input …`), or submit
with `scripts/cluster.sh flink run -py tests/faults/seqjob.py …` for the standalone
cluster. `--set KEY=VALUE` passes Flink and `state.backend.ndb.*` keys; prints
`SEQJOB DONE <net runtime ms>` at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.common.restart_strategy import RestartStrategies
from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
from pyflink.datastream.connectors.file_system import FileSource, StreamFormat

import pyflink_ndb
from pyflink_ndb.faults import (
    CRASH_MODES,
    OPERATOR_UID,
    RECORD_TYPE,
    ParseSequence,
    RandomCrashes,
    SequenceCheck,
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--checkpoint-ms", type=int, default=500)
    parser.add_argument("--restart-attempts", type=int, default=50)
    parser.add_argument("--restart-delay-ms", type=int, default=300)
    parser.add_argument("--events", default=None)
    parser.add_argument("--control", default=None, help="file holding the throttle in ms")
    parser.add_argument("--throttle-ms", type=float, default=0.0)
    parser.add_argument("--crashes", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-records", type=int, default=2000)
    parser.add_argument("--modes", default=",".join(CRASH_MODES))
    parser.add_argument("--oversize-bytes", type=int, default=1 << 16)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    extra = dict(item.split("=", 1) for item in args.set)
    flink_keys = {k: v for k, v in extra.items() if not k.startswith("state.backend.ndb.")}
    options = {"state.backend.ndb.url": args.url,
               "state.backend.ndb.namespace": args.namespace,
               **{k: v for k, v in extra.items() if k.startswith("state.backend.ndb.")}}

    config = Configuration()
    config.set_string("python.execution-mode", "thread")
    config.set_string("python.executable", sys.executable)
    for key, value in flink_keys.items():
        config.set_string(key, value)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(args.parallelism)
    env.enable_checkpointing(args.checkpoint_ms, CheckpointingMode.EXACTLY_ONCE)
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(
        args.restart_attempts, args.restart_delay_ms) if args.restart_attempts > 0
        else RestartStrategies.no_restart())

    source = FileSource.for_record_stream_format(
        StreamFormat.text_line_format(), str(Path(args.input).resolve())).build()
    records = (env.from_source(source, WatermarkStrategy.no_watermarks(), "sequences")
               .uid("sequences-source")
               .map(ParseSequence(args.throttle_ms, args.control), output_type=RECORD_TYPE)
               .uid("parse"))
    function = RandomCrashes(SequenceCheck(args.events, args.oversize_bytes), args.events,
                             crashes=args.crashes, seed=args.seed,
                             max_records=args.max_records, modes=args.modes.split(","))
    checked = pyflink_ndb.process(
        records.key_by(lambda r: r[0], key_type=Types.STRING()), function,
        output_type=Types.TUPLE([Types.STRING(), Types.LONG()]), uid=OPERATOR_UID,
        options=options)
    from pyflink.datastream.connectors import Sink
    from pyflink.java_gateway import get_gateway

    jvm = get_gateway().jvm
    checked.sink_to(Sink(jvm.org.apache.flink.streaming.api.functions.sink.v2
                         .DiscardingSink())).uid("discard")
    result = env.execute(f"seq-check-{args.namespace}")
    print(f"SEQJOB DONE {result.get_net_runtime()}", flush=True)


if __name__ == "__main__":
    main()
