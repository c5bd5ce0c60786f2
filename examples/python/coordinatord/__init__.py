"""coordinatord: a Python client of the coordinatord lock and fencing service.

    from coordinatord import Client, LeaseLost

    with Client("127.0.0.1:7070") as c, c.acquire("jobs/report", ttl=10) as lease:
        for item in work:
            lease.check()          # raises LeaseLost once safe_until passes unrenewed
            write(item, fencing_token=lease.token)

The generated stubs are the coordinator.v1 package shipped alongside.
"""

from .client import Client, Lease, margin
from .errors import (
    LOST_REASONS, REASONS, RETRYABLE_CODES, CoordinatorError, LeaseLost, LockHeld, error_info,
)

__all__ = [
    "Client", "Lease", "margin", "CoordinatorError", "LockHeld", "LeaseLost", "error_info",
    "REASONS", "LOST_REASONS", "RETRYABLE_CODES",
]
__version__ = "0.1.0"
