"""The database side of the relay: the store port and its PostgreSQL adapter."""

from relay.store.base import Claim, Dead, DeadEvent, RequeueFilter, Retry, Settlement, Status, Store

__all__ = ["Claim", "Dead", "DeadEvent", "RequeueFilter", "Retry", "Settlement", "Status", "Store"]
