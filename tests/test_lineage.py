"""Versions, ranges, lineages and owner maps (pyflink_ndb.stores.lineage), and the DDL of
the MySQL-protocol driver: pure functions, no database."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflink_ndb.errors import CheckpointError
from pyflink_ndb.stores.lineage import (
    MAX_EPOCH,
    Descriptor,
    Lineage,
    Segment,
    Token,
    claim_owners,
    complement,
    fresh_lineage,
    in_ranges,
    is_current,
    lineage_from_tokens,
    normalize,
    own_range,
    owner_branches,
    owners_from_json,
    owners_to_json,
    owns,
    split_version,
    subtract,
    version_of,
)
from pyflink_ndb.stores.mysql import MysqlStateStore, mysql_ddl

# -- versions ---------------------------------------------------------------------------

def test_version_is_branch_high_epoch_low() -> None:
    assert version_of(0, 0) == 0
    assert version_of(1, 0) == 1 << 32
    assert version_of(3, 7) == (3 << 32) | 7
    assert version_of(3, MAX_EPOCH) == (3 << 32) | 0xFFFFFFFF
    assert split_version(version_of(12345, 678)) == (12345, 678)
    assert split_version(version_of(2, MAX_EPOCH)) == (2, MAX_EPOCH)
    # Every epoch of a branch sorts below every epoch of a later branch.
    assert version_of(4, MAX_EPOCH) < version_of(5, 0)
    assert version_of(4, 1) < version_of(4, 2)


@pytest.mark.parametrize("epoch", [-1, MAX_EPOCH + 1, 1 << 40])
def test_version_of_refuses_epochs_outside_32_bits(epoch: int) -> None:
    with pytest.raises(CheckpointError, match="32-bit"):
        version_of(1, epoch)


def test_own_range_and_in_ranges() -> None:
    assert own_range(2) == (2 << 32, (2 << 32) | MAX_EPOCH)
    assert own_range(2, 5) == (2 << 32, (2 << 32) | 5)
    ranges = (own_range(1, 3), own_range(2))
    assert in_ranges(version_of(1, 3), ranges)
    assert not in_ranges(version_of(1, 4), ranges)
    assert in_ranges(version_of(2, MAX_EPOCH), ranges)
    assert not in_ranges(version_of(3, 0), ranges)
    assert not in_ranges(version_of(1, 0), ())


# -- range arithmetic -------------------------------------------------------------------

def test_normalize_sorts_and_merges_overlapping_and_adjacent_ranges() -> None:
    assert normalize([]) == ()
    assert normalize([(5, 7), (1, 2), (3, 4), (10, 12), (11, 20)]) == ((1, 7), (10, 20))
    assert normalize([(1, 2), (4, 5)]) == ((1, 2), (4, 5))
    assert normalize([(1, 10), (2, 3)]) == ((1, 10),)
    assert normalize([(0, 0), (0, 0)]) == ((0, 0),)


def test_complement() -> None:
    assert complement([], 0, 10) == ((0, 10),)
    assert complement([(3, 5)], 0, 10) == ((0, 2), (6, 10))
    assert complement([(0, 4)], 2, 10) == ((5, 10),)
    assert complement([(8, 20)], 0, 10) == ((0, 7),)
    assert complement([(0, 10)], 0, 10) == ()
    assert complement([(20, 30), (-5, -1)], 0, 10) == ((0, 10),)
    assert complement([(6, 7), (2, 3), (3, 4)], 0, 10) == ((0, 1), (5, 5), (8, 10))


def test_subtract() -> None:
    assert subtract(((0, 10), (20, 30)), ((5, 25),)) == ((0, 4), (26, 30))
    assert subtract(((0, 10),), ()) == ((0, 10),)
    assert subtract(((0, 10),), ((0, 10),)) == ()
    assert subtract((), ((0, 10),)) == ()


small_ranges = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)).map(
    lambda t: (min(t), max(t))), max_size=6)


def members(ranges: object) -> set[int]:
    return {v for lo, hi in ranges for v in range(lo, hi + 1)}  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(covered=small_ranges, removed=small_ranges, lo=st.integers(0, 40),
       hi=st.integers(0, 40))
def test_range_arithmetic_matches_set_arithmetic(covered: list[tuple[int, int]],
                                                 removed: list[tuple[int, int]],
                                                 lo: int, hi: int) -> None:
    merged = normalize(covered)
    assert members(merged) == members(covered)
    # Sorted, disjoint and not adjacent: the shortest list of the same versions.
    assert all(a[1] + 1 < b[0] for a, b in zip(merged, merged[1:], strict=False))
    assert all(a <= b for a, b in merged)
    gaps = complement(covered, lo, hi)
    assert members(gaps) == set(range(lo, hi + 1)) - members(covered)
    assert all(a <= b for a, b in gaps)
    assert members(subtract(merged, tuple(removed))) == members(covered) - members(removed)


# -- tokens and descriptors -------------------------------------------------------------

def test_token_round_trip_and_bad_tokens() -> None:
    token = Token(7, 42, 0, 63)
    assert Token.from_json(token.to_json()) == token
    assert token.version == version_of(7, 42)
    for bad in ['{"fmt":1,"branch":7,"epoch":42,"kg":[0,63]}', "not json", "{}",
                '{"fmt":2,"branch":7}', '{"fmt":2,"branch":7,"epoch":1,"kg":[0]}']:
        with pytest.raises(CheckpointError, match="token"):
            Token.from_json(bad)


def test_descriptor_round_trip_and_checkpoint_id() -> None:
    descriptor = Descriptor((Token(1, 5, 0, 63), Token(2, 9, 64, 127)))
    assert Descriptor.from_json(descriptor.to_json()) == descriptor
    assert descriptor.checkpoint_id == 9
    assert Descriptor(()).checkpoint_id == 0
    assert Descriptor.from_json(None) is None
    assert Descriptor.from_json("") is None
    assert Descriptor.from_json("[]") is None


# -- lineages ---------------------------------------------------------------------------

def test_fresh_lineage_sees_only_its_own_versions() -> None:
    lineage = fresh_lineage(4, 0, 127)
    assert lineage.head(0) == (own_range(4),)
    assert lineage.at(127, 3) == (own_range(4, 3),)
    with pytest.raises(CheckpointError, match="does not cover key group 128"):
        lineage.head(128)


def test_lineage_json_round_trip() -> None:
    lineage = Lineage(9, 0, 127, (Segment(0, 42, (own_range(1, 5), own_range(3, 9))),
                                  Segment(43, 127, (own_range(2, 5),))))
    assert Lineage.from_json(9, 0, 127, lineage.to_json()) == lineage


KG_END = 127  # max parallelism 128


def test_lineage_over_a_rescale_from_two_to_three_subtasks() -> None:
    parents = {1: fresh_lineage(1, 0, 63), 2: fresh_lineage(2, 64, KG_END)}
    tokens = [Token(2, 5, 64, KG_END), Token(1, 5, 0, 63)]  # in any order
    first = lineage_from_tokens(3, 0, 42, tokens, parents)
    middle = lineage_from_tokens(4, 43, 85, tokens, parents)
    last = lineage_from_tokens(5, 86, KG_END, tokens, parents)
    assert first.segments == (Segment(0, 42, (own_range(1, 5),)),)
    # The middle subtask's key groups came from both old subtasks.
    assert middle.segments == (Segment(43, 63, (own_range(1, 5),)),
                               Segment(64, 85, (own_range(2, 5),)))
    assert last.segments == (Segment(86, KG_END, (own_range(2, 5),)),)
    assert middle.head(63) == (own_range(1, 5), own_range(4))
    assert middle.head(64) == (own_range(2, 5), own_range(4))
    assert middle.at(64, 8) == (own_range(2, 5), own_range(4, 8))
    # Versions of the old branches after the restored checkpoint are invisible.
    assert not in_ranges(version_of(1, 6), middle.head(50))
    assert in_ranges(version_of(1, 5), middle.head(50))
    assert not in_ranges(version_of(2, 5), middle.head(50))


def test_lineage_over_a_rescale_from_three_to_one_subtask() -> None:
    parents = {1: fresh_lineage(1, 0, 63), 2: fresh_lineage(2, 64, KG_END)}
    tokens = [Token(1, 5, 0, 63), Token(2, 5, 64, KG_END)]
    three = {3: lineage_from_tokens(3, 0, 42, tokens, parents),
             4: lineage_from_tokens(4, 43, 85, tokens, parents),
             5: lineage_from_tokens(5, 86, KG_END, tokens, parents)}
    one = lineage_from_tokens(6, 0, KG_END, [Token(3, 9, 0, 42), Token(4, 9, 43, 85),
                                             Token(5, 9, 86, KG_END)], three)
    assert one.segments == (
        Segment(0, 42, (own_range(1, 5), own_range(3, 9))),
        Segment(43, 63, (own_range(1, 5), own_range(4, 9))),
        Segment(64, 85, (own_range(2, 5), own_range(4, 9))),
        Segment(86, KG_END, (own_range(2, 5), own_range(5, 9))))
    assert one.head(70) == (own_range(2, 5), own_range(4, 9), own_range(6))


def test_lineage_merges_adjacent_segments_that_see_the_same_ranges() -> None:
    parent = Lineage(1, 0, KG_END, (Segment(0, 63, ()), Segment(64, KG_END, ())))
    child = lineage_from_tokens(2, 0, KG_END, [Token(1, 5, 0, KG_END)], {1: parent})
    assert child.segments == (Segment(0, KG_END, (own_range(1, 5),)),)


@pytest.mark.parametrize("tokens", [
    pytest.param([], id="no-token"),
    pytest.param([Token(1, 5, 0, 50), Token(2, 5, 64, KG_END)], id="gap"),
    pytest.param([Token(1, 5, 0, 63), Token(2, 5, 32, KG_END)], id="overlap"),
    pytest.param([Token(1, 5, 0, 63)], id="another-max-parallelism"),
])
def test_lineage_from_tokens_that_do_not_cover_every_key_group_once(
        tokens: list[Token]) -> None:
    parents = {1: fresh_lineage(1, 0, KG_END), 2: fresh_lineage(2, 0, KG_END)}
    with pytest.raises(CheckpointError, match="exactly once"):
        lineage_from_tokens(3, 0, KG_END, tokens, parents)


def test_lineage_from_tokens_that_overlap_after_full_coverage() -> None:
    parents = {1: fresh_lineage(1, 0, KG_END), 2: fresh_lineage(2, 0, KG_END)}
    with pytest.raises(CheckpointError, match="exactly once"):
        lineage_from_tokens(3, 0, 63, [Token(1, 5, 0, 63), Token(2, 5, 60, KG_END)], parents)


def test_lineage_from_a_token_whose_branch_lacks_key_groups() -> None:
    # The token claims key groups its branch never covered: not a valid restore either.
    parents = {1: fresh_lineage(1, 0, 63)}
    with pytest.raises(CheckpointError, match="exactly once"):
        lineage_from_tokens(2, 0, KG_END, [Token(1, 5, 0, KG_END)], parents)


# -- owner maps -------------------------------------------------------------------------

def test_claim_owners_splits_and_replaces_segments() -> None:
    owners = claim_owners((), 0, 63, 1)
    assert owners == ((0, 63, 1),)
    owners = claim_owners(owners, 64, KG_END, 2)
    assert owners == ((0, 63, 1), (64, KG_END, 2))
    # A rescale: the middle subtask takes key groups from both.
    owners = claim_owners(owners, 43, 85, 3)
    assert owners == ((0, 42, 1), (43, 85, 3), (86, KG_END, 2))
    assert claim_owners(owners, 10, 20, 4) == (
        (0, 9, 1), (10, 20, 4), (21, 42, 1), (43, 85, 3), (86, KG_END, 2))
    assert claim_owners(owners, 0, KG_END, 5) == ((0, KG_END, 5),)
    assert owner_branches(owners) == {1, 2, 3}
    assert owners_from_json(owners_to_json(owners)) == owners
    assert owners_from_json(None) == () == owners_from_json("")


def test_owns() -> None:
    owners = ((0, 42, 1), (43, 85, 3), (86, KG_END, 2))
    assert owns(owners, 0, 42, 1)
    assert owns(owners, 5, 9, 1)
    assert owns(owners, 43, 85, 3)
    assert not owns(owners, 0, 43, 1)
    assert not owns(owners, 43, 85, 1)
    assert not owns(owners, 80, 90, 3)
    assert not owns((), 0, 0, 1)
    # A hole in one branch's key groups is not ownership of the whole range.
    assert not owns(((0, 10, 1), (12, 20, 1)), 0, 20, 1)
    assert owns(((0, 10, 1), (11, 20, 1)), 0, 20, 1)
    assert not owns(((0, 10, 1),), 0, 20, 1)


def test_is_current() -> None:
    owners = ((0, 63, 1), (64, KG_END, 2))
    committed = Descriptor((Token(1, 5, 0, 63), Token(2, 5, 64, KG_END)))
    assert is_current(committed, owners)
    assert not is_current(None, owners)
    # A new attempt of one subtask: the descriptor is no longer of the attempts running.
    assert not is_current(committed, claim_owners(owners, 0, 63, 3))
    assert not is_current(committed, claim_owners(owners, 60, 70, 3))
    assert is_current(Descriptor((Token(3, 1, 0, 63), Token(2, 5, 64, KG_END))),
                      claim_owners(owners, 0, 63, 3))


# -- MySQL-protocol DDL -----------------------------------------------------------------

def ddl(ndb: bool) -> dict[str, str]:
    store = MysqlStateStore("mysql://root@127.0.0.1:1/test", "ddl_ns")  # never connects
    statements = mysql_ddl(store, ndb=ndb)
    by_table = {s.split()[5]: s for s in statements}
    assert set(by_table) == {store.t_state, store.t_branches, store.t_snapshots,
                             store.t_operators, store.t_catalog}
    return by_table


def test_ndb_ddl_partitions_the_state_table_by_key_group() -> None:
    tables = ddl(ndb=True)
    state = tables["ddl_ns_state"]
    assert "ENGINE=NDBCLUSTER" in state
    assert state.rstrip().endswith("PARTITION BY KEY (key_group)")
    assert "PRIMARY KEY (key_group, state_id, ukey, version, chunk)" in state
    assert "version BIGINT NOT NULL" in state
    for text in tables.values():
        assert "ENGINE=NDBCLUSTER" in text
        assert "innodb" not in text.lower()


def test_innodb_ddl_has_no_partitioning() -> None:
    tables = ddl(ndb=False)
    assert "PRIMARY KEY (key_group, state_id, ukey, version, chunk)" in tables["ddl_ns_state"]
    for text in tables.values():
        assert "ENGINE=InnoDB" in text
        assert "NDBCLUSTER" not in text
        assert "PARTITION" not in text
