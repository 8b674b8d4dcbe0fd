"""The database side of the relay: the store ports (``Store``, ``Admin``) and their adapters."""

from relay.store.base import (
    Admin,
    Claim,
    Dead,
    DeadEvent,
    ReplayFilter,
    RequeueFilter,
    Retry,
    Settlement,
    Status,
    Store,
)

__all__ = [
    "Admin",
    "Claim",
    "Dead",
    "DeadEvent",
    "ReplayFilter",
    "RequeueFilter",
    "Retry",
    "Settlement",
    "Status",
    "Store",
]
