"""Versions, branches and what a branch or snapshot sees (docs/protocol.md, "Visibility").

A row's `version` is `branch << 32 | epoch`. A branch belongs to one subtask attempt; in
each key-group segment it inherits closed version ranges from its parent snapshot and
adds its own `[branch << 32, branch << 32 | MAX_EPOCH]`. Nothing here touches a database.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pyflink_ndb.errors import CheckpointError

EPOCH_BITS = 32
#: Largest epoch (Flink checkpoint id) a version can carry.
MAX_EPOCH = (1 << EPOCH_BITS) - 1
#: Token format written into Flink's union list state.
TOKEN_FORMAT = 2

Range = tuple[int, int]  # inclusive bounds on `version`
Ranges = tuple[Range, ...]


def version_of(branch: int, epoch: int) -> int:
    """The row version of `epoch` on `branch`.

    :raises CheckpointError: the epoch does not fit in 32 bits.
    """
    if not 0 <= epoch <= MAX_EPOCH:
        raise CheckpointError(f"Epoch {epoch} is outside 0..{MAX_EPOCH}; pyflink-ndb "
                              "versions hold 32-bit checkpoint ids.")
    return (branch << EPOCH_BITS) | epoch


def split_version(version: int) -> tuple[int, int]:
    """(branch, epoch) of a row version."""
    return version >> EPOCH_BITS, version & MAX_EPOCH


def own_range(branch: int, epoch: int = MAX_EPOCH) -> Range:
    """The versions of `branch` up to `epoch`."""
    return version_of(branch, 0), version_of(branch, epoch)


def in_ranges(version: int, ranges: Ranges) -> bool:
    for lo, hi in ranges:  # a loop, not any(): this runs per entry in garbage collection
        if lo <= version <= hi:
            return True
    return False


def normalize(ranges: Iterable[Range]) -> Ranges:
    """Sorted, with overlapping or adjacent ranges merged."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def complement(covered: Iterable[Range], lo: int, hi: int) -> Ranges:
    """The parts of `[lo, hi]` outside every range of `covered`."""
    out: list[Range] = []
    cursor = lo
    for a, b in normalize(covered):
        if b < cursor:
            continue
        if a > hi:
            break
        if a > cursor:
            out.append((cursor, a - 1))
        cursor = max(cursor, b + 1)
    if cursor <= hi:
        out.append((cursor, hi))
    return tuple(out)


def subtract(ranges: Ranges, removed: Ranges) -> Ranges:
    """`ranges` without the versions in `removed`."""
    out: list[Range] = []
    for lo, hi in ranges:
        out.extend(complement(removed, lo, hi))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Token:
    """What one subtask's snapshot stores in Flink's union list state: the branch and
    epoch of the snapshot and the key groups it covers. Flink hands the tokens of the
    restored snapshot back, so a restore knows exactly which snapshot it restores.

    `nonce`: the random identity of the branch that took the snapshot (recorded in its
    branch row's origin at the claim). Branch ids count from 1 in every namespace and
    start again after a `drop`: without it, a savepoint restored into another namespace,
    or into its own after it was dropped and used again, found a branch and epoch of the
    same numbers there and restored another run's state without a word (a breaker's
    find, 2026-12-07). None: a token written before the nonce (not checked). Not part of
    the token's equality (a token built from the owner row has none)."""

    branch: int
    epoch: int
    kg_start: int
    kg_end: int
    nonce: str | None = field(default=None, compare=False)

    def to_json(self) -> str:
        data: dict[str, object] = {"fmt": TOKEN_FORMAT, "branch": self.branch,
                                   "epoch": self.epoch, "kg": [self.kg_start, self.kg_end]}
        if self.nonce is not None:
            data["nonce"] = self.nonce
        return json.dumps(data, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> Token:
        """:raises CheckpointError: not a token of this format."""
        try:
            data = json.loads(text)
            if data.get("fmt") != TOKEN_FORMAT:
                raise ValueError(f"token format {data.get('fmt')!r}")
            nonce = data.get("nonce")
            return Token(int(data["branch"]), int(data["epoch"]), int(data["kg"][0]),
                         int(data["kg"][1]), None if nonce is None else str(nonce))
        except (ValueError, KeyError, TypeError, IndexError) as err:
            raise CheckpointError(
                f"The restored checkpoint carries a pyflink-ndb token this version cannot "
                f"read ({err}): {text[:200]!r}.") from err

    @property
    def version(self) -> int:
        return version_of(self.branch, self.epoch)


@dataclass(frozen=True, slots=True)
class Segment:
    """Key groups `kg_start..kg_end` of a branch and the ranges it inherited there."""

    kg_start: int
    kg_end: int
    inherited: Ranges


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a branch's key groups come from: per segment the inherited version ranges."""

    branch: int
    kg_start: int
    kg_end: int
    segments: tuple[Segment, ...]

    def segment(self, key_group: int) -> Segment:
        for seg in self.segments:
            if seg.kg_start <= key_group <= seg.kg_end:
                return seg
        raise CheckpointError(f"Branch {self.branch} does not cover key group {key_group} "
                              f"(it covers {self.kg_start}-{self.kg_end}).")

    def head(self, key_group: int) -> Ranges:
        """The ranges the branch's running attempt reads in `key_group`."""
        return self.segment(key_group).inherited + (own_range(self.branch),)

    def at(self, key_group: int, epoch: int) -> Ranges:
        """The ranges snapshot `(branch, epoch)` sees in `key_group`."""
        return self.segment(key_group).inherited + (own_range(self.branch, epoch),)

    def to_json(self) -> str:
        return json.dumps([[s.kg_start, s.kg_end, [list(r) for r in s.inherited]]
                           for s in self.segments], separators=(",", ":"))

    @staticmethod
    def from_json(branch: int, kg_start: int, kg_end: int, text: str) -> Lineage:
        segments = tuple(Segment(int(a), int(b), tuple((int(lo), int(hi)) for lo, hi in r))
                         for a, b, r in json.loads(text))
        return Lineage(branch, kg_start, kg_end, segments)


def fresh_lineage(branch: int, kg_start: int, kg_end: int) -> Lineage:
    """A branch that inherits nothing (fresh start, truncate)."""
    return Lineage(branch, kg_start, kg_end, (Segment(kg_start, kg_end, ()),))


def lineage_from_tokens(branch: int, kg_start: int, kg_end: int, tokens: Sequence[Token],
                        parents: dict[int, Lineage]) -> Lineage:
    """The lineage of a new branch over `kg_start..kg_end` restored from `tokens`.

    Each key group inherits what the token that covered it saw: its branch's inherited
    ranges there plus that branch's own versions up to the token's epoch.

    :param parents: the lineage of every token's branch.
    :raises CheckpointError: the tokens do not cover every key group exactly once.
    """
    segments: list[Segment] = []
    for token in sorted(tokens, key=lambda t: t.kg_start):
        lo, hi = max(kg_start, token.kg_start), min(kg_end, token.kg_end)
        if lo > hi:
            continue
        parent = parents[token.branch]
        for seg in parent.segments:
            a, b = max(lo, seg.kg_start), min(hi, seg.kg_end)
            if a <= b:
                segments.append(Segment(a, b, seg.inherited + (own_range(token.branch,
                                                                         token.epoch),)))
    segments.sort(key=lambda s: s.kg_start)
    expected = kg_start
    for seg in segments:
        if seg.kg_start != expected:
            expected = -1
            break
        expected = seg.kg_end + 1
    if expected != kg_end + 1:
        raise CheckpointError(
            f"The restored snapshot's tokens do not cover key groups {kg_start}-{kg_end} "
            f"exactly once (tokens: {[t.to_json() for t in tokens]}). The checkpoint was "
            "written by another max parallelism or is incomplete.")
    merged: list[Segment] = []
    for seg in segments:
        if merged and merged[-1].inherited == seg.inherited:
            merged[-1] = Segment(merged[-1].kg_start, seg.kg_end, seg.inherited)
        else:
            merged.append(seg)
    return Lineage(branch, kg_start, kg_end, tuple(merged))


@dataclass(frozen=True, slots=True)
class Descriptor:
    """One completed snapshot of a whole operator: per key-group segment (branch, epoch).
    What readers read (`committed`), what `resume` continues from."""

    parts: tuple[Token, ...]

    @property
    def checkpoint_id(self) -> int:
        return max((t.epoch for t in self.parts), default=0)

    def to_json(self) -> str:
        return json.dumps([[t.kg_start, t.kg_end, t.branch, t.epoch] for t in self.parts],
                          separators=(",", ":"))

    @staticmethod
    def from_json(text: str | None) -> Descriptor | None:
        if not text:
            return None
        data = json.loads(text)
        if not data:
            return None
        return Descriptor(tuple(Token(int(b), int(e), int(a), int(z)) for a, z, b, e in data))


OwnerMap = tuple[tuple[int, int, int], ...]  # (kg_start, kg_end, branch)


def owners_from_json(text: str | None) -> OwnerMap:
    if not text:
        return ()
    return tuple((int(a), int(b), int(br)) for a, b, br in json.loads(text))


def owners_to_json(owners: OwnerMap) -> str:
    return json.dumps([list(o) for o in owners], separators=(",", ":"))


def claim_owners(owners: OwnerMap, kg_start: int, kg_end: int, branch: int) -> OwnerMap:
    """The owner map after `branch` claims `kg_start..kg_end`."""
    out: list[tuple[int, int, int]] = []
    for a, b, br in owners:
        if b < kg_start or a > kg_end:
            out.append((a, b, br))
            continue
        if a < kg_start:
            out.append((a, kg_start - 1, br))
        if b > kg_end:
            out.append((kg_end + 1, b, br))
    out.append((kg_start, kg_end, branch))
    return tuple(sorted(out))


def owns(owners: OwnerMap, kg_start: int, kg_end: int, branch: int) -> bool:
    """True when `branch` owns every key group of `kg_start..kg_end`."""
    expected = kg_start
    for a, b, br in sorted(owners):
        if b < expected or a > kg_end:
            continue
        if br != branch or a > expected:
            return False
        expected = b + 1
        if expected > kg_end:
            return True
    return expected > kg_end


def owner_branches(owners: OwnerMap) -> set[int]:
    return {br for _, _, br in owners}


def is_current(descriptor: Descriptor | None, owners: OwnerMap) -> bool:
    """True when every part of `descriptor` belongs to the branch that owns it now, i.e.
    the descriptor is a snapshot of the attempts running now."""
    if descriptor is None:
        return False
    return all(owns(owners, t.kg_start, t.kg_end, t.branch) for t in descriptor.parts)
