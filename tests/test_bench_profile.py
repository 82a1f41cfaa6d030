"""bench/profile.py's reading of a variant's checkpoint interval (`--flink-conf
execution.checkpointing.interval=…`), which replaces the interval the job sets itself."""
import pytest

from bench.profile import duration_ms


@pytest.mark.parametrize(("text", "ms"), [("1000", 1_000), ("500 ms", 500), ("30 s", 30_000),
                                          ("10min", 600_000)])
def test_a_flink_duration_in_milliseconds(text, ms):
    assert duration_ms(text) == ms


def test_an_unknown_unit_is_refused_with_the_forms_it_takes():
    with pytest.raises(ValueError, match=r"'1h' \(e.g. 1000, 30 s, 10min\)"):
        duration_ms("1h")
