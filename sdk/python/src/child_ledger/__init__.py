"""child-ledger: the Python SDK of the child-ledger service.

A producer registers parents and follows them to their verdict; a Worker
claims children, keeps their leases, runs a handler and records one outcome
per child.
"""
from __future__ import annotations

from ._handler import Child, Failed, Skipped
from .aio import AsyncLedger
from .client import Ledger
from .errors import (BadRequest, Conflict, Forbidden, LedgerError, NotFound, ProblemError, ServiceUnavailable,
                     TooManyRequests, Unauthorized, UnavailableError)
from .events import Event
from .worker import Worker

__version__ = "0.1.0"
__all__ = [
    "Ledger", "AsyncLedger", "Worker", "Child", "Failed", "Skipped", "Event",
    "LedgerError", "ProblemError", "BadRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict",
    "TooManyRequests", "ServiceUnavailable", "UnavailableError", "__version__",
]
