"""The exceptions of pyflink-ndb: one root, a few subclasses a caller can act on."""

from __future__ import annotations


class NdbStateError(Exception):
    """Root of every error raised by pyflink-ndb."""


class ConfigurationError(NdbStateError, ValueError):
    """A `state.backend.ndb.*` option or a job setting is wrong; the message names the fix."""


class StoreUnavailableError(NdbStateError, ConnectionError):
    """The database (tier 3) cannot be reached or refused the operation."""


class SerializationError(NdbStateError, TypeError):
    """A key or value cannot be encoded or decoded."""


class ValueTooLargeError(NdbStateError, ValueError):
    """A value or key exceeds the supported size; nothing of the checkpoint was written."""


class CheckpointError(NdbStateError, RuntimeError):
    """A snapshot, commit or restore of the epoch protocol failed."""


class StateCompatibilityError(NdbStateError, RuntimeError):
    """A state was re-declared with an incompatible type, serializer or format version."""


class NamespaceInUseError(ConfigurationError):
    """A fresh start found committed state in the namespace and `on-fresh-start` is `fail`."""


class FencedError(CheckpointError):
    """This subtask attempt no longer owns its key groups: a newer attempt claimed them.

    Raised at the superseded attempt's next write, commit or garbage collection; it must
    stop (Flink has replaced it already)."""


class StaleReadError(CheckpointError):
    """A reader of the committed state was overtaken: the checkpoint it read was subsumed
    (and may be collected) before the read ended. Read again."""
