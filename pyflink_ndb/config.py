"""Options of the tiered state backend, read from `state.backend.ndb.*` keys.

Every option is declared once in :data:`OPTIONS` with its key, default and description;
`README.md` lists the same table. Options come from `flink-conf.yaml` (the client's and the
TaskManager's) and from a programmatic :class:`pyflink.common.Configuration` or dict; job
options override cluster options.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyflink_ndb.cpu_pin import parse_setting as parse_cpu_pin
from pyflink_ndb.errors import ConfigurationError

PREFIX = "state.backend.ndb."
DEFAULT_URL = "sqlite:///pyflink-ndb-state.sqlite"
_NAMESPACE_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
#: Largest `write.process-connections`: each is a database connection per subtask.
MAX_WRITE_PROCESS_CONNECTIONS = 16


@dataclass(frozen=True)
class OptionSpec:
    """One option: its key (after the prefix), dataclass field, default and description."""

    key: str
    field: str
    default: Any
    description: str


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("enabled", "enabled", False,
               "Job-wide switch, read on the client when the job is built (after `import "
               "pyflink_ndb`): every keyed Python operator that can hold keyed state runs "
               "on tiered state (README, \"Switch a whole job\"). `false`: only operators "
               "applied with `pyflink_ndb.process` / `co_process`."),
    OptionSpec("url", "url", DEFAULT_URL,
               "Store URL: `mysql://user@host:port/db` (RonDB's MySQL server, MySQL, MariaDB) "
               "or `sqlite:///path` (embedded; a relative path is resolved on the client)."),
    OptionSpec("namespace", "namespace", "default",
               "Prefix of the tables `<ns>_state`, `<ns>_snapshots`, `<ns>_catalog`, ...: "
               "[a-z][a-z0-9_]{0,39}."),
    OptionSpec("user", "user", None, "Database user; overrides the user of the URL."),
    OptionSpec("password", "password", None, "Database password (never logged)."),
    OptionSpec("password-file", "password_file", None,
               "File whose first line is the database password."),
    OptionSpec("password-env", "password_env", None,
               "Environment variable that holds the database password."),
    OptionSpec("cache.max-entries", "cache_max_entries", 10_000,
               "Entries in the in-memory LRU (tier 1) per subtask; at least 1."),
    OptionSpec("local.enabled", "local_enabled", True,
               "Keep evicted entries in an embedded RocksDB (tier 2) per subtask."),
    OptionSpec("local.recovery", "local_recovery", True,
               "Task-local recovery: a failed or cancelled attempt leaves its RocksDB tier "
               "to the next attempt of the subtask in the same TaskManager, which deletes "
               "from it what changed after the restored checkpoint and reads the rest "
               "locally instead of from the database (as Flink's "
               "`state.backend.local-recovery` does for its own backends). Needs "
               "`local.enabled`; a tier not taken over within 60 s is deleted."),
    OptionSpec("local.dir", "local_dir", None,
               "Folder for the RocksDB tier; default: the TaskManager's tmp directory."),
    OptionSpec("write.batch-size", "write_batch_rows", 500,
               "Rows per write batch when a checkpoint is written: multi-row REPLACE "
               "statements of at most this many rows and 4 MiB, each its own transaction "
               "(NDB fails over-large transactions)."),
    OptionSpec("write.async", "write_async", True,
               "Write each checkpoint in Flink's asynchronous phase, from a background "
               "thread with a connection of its own: the synchronous phase only freezes "
               "the dirty set. `false`: write it in the synchronous phase (the task waits)."),
    OptionSpec("write.render-process", "write_render_process", False,
               "MySQL-protocol stores with `write.async` (ignored otherwise): render each "
               "checkpoint's rows (the JSON of values and keys, the SQL literals) in a "
               "Python process of its own per subtask (about 25-40 MiB, outside Flink's "
               "memory accounting), off the TaskManager's interpreter lock, slice by slice "
               "while the background writer executes the statements of the previous "
               "slice. `false`: the writer renders on its own thread, under the lock. A "
               "child that fails is replaced (3 times at most); meanwhile the writer "
               "renders itself."),
    OptionSpec("write.process", "write_process", "auto",
               "MySQL-protocol stores with `write.async` (ignored otherwise): render and "
               "write each checkpoint's rows from a Python process of its own per subtask "
               "(the render process of `write.render-process`, which then also executes "
               "the statements, fenced, on connections of its own), so that the "
               "TaskManager's interpreter only collects the frozen rows and writes the "
               "snapshot row; records do not slow down while a checkpoint is written. "
               "`auto`: on where the TaskManager may use at least 2 CPUs (its affinity "
               "mask and its cgroup's CPU quota), off on 1; `true`: on; `false`: the "
               "background thread renders and writes. Costs a process of 25-40 MiB and "
               "`write.process-connections` more database connections per subtask. A "
               "child that fails is replaced (3 times at most); meanwhile the writer "
               "renders and writes itself. On implies `write.render-process`."),
    OptionSpec("write.process-connections", "write_process_connections", 2,
               "With `write.process` on: database connections the write process writes "
               "each checkpoint's rows on at once, each taking the next transaction when "
               "it committed its last (garbage collection's deletes use the first). 1-16; "
               "1: one connection, the transactions one after the other. A further "
               "connection that fails to open is logged and tried again after 60 s; the "
               "writes go on those open."),
    OptionSpec("write.value-json", "write_value_json", True,
               "Write each value's JSON form (`vjson`) beside its pickled bytes, for SQL "
               "clients (the views `<ns>_committed` and `<ns>_committed_rows`, the "
               "documented point reads). `false`: values written from then on have `vjson` "
               "NULL, as a value without a JSON form has; the job, its restores and the "
               "CLI read the pickled bytes (`query` renders its JSON from them). Halves "
               "the bytes a checkpoint writes for values that do have a JSON form, and "
               "spares the writer their JSON encoding (README, Benchmarks, part 7)."),
    OptionSpec("write.max-pending-bytes", "write_max_pending_bytes", 256 * 1024 * 1024,
               "Bound (bytes, estimated: values + keys + 120 per entry) of the frozen "
               "checkpoints not yet written; a checkpoint that would exceed it waits in "
               "its synchronous phase for earlier ones (back-pressure; nothing is "
               "dropped). At least 1."),
    OptionSpec("python.gc-freeze", "python_gc_freeze", True,
               "Once per TaskManager interpreter, when a subtask first hears of a "
               "completed checkpoint: leave every object then alive (PyFlink's, Beam's "
               "and the job's start-up heap) out of the cyclic garbage collector's future "
               "full collections (`gc.freeze()`), which stop every Python thread of the "
               "TaskManager in thread mode. Reference counting still frees those objects; "
               "a reference cycle among them is never collected. `false`: leave the "
               "collector as it is."),
    OptionSpec("python.cpu-pin", "python_cpu_pin", "off",
               "Run every thread of the TaskManager's interpreter that runs Python (the "
               "Python operators' task threads, the background writers) on one CPU: they "
               "share one GIL, so they never use more than one CPU together, and on "
               "different CPUs each hand-over of the GIL wakes a thread on another CPU. "
               "`auto`: a CPU the TaskManager may run on, chosen by its process id; a "
               "number: that CPU (checked at the TaskManager); `off`: leave the threads to "
               "the scheduler. Linux only "
               "(elsewhere: off). The JVM's other threads, the render process and the "
               "database keep every CPU (README, \"Thread mode\")."),
    OptionSpec("restore.mode", "restore_mode", "lazy",
               "`lazy`: read each key from the store when first needed; `eager`: prefetch the "
               "subtask's key groups into the local tier at open, before the first record; "
               "`background`: lazy, and the background writer streams the key groups into "
               "the local tier in pages meanwhile (a key group done needs no store reads); "
               "needs `local.enabled` and `write.async`, else it is `eager`."),
    OptionSpec("restore.backend-change", "restore_backend_change", "fail",
               "What a restore does when the snapshot holds an operator's keyed state in "
               "the other backend: Flink's own for an operator now on pyflink-ndb (taken "
               "with the switch off; checked by each subtask at restore), or pyflink-ndb's "
               "for an operator now on Flink's backend (taken with the switch on, restored "
               "with it off; checked by `import pyflink_ndb` in the client when the job is "
               "submitted). Flink itself would start that state empty without a word. "
               "`fail`: StateCompatibilityError naming the operators or states (in the "
               "subtasks it fails the job without restarts); `ignore`: start them empty "
               "on purpose. Flink's backend keeps ignored keyed state in the job's later "
               "snapshots: the switched operator's own snapshots restore without the "
               "setting, but restored with the switch off they bring that older state "
               "back (README, \"Limits\"). Timers are Flink's either way and restore as "
               "usual."),
    OptionSpec("restore.key-filter", "restore_key_filter", True,
               "With `restore.mode: lazy`: after a restore whose point reads found 1,000 "
               "keys the database does not hold, the background writer builds a "
               "Bloom filter (1 % false positives, about 1.2 bytes per inherited row, 2.4 "
               "for map and list rows) of the keys each inherited key group holds, from a "
               "scan of a narrow index (keys only, no values); a "
               "miss it rules out (a key the restored snapshot never held) reads as \"no "
               "value\" without a database round trip. Needs `local.enabled` and "
               "`write.async`; ignored otherwise."),
    OptionSpec("read-ahead.records", "read_ahead_records", 100,
               "Records a keyed process function's bridge buffers while its reads miss "
               "(after a restore): before processing them it reads their keys' entries "
               "of the value, reducing and aggregating states (once a read has missed: "
               "of the states that missed) in one database query per 100 entries "
               "instead of a round trip per key. When a "
               "bundle would save nothing (every key cached), records pass straight "
               "through for a while (1,000 records, doubling up to 65,536). 0: off."),
    OptionSpec("read-ahead.max-wait-ms", "read_ahead_max_wait_ms", 5,
               "Longest time (ms) a record waits in a read-ahead bundle that is not full "
               "(the latency reading ahead may add, only while it is active); at least 1."),
    OptionSpec("bundle.records", "bundle_records", 100,
               "Records a keyed process function's bridge processes in one call into the "
               "Python interpreter (STREAMING mode, one-input keyed process functions "
               "without side outputs): it holds records back until the bundle is full, its "
               "first record has waited `bundle.max-wait-ms`, or anything that must follow "
               "its records arrives (a watermark, a timer, a checkpoint barrier, the end of "
               "input). The record context (`get_current_key`, `timestamp`, the timer "
               "service) is each record's own. The size of read-ahead bundles too while it "
               "is on. 0: off (one call per record)."),
    OptionSpec("bundle.max-wait-ms", "bundle_max_wait_ms", 5,
               "Longest time (ms) a record waits in a bundle that is not full (the latency "
               "`bundle.records` may add); at least 1."),
    OptionSpec("on-fresh-start", "on_fresh_start", "fail",
               "A start without a restored checkpoint on a namespace that holds committed "
               "state: `fail`, `resume` (from the latest completed checkpoint) or `truncate`."),
    OptionSpec("checkpoints.retained", "checkpoints_retained", None,
               "Completed checkpoints whose versions garbage collection keeps; default: "
               "Flink's `execution.checkpointing.num-retained` (or the deprecated "
               "`state.checkpoints.num-retained`) from the TaskManagers', the job's or the "
               "client's configuration, else 1. Garbage collection keeps one more for readers."),
    OptionSpec("value.max-bytes", "value_max_bytes", 64 * 1024 * 1024,
               "Largest serialized value (bytes) accepted: a larger one fails the state "
               "update (ValueTooLargeError naming the state and the key); nothing is "
               "stored."),
    OptionSpec("db.socket-timeout-ms", "db_socket_timeout_ms", 30_000,
               "Longest wait (ms) of one read or write on a database connection (also the "
               "server's greeting); a connection that stops answering fails after it and "
               "is retried on a new connection. At least 1."),
    OptionSpec("db.retry.max-attempts", "db_retry_max_attempts", 10,
               "Tries of one idempotent database transaction after transient errors (lost "
               "or refused connection, lock wait timeout, deadlock, NDB temporary error), "
               "the first one included; at least 1 (1: no retry)."),
    OptionSpec("db.retry.max-backoff-ms", "db_retry_max_backoff_ms", 5_000,
               "Largest sleep (ms) between two tries: exponential from 50 ms with full "
               "jitter, capped here; at least 0."),
    OptionSpec("db.retry.deadline-ms", "db_retry_deadline_ms", 90_000,
               "Give up (StoreUnavailableError naming the server, the attempts and the last "
               "error) when the next sleep would end this many ms after the first try; at "
               "least 1."),
)

KNOWN_KEYS: tuple[str, ...] = tuple(PREFIX + spec.key for spec in OPTIONS)
_BY_KEY = {spec.key: spec for spec in OPTIONS}


@dataclass(frozen=True)
class NdbStateOptions:
    """Resolved options of the tiered state backend (see :data:`OPTIONS` for each one).

    Units are in the names: `_rows`, `_bytes`. `None` means "not set, use the documented
    fallback". The password never appears in `repr()` or logs.
    """

    enabled: bool = False
    url: str = DEFAULT_URL
    namespace: str = "default"
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    password_file: str | None = None
    password_env: str | None = None
    cache_max_entries: int = 10_000
    local_enabled: bool = True
    local_recovery: bool = True
    local_dir: str | None = None
    write_batch_rows: int = 500
    write_async: bool = True
    write_render_process: bool = False
    write_process: str = "auto"
    write_process_connections: int = 2
    write_value_json: bool = True
    write_max_pending_bytes: int = 256 * 1024 * 1024
    python_gc_freeze: bool = True
    python_cpu_pin: str = "off"
    restore_mode: str = "lazy"
    restore_backend_change: str = "fail"
    restore_key_filter: bool = True
    read_ahead_records: int = 100
    read_ahead_max_wait_ms: int = 5
    bundle_records: int = 100
    bundle_max_wait_ms: int = 5
    on_fresh_start: str = "fail"
    checkpoints_retained: int | None = None
    value_max_bytes: int = 64 * 1024 * 1024
    db_socket_timeout_ms: int = 30_000
    db_retry_max_attempts: int = 10
    db_retry_max_backoff_ms: int = 5_000
    db_retry_deadline_ms: int = 90_000

    def __post_init__(self) -> None:
        if not _NAMESPACE_RE.match(self.namespace):
            raise ConfigurationError(
                f"{PREFIX}namespace={self.namespace!r} is not a valid namespace: use "
                "1-40 characters of [a-z0-9_], starting with a letter.")
        if not (self.url.startswith("mysql://") or self.url.startswith("sqlite://")):
            raise ConfigurationError(
                f"{PREFIX}url must start with mysql:// or sqlite:// "
                f"(got {redact_url(self.url)!r}).")
        object.__setattr__(self, "write_process", _tri_state(self.write_process))
        self._require(self.write_process in ("auto", "true", "false"), "write.process",
                      "`auto`, `true` or `false` (also accepted: yes/no, 1/0, any case)")
        for spec in OPTIONS:
            if isinstance(spec.default, bool):
                self._require(isinstance(getattr(self, spec.field), bool), spec.key,
                              "true or false")
        self._require(self.cache_max_entries >= 1, "cache.max-entries", "at least 1")
        self._require(self.write_batch_rows >= 1, "write.batch-size", "at least 1")
        self._require(1 <= self.write_process_connections <= MAX_WRITE_PROCESS_CONNECTIONS,
                      "write.process-connections",
                      f"from 1 to {MAX_WRITE_PROCESS_CONNECTIONS}")
        self._require(self.value_max_bytes >= 1, "value.max-bytes", "at least 1")
        self._require(self.write_max_pending_bytes >= 1, "write.max-pending-bytes",
                      "at least 1")
        self._require(self.read_ahead_records >= 0, "read-ahead.records", "at least 0")
        self._require(self.read_ahead_max_wait_ms >= 1, "read-ahead.max-wait-ms",
                      "at least 1")
        self._require(self.bundle_records >= 0, "bundle.records", "at least 0")
        self._require(self.bundle_max_wait_ms >= 1, "bundle.max-wait-ms", "at least 1")
        self._require(self.restore_mode in ("lazy", "eager", "background"), "restore.mode",
                      "`lazy`, `eager` or `background`")
        self._require(self.restore_backend_change in ("fail", "ignore"),
                      "restore.backend-change", "`fail` or `ignore`")
        self._require(parse_cpu_pin(self.python_cpu_pin) is not None, "python.cpu-pin",
                      "`off`, `auto` or a CPU number (0, 1, …)")
        self._require(self.on_fresh_start in ("fail", "resume", "truncate"),
                      "on-fresh-start", "`fail`, `resume` or `truncate`")
        if self.checkpoints_retained is not None:
            self._require(self.checkpoints_retained >= 1, "checkpoints.retained",
                          "at least 1")
        self._require(self.db_socket_timeout_ms >= 1, "db.socket-timeout-ms", "at least 1")
        self._require(self.db_retry_max_attempts >= 1, "db.retry.max-attempts",
                      "at least 1")
        self._require(self.db_retry_max_backoff_ms >= 0, "db.retry.max-backoff-ms",
                      "at least 0")
        self._require(self.db_retry_deadline_ms >= 1, "db.retry.deadline-ms", "at least 1")

    def write_process_wanted(self, cpus: float) -> bool:
        """Whether `write.process` asks for the write process on a TaskManager that may use
        `cpus` CPUs (:func:`pyflink_ndb.cpu_pin.usable_cpus`): `auto` at 2 or more."""
        return self.write_process == "true" or (self.write_process == "auto" and cpus >= 2)

    def _require(self, ok: bool, key: str, what: str) -> None:
        """Raise when `ok` is false: the message names the key, the value given, what it
        must be and the default."""
        if not ok:
            spec = _BY_KEY[key]
            default = "none" if spec.default is None else spec.default
            raise ConfigurationError(
                f"{PREFIX}{key}={getattr(self, spec.field)!r} is not allowed: it must be "
                f"{what} (default: {default}).")

    def resolve_password(self) -> str | None:
        """The password from `password`, else `password-file`, else `password-env`.

        :raises ConfigurationError: the file is unreadable or the variable is unset.
        """
        if self.password is not None:
            return self.password
        if self.password_file:
            try:
                return Path(self.password_file).read_text().splitlines()[0]
            except (OSError, IndexError) as err:
                raise ConfigurationError(
                    f"{PREFIX}password-file={self.password_file!r} cannot be read: "
                    f"{type(err).__name__}. Point it at a readable file.") from err
        if self.password_env:
            value = os.environ.get(self.password_env)
            if value is None:
                raise ConfigurationError(
                    f"{PREFIX}password-env={self.password_env!r}: the variable is not set "
                    "in the TaskManager's environment.")
            return value
        return None

    def to_json(self) -> str:
        """JSON of the options as `state.backend.ndb.*` keys (only those that differ)."""
        return json.dumps(to_flink_keys(self), sort_keys=True)

    def __repr__(self) -> str:
        # The URL may carry a password too (mysql://user:password@host/db).
        shown = (f"{f.name}={redact_url(self.url) if f.name == 'url' else getattr(self, f.name)!r}"
                 for f in dataclasses.fields(self) if f.repr)
        return f"{type(self).__name__}({', '.join(shown)})"

    def replace(self, **changes: Any) -> NdbStateOptions:
        return dataclasses.replace(self, **changes)


#: The texts a yes/no option reads as true and as false (any case).
_TRUE_TEXTS = ("true", "1", "yes")
_FALSE_TEXTS = ("false", "0", "no")


def _tri_state(value: Any) -> Any:
    """`auto`, `true` or `false` from a bool or any-case text (the texts of a yes/no
    option); anything else as it is, for the option's check to name."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value).strip().lower()
    if text in _TRUE_TEXTS:
        return "true"
    if text in _FALSE_TEXTS:
        return "false"
    return "auto" if text == "auto" else value


def _convert(spec: OptionSpec, raw: Any) -> Any:
    if raw is None:
        return None
    default = spec.default
    text = str(raw).strip()
    try:
        if isinstance(default, bool):
            if isinstance(raw, bool):
                return raw
            if text.lower() in _TRUE_TEXTS:
                return True
            if text.lower() in _FALSE_TEXTS:
                return False
            raise ValueError(text)
        if isinstance(default, int) or spec.field == "checkpoints_retained":
            return int(text)
    except ValueError:
        if isinstance(default, bool):
            raise ConfigurationError(
                f"{PREFIX}{spec.key}={raw!r} is not true or false: set it to true or false "
                f"(also accepted: yes/no, 1/0, any case; default: "
                f"{str(default).lower()}).") from None  # the message says it all
        raise ConfigurationError(
            f"{PREFIX}{spec.key}={raw!r} is not a whole number: set a whole number "
            f"(default: {default}).") from None
    return text


def option_value(key: str, raw: Any) -> Any:
    """One `state.backend.ndb.*` value converted as :func:`from_flink_keys` converts it
    (booleans: true/false, 1/0, yes/no, any case).

    :param key: the key without the prefix, e.g. `"enabled"`.
    :raises ConfigurationError: an unknown key or a value of the wrong kind.
    """
    spec = _BY_KEY.get(key)
    if spec is None:
        raise ConfigurationError(f"Unknown option {PREFIX}{key}.{_did_you_mean(key)}")
    return _convert(spec, raw)


#: How close (difflib's ratio) an unknown key must be to `enabled` to be taken for a typo
#: of the switch: `enable` 0.92, `Enabled` 0.86, `enabaled` 0.93; not `disabled`,
#: `ssl.enabled`, `table` or `named` (0.67-0.78: those are refused once the switch is on).
SWITCH_TYPO_CUTOFF = 0.85


def misspelled_switch(keys: Any) -> str | None:
    """The first of `keys` (full Flink keys) that is an unknown `state.backend.ndb.*` key
    that reads as a typo of `enabled` (`state.backend.ndb.enable`; at least
    :data:`SWITCH_TYPO_CUTOFF` alike), or None. Where the
    switch is not set, such a key would leave the job on Flink's own state without a word
    (found by a new user); the switch refuses it (:func:`pyflink_ndb.api.switch.enabled`)."""
    for key in keys:
        key = str(key)
        if key.startswith(PREFIX) and key[len(PREFIX):] not in _BY_KEY and \
                difflib.get_close_matches(key[len(PREFIX):], ["enabled"], n=1,
                                          cutoff=SWITCH_TYPO_CUTOFF):
            return key
    return None


def _did_you_mean(key: str) -> str:
    """" Did you mean …?" with the nearest known key (without the prefix), or ""."""
    near = difflib.get_close_matches(key, list(_BY_KEY), n=1, cutoff=0.6)
    return f" Did you mean {PREFIX}{near[0]}?" if near else ""


#: Flink's own keys of the number of retained checkpoints, the 1.20 name first
#: (`execution.checkpointing.num-retained`, formerly `state.checkpoints.num-retained`).
FLINK_RETAINED_KEYS = ("execution.checkpointing.num-retained", "state.checkpoints.num-retained")


def flink_retained(source: Mapping[str, Any]) -> Any:
    """Flink's number of retained checkpoints in one mapping of Flink keys (the 1.20 name
    over the deprecated one, :data:`FLINK_RETAINED_KEYS`), or None when it sets neither."""
    for key in FLINK_RETAINED_KEYS:
        if source.get(key) is not None:
            return source[key]
    return None


def from_flink_keys(*sources: Mapping[str, Any]) -> NdbStateOptions:
    """Build options from mappings of Flink keys; later sources override earlier ones.

    Keys outside `state.backend.ndb.` are ignored, except Flink's number of retained
    checkpoints (:data:`FLINK_RETAINED_KEYS`; within one source the 1.20 name wins over
    the deprecated one) which gives the default of `checkpoints.retained`.

    :raises ConfigurationError: an unknown `state.backend.ndb.*` key (the message lists the
        known ones) or a value of the wrong kind.
    """
    values: dict[str, Any] = {}
    retained_by_flink: Any = None
    for source in sources:
        in_source = flink_retained(source)
        if in_source is not None:
            retained_by_flink = in_source
        for key, raw in source.items():
            if key in FLINK_RETAINED_KEYS or not key.startswith(PREFIX):
                continue
            short = key[len(PREFIX):]
            spec = _BY_KEY.get(short)
            if spec is None:
                raise ConfigurationError(
                    f"Unknown option {key!r}.{_did_you_mean(short)} Known options: "
                    f"{', '.join(KNOWN_KEYS)}.")
            if raw is None:
                continue  # not set: the default (or an earlier source) stays
            values[spec.field] = _convert(spec, raw)
    if values.get("checkpoints_retained") is None and retained_by_flink is not None:
        values["checkpoints_retained"] = _convert(_BY_KEY["checkpoints.retained"],
                                                  retained_by_flink)
    return NdbStateOptions(**values)


def to_flink_keys(options: NdbStateOptions) -> dict[str, Any]:
    """The options that differ from the defaults, as `state.backend.ndb.*` keys."""
    out: dict[str, Any] = {}
    for spec in OPTIONS:
        value = getattr(options, spec.field)
        if value != spec.default:
            out[PREFIX + spec.key] = value
    return out


def redact_url(url: str) -> str:
    """The URL with any password replaced by `***`, safe for logs and messages."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def resolve_sqlite_url(url: str, base: Path | None = None) -> str:
    """Make the path of a `sqlite:///relative` URL absolute against `base` (default: cwd).

    The TaskManager's embedded interpreter may run in another working directory, so the
    client resolves the path when it builds the job.
    """
    if not url.startswith("sqlite:///"):
        return url
    path = url[len("sqlite:///"):]
    if path == ":memory:" or os.path.isabs(path):
        return url
    return "sqlite:///" + str(((base or Path.cwd()) / path).resolve())
