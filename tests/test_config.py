"""Options: unknown keys, bad values, secrets, SQLite URL resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyflink_ndb.config import (
    DEFAULT_URL,
    KNOWN_KEYS,
    OPTIONS,
    NdbStateOptions,
    from_flink_keys,
    option_value,
    redact_url,
    resolve_sqlite_url,
    to_flink_keys,
)
from pyflink_ndb.errors import ConfigurationError, NdbStateError
from pyflink_ndb.stores.factory import create_store

P = "state.backend.ndb."


def test_unknown_key_lists_the_known_keys() -> None:
    with pytest.raises(ConfigurationError) as info:
        from_flink_keys({P + "bogus": "1"})
    message = str(info.value)
    assert P + "bogus" in message
    for key in KNOWN_KEYS:
        assert key in message
    assert isinstance(info.value, NdbStateError) and isinstance(info.value, ValueError)


def test_known_keys_cover_every_option_field() -> None:
    import dataclasses

    fields = {f.name for f in dataclasses.fields(NdbStateOptions)}
    assert {spec.field for spec in OPTIONS} == fields
    assert len(set(KNOWN_KEYS)) == len(KNOWN_KEYS) == len(OPTIONS)
    assert all(key.startswith(P) for key in KNOWN_KEYS)


def test_other_keys_are_ignored_and_later_sources_win() -> None:
    options = from_flink_keys(
        {"parallelism.default": "4", P + "cache.max-entries": "5", P + "namespace": "a"},
        {P + "cache.max-entries": 7})
    assert options.cache_max_entries == 7
    assert options.namespace == "a"
    assert options.url == DEFAULT_URL


@pytest.mark.parametrize(("key", "raw", "expected"), [
    ("cache.max-entries", " 12 ", 12),
    ("local.enabled", "false", False),
    ("local.enabled", "TRUE", True),
    ("local.enabled", "0", False),
    ("local.enabled", True, True),
    ("write.batch-size", 3, 3),
    ("restore.mode", "eager", "eager"),
    ("on-fresh-start", "truncate", "truncate"),
    ("checkpoints.retained", "3", 3),
    ("value.max-bytes", "1048576", 1_048_576),
    ("local.dir", "/tmp/x", "/tmp/x"),
    ("write.process", "AUTO", "auto"),
    ("write.process", "True", "true"),
    ("write.process", "no", "false"),
    ("write.process", False, "false"),
    ("write.process-connections", "3", 3),
])
def test_values_are_converted(key: str, raw: object, expected: object) -> None:
    options = from_flink_keys({P + key: raw})
    field = next(spec.field for spec in OPTIONS if spec.key == key)
    assert getattr(options, field) == expected


@pytest.mark.parametrize(("key", "raw", "needle"), [
    ("cache.max-entries", "many", "whole number"),
    ("cache.max-entries", "1.5", "whole number"),
    ("cache.max-entries", "0", "at least 1"),
    ("write.batch-size", "-1", "at least 1"),
    ("value.max-bytes", "0", "at least 1"),
    ("checkpoints.retained", "0", "at least 1"),
    ("bundle.records", "-1", "at least 0"),
    ("bundle.max-wait-ms", "0", "at least 1"),
    ("checkpoints.retained", "all", "whole number"),
    ("local.enabled", "maybe", "true or false"),
    ("restore.key-filter", "maybe", "set it to true or false"),
    ("restore.key-filter", "off", "default: true"),
    ("cache.max-entries", "lots", "default: 10000"),
    ("restore.mode", "fast", "lazy"),
    ("on-fresh-start", "ignore", "truncate"),
    ("namespace", "Bad-Name", "namespace"),
    ("namespace", "", "namespace"),
    ("namespace", "x" * 41, "namespace"),
    ("namespace", "1abc", "namespace"),
    ("url", "postgres://h/db", "mysql://"),
    ("write.process", "sometimes",
     "`auto`, `true` or `false` (also accepted: yes/no, 1/0, any case) (default: auto)"),
])
def test_bad_values_are_configuration_errors(key: str, raw: str, needle: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        from_flink_keys({P + key: raw})
    message = str(info.value)
    assert needle in message
    assert P + key in message or key == "url"
    # No chained "ValueError: maybe" traceback before it (a fresh user's finding).
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_a_value_of_none_means_not_set() -> None:
    options = from_flink_keys({P + "restore.key-filter": None, P + "url": None,
                               P + "cache.max-entries": None})
    assert options.restore_key_filter is True
    assert options.url == NdbStateOptions().url
    assert options.cache_max_entries == NdbStateOptions().cache_max_entries
    # An earlier source's value stays when a later one has None.
    assert from_flink_keys({P + "restore.key-filter": "false"},
                           {P + "restore.key-filter": None}).restore_key_filter is False


@pytest.mark.parametrize(("setting", "cpus", "wanted"), [
    ("auto", 1.0, False), ("auto", 1.5, False), ("auto", 2.0, True), ("auto", 8.0, True),
    ("true", 1.0, True), ("false", 8.0, False),
])
def test_write_process_auto_asks_for_two_cpus(setting: str, cpus: float,
                                              wanted: bool) -> None:
    """`write.process` defaults to `auto`: on where the TaskManager may use 2 CPUs."""
    assert NdbStateOptions().write_process == "auto"
    assert NdbStateOptions(write_process=setting).write_process_wanted(cpus) is wanted
    # A bool given in code reads as its text.
    assert NdbStateOptions(write_process=True).write_process == "true"  # type: ignore[arg-type]


def test_constructor_refuses_a_non_boolean_for_a_boolean_option() -> None:
    with pytest.raises(ConfigurationError,
                       match="restore.key-filter='maybe' is not allowed: it must be true or "
                             "false"):
        NdbStateOptions(restore_key_filter="maybe")  # type: ignore[arg-type]


@pytest.mark.parametrize(("key", "raw", "message"), [
    ("cache.max-entries", "-5", "state.backend.ndb.cache.max-entries=-5 is not allowed: it "
                                "must be at least 1 (default: 10000)."),
    ("read-ahead.records", "-1", "state.backend.ndb.read-ahead.records=-1 is not allowed: "
                                 "it must be at least 0 (default: 100)."),
    ("restore.mode", "fast", "state.backend.ndb.restore.mode='fast' is not allowed: it must "
                             "be `lazy`, `eager` or `background` (default: lazy)."),
    ("checkpoints.retained", "0", "state.backend.ndb.checkpoints.retained=0 is not allowed: "
                                  "it must be at least 1 (default: none)."),
    ("write.process-connections", "0", "state.backend.ndb.write.process-connections=0 is "
                                       "not allowed: it must be from 1 to 16 (default: 2)."),
    ("write.process-connections", "17", "state.backend.ndb.write.process-connections=17 is "
                                        "not allowed: it must be from 1 to 16 (default: 2)."),
])
def test_an_out_of_range_value_is_named_with_the_rule_and_the_default(
        key: str, raw: str, message: str) -> None:
    """A fresh user's report: `cache.max-entries: -5` was refused without naming -5."""
    with pytest.raises(ConfigurationError) as info:
        from_flink_keys({P + key: raw})
    assert str(info.value) == message


@pytest.mark.parametrize(("typo", "nearest"), [
    ("cache.max-entry", "cache.max-entries"),
    ("restore-mode", "restore.mode"),
    ("write.asynch", "write.async"),
])
def test_a_misspelled_key_names_the_nearest_known_key(typo: str, nearest: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        from_flink_keys({P + typo: "1"})
    assert f"Unknown option '{P}{typo}'. Did you mean {P}{nearest}?" in str(info.value)
    with pytest.raises(ConfigurationError, match=f"Did you mean {P}{nearest}"):
        option_value(typo, "1")


def test_an_unknown_key_far_from_every_known_one_gets_no_guess() -> None:
    with pytest.raises(ConfigurationError) as info:
        from_flink_keys({P + "zzzz": "1"})
    assert "Did you mean" not in str(info.value)
    assert "Known options:" in str(info.value)


def test_flink_num_retained_is_the_default_of_checkpoints_retained() -> None:
    assert from_flink_keys({}).checkpoints_retained is None
    assert from_flink_keys({"state.checkpoints.num-retained": "4"}).checkpoints_retained == 4
    assert from_flink_keys({"state.checkpoints.num-retained": "4",
                            P + "checkpoints.retained": "2"}).checkpoints_retained == 2


def test_round_trip_through_flink_keys() -> None:
    options = NdbStateOptions(url="sqlite:///tmp/x.db", namespace="ns1", cache_max_entries=3,
                              local_enabled=False, restore_mode="eager",
                              on_fresh_start="resume", checkpoints_retained=2,
                              value_max_bytes=99, write_batch_rows=11)
    assert from_flink_keys(to_flink_keys(options)) == options
    assert to_flink_keys(NdbStateOptions()) == {}
    assert options.replace(cache_max_entries=4).cache_max_entries == 4
    with pytest.raises(ConfigurationError):
        options.replace(cache_max_entries=0)


# -- secrets ----------------------------------------------------------------------------

def test_password_never_in_repr() -> None:
    options = NdbStateOptions(url="mysql://app@db:3306/state", password="Pa55-w0rd!")
    assert "Pa55-w0rd!" not in repr(options)
    assert "Pa55-w0rd!" not in str(options)
    assert options.resolve_password() == "Pa55-w0rd!"


def test_password_inside_the_url_never_in_repr() -> None:
    options = NdbStateOptions(url="mysql://app:Pa55-w0rd!@db:3306/state")
    assert "Pa55-w0rd!" not in repr(options)
    assert "app" in repr(options) and "db:3306" in repr(options)


def test_redact_url() -> None:
    assert redact_url("mysql://u:secret@h:1/db") == "mysql://u:***@h:1/db"
    assert redact_url("mysql://u@h:1/db") == "mysql://u@h:1/db"
    assert redact_url("sqlite:///a/b") == "sqlite:///a/b"


def test_bad_url_message_hides_the_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        NdbStateOptions(url="postgres://u:Pa55-w0rd!@h/db")
    assert "Pa55-w0rd!" not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        create_store(NdbStateOptions(url="mysql://u:Pa55-w0rd!@/nodb"))
    assert "Pa55-w0rd!" not in str(info.value)


def test_mysql_store_description_hides_the_password() -> None:
    store = create_store(NdbStateOptions(url="mysql://u:Pa55-w0rd!@h:3307/db",
                                         password="0ther-Secret"))
    assert "Pa55-w0rd!" not in store.describe()
    assert "0ther-Secret" not in store.describe()
    assert "h:3307" in store.describe()


def test_password_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\nsecond line\n")
    assert NdbStateOptions(password_file=str(secret)).resolve_password() == "from-file"
    monkeypatch.setenv("PYFLINK_NDB_TEST_PW", "from-env")
    assert NdbStateOptions(password_env="PYFLINK_NDB_TEST_PW").resolve_password() == "from-env"
    # `password` wins over the file, the file over the variable.
    assert NdbStateOptions(password="direct", password_file=str(secret),
                           password_env="PYFLINK_NDB_TEST_PW").resolve_password() == "direct"
    assert NdbStateOptions(password_file=str(secret),
                           password_env="PYFLINK_NDB_TEST_PW").resolve_password() == "from-file"
    assert NdbStateOptions().resolve_password() is None

    with pytest.raises(ConfigurationError, match="password-file"):
        NdbStateOptions(password_file=str(tmp_path / "missing")).resolve_password()
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigurationError, match="password-file"):
        NdbStateOptions(password_file=str(tmp_path / "empty")).resolve_password()
    monkeypatch.delenv("PYFLINK_NDB_TEST_PW")
    with pytest.raises(ConfigurationError, match="password-env"):
        NdbStateOptions(password_env="PYFLINK_NDB_TEST_PW").resolve_password()


# -- SQLite URLs --------------------------------------------------------------------------

def test_sqlite_relative_url_is_resolved_against_base(tmp_path: Path) -> None:
    assert resolve_sqlite_url("sqlite:///state/x.db", base=tmp_path) == \
        f"sqlite:///{tmp_path / 'state' / 'x.db'}"
    assert resolve_sqlite_url("sqlite:///../x.db", base=tmp_path / "a") == \
        f"sqlite:///{tmp_path / 'x.db'}"


def test_sqlite_relative_url_defaults_to_cwd(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    resolved = resolve_sqlite_url(DEFAULT_URL)
    assert resolved == f"sqlite:///{tmp_path.resolve() / 'pyflink-ndb-state.sqlite'}"
    assert Path(resolved[len("sqlite:///"):]).is_absolute()


def test_sqlite_absolute_memory_and_mysql_urls_are_unchanged(tmp_path: Path) -> None:
    absolute = f"sqlite:///{tmp_path / 'x.db'}"
    assert resolve_sqlite_url(absolute, base=Path("/elsewhere")) == absolute
    assert resolve_sqlite_url("sqlite:///:memory:") == "sqlite:///:memory:"
    assert resolve_sqlite_url("mysql://u@h/db") == "mysql://u@h/db"


def test_resolved_sqlite_url_opens_where_resolved(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    url = resolve_sqlite_url("sqlite:///sub/state.sqlite", base=tmp_path)
    monkeypatch.chdir("/")
    store = create_store(NdbStateOptions(url=url, namespace="cfg"))
    store.open()
    try:
        sid = store.register_state("op", "s", "value", "pickle-5", None)
        assert [c["state_id"] for c in store.catalog("op")] == [sid]
    finally:
        store.close()
    assert (tmp_path / "sub" / "state.sqlite").exists()


def test_only_a_typo_of_the_switch_reads_as_the_switch():
    from pyflink_ndb.config import misspelled_switch

    for typo in ("enable", "Enabled", "enabaled", "enabeld"):
        assert misspelled_switch([f"state.backend.ndb.{typo}"]) == f"state.backend.ndb.{typo}"
    others = ["state.backend.ndb." + k for k in ("disabled", "ssl.enabled", "table", "named",
                                                 "enabled", "url", "namspace")]
    assert misspelled_switch(others + ["execution.enable"]) is None
