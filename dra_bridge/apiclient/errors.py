"""API errors without importing ``kubernetes`` up front (it is heavy and most commands never need it).

``except api_exception() as exc`` works because Python evaluates the ``except`` expression only
when an exception reaches the handler; :func:`status_of` answers for any exception.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException


def api_exception() -> type[ApiException]:
    """``kubernetes.client.exceptions.ApiException`` (the class every API error of the client is)."""
    # kubernetes costs ~0.4 s: vgpuctl conformance and demo load this module for their parser (--help)
    from kubernetes.client.exceptions import ApiException

    return ApiException


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an API error, ``None`` for anything else."""
    return exc.status if isinstance(exc, api_exception()) else None


def missing_ok(call: Callable[..., Any], *args: Any, **kw: Any) -> bool:
    """Make an API call; ``False`` when the server answers 404 Not Found (nothing there to read,
    replace or delete), ``True`` when it succeeded. Every other error raises."""
    try:
        call(*args, **kw)
    except api_exception() as exc:
        if exc.status != 404:
            raise
        return False
    return True


def brief(exc: BaseException) -> str:
    """One line for a log: ``404 NotFound: nodes "x" not found`` for an API error (whose ``str`` dumps
    the response headers and body), ``str(exc)`` for anything else."""
    if not isinstance(exc, api_exception()):
        return str(exc)
    import json

    try:
        status = json.loads(exc.body or "")
    except (TypeError, ValueError):
        status = {}
    message = status.get("message") if isinstance(status, dict) else None
    return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")
