"""pyflink-ndb: PyFlink keyed state in an LRU cache, a local RocksDB and RonDB.

Either switch a whole job with `state.backend.ndb.enabled: true` (this import installs the
switch: :mod:`pyflink_ndb.api.switch`), or use :func:`process` / :func:`co_process` instead
of `KeyedStream.process` / `ConnectedStreams.process` for single operators; the functions
and their state declarations stay unchanged.
"""

import warnings

from pyflink_ndb._environment import put_interpreter_first_on_path

with warnings.catch_warnings():
    # PyFlink 1.20 imports apache_beam, whose stager imports pkg_resources: a deprecation
    # warning at every `import pyflink_ndb` (and every `pyflink-ndb` command) that says
    # nothing a user can act on.
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated",
                            category=UserWarning)
    from pyflink_ndb.api.stream import co_process, process
    from pyflink_ndb.api.switch import install as install_switch
from pyflink_ndb.config import KNOWN_KEYS, NdbStateOptions
from pyflink_ndb.errors import (
    CheckpointError,
    ConfigurationError,
    NamespaceInUseError,
    NdbStateError,
    SerializationError,
    StateCompatibilityError,
    StoreUnavailableError,
    ValueTooLargeError,
)

__version__ = "0.1.0"

put_interpreter_first_on_path()
install_switch()

__all__ = [
    "KNOWN_KEYS",
    "CheckpointError",
    "ConfigurationError",
    "NamespaceInUseError",
    "NdbStateError",
    "NdbStateOptions",
    "SerializationError",
    "StateCompatibilityError",
    "StoreUnavailableError",
    "ValueTooLargeError",
    "co_process",
    "process",
]
