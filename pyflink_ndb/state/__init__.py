"""Tiered implementations of PyFlink's keyed state ABCs (`pyflink.datastream.state`)."""

from pyflink_ndb.state.aggregating import TieredAggregatingState
from pyflink_ndb.state.list import TieredListState
from pyflink_ndb.state.map import TieredMapState
from pyflink_ndb.state.reducing import TieredReducingState
from pyflink_ndb.state.value import TieredValueState

__all__ = ["TieredAggregatingState", "TieredListState", "TieredMapState",
           "TieredReducingState", "TieredValueState"]
