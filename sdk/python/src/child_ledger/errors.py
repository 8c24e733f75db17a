"""Errors raised by the client and the worker."""
from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = [
    "LedgerError", "ProblemError", "BadRequest", "Unauthorized", "Forbidden", "NotFound",
    "Conflict", "TooManyRequests", "ServiceUnavailable", "UnavailableError", "problem_error",
]


class LedgerError(Exception):
    """Base class of every error this package raises."""


class ProblemError(LedgerError):
    """An error answer from the service (an RFC 9457 problem document).

    ``status``, ``type``, ``title``, ``detail`` and ``field`` are the problem's
    members; ``problem`` is the whole document and ``response`` the httpx response.
    """

    def __init__(self, status: int, problem: Dict[str, Any], response: Any = None) -> None:
        self.status = status
        self.problem = problem
        self.response = response
        self.type: str = str(problem.get("type") or "about:blank")
        self.title: str = str(problem.get("title") or _default_title(status))
        self.detail: Optional[str] = problem.get("detail")
        self.field: Optional[str] = problem.get("field")
        super().__init__(self._message())

    def _message(self) -> str:
        text = f"{self.title} (HTTP {self.status})"
        if self.detail:
            text += f": {self.detail}"
        if self.field:
            text += f" [field: {self.field}]"
        if self.type and self.type != "about:blank":
            text += f" <{self.type}>"
        return text


class BadRequest(ProblemError):
    """400, 413, 415, 422 and other 4xx answers: the request must change."""


class Unauthorized(ProblemError):
    """401: no token, or one the service does not know."""


class Forbidden(ProblemError):
    """403: the token's role does not allow this operation."""


class NotFound(ProblemError):
    """404: unknown (or out of the token's scope)."""


class Conflict(ProblemError):
    """409: the resource exists with different content, or a different outcome won."""


class TooManyRequests(ProblemError):
    """429 (after the client's retries)."""


class ServiceUnavailable(ProblemError):
    """5xx (after the client's retries, where they apply)."""


class UnavailableError(LedgerError):
    """The service could not be reached (or kept failing) through every retry."""


_BY_STATUS = {401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 429: TooManyRequests}


def _default_title(status: int) -> str:
    try:
        from http import HTTPStatus

        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


def problem_error(status: int, problem: Dict[str, Any], response: Any = None) -> ProblemError:
    """The ProblemError subclass for ``status``."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServiceUnavailable if status >= 500 else BadRequest
    return cls(status, problem, response)
