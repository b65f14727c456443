"""fusebox client: guard calls to a dependency with fusebox's breakers and permits.

    from fusebox_client import FuseboxClient, Blocked
    client = FuseboxClient("127.0.0.1:7070")
    with client.guard("payments/charge"):
        charge()
    client.close()  # reports the outcomes still queued

The guard returns as soon as its call ends; the outcome is reported in the
background (`client.flush()` waits for it).

The asyncio client is `fusebox_client.aio.AsyncFuseboxClient`.
"""

from ._common import (
    TLS,
    Blocked,
    CallError,
    Counters,
    Denied,
    FuseboxError,
    FuseboxRefusal,
    Outcome,
    Refused,
    Unavailable,
    default_classifier,
)
from ._sync import FuseboxClient, Guard, shared_channel

__all__ = [
    "TLS",
    "Blocked",
    "CallError",
    "Counters",
    "Denied",
    "FuseboxClient",
    "FuseboxError",
    "FuseboxRefusal",
    "Guard",
    "Outcome",
    "Refused",
    "Unavailable",
    "default_classifier",
    "shared_channel",
]
