"""API errors without importing ``kubernetes`` up front (it is heavy and most commands never need it).

``except api_exception() as exc`` works because Python evaluates the ``except`` expression only
when an exception reaches the handler; :func:`status_of` answers for any exception.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException


class ApiAnswer(Exception):
    """An API server's error answer to a plain JSON read (:mod:`.reader`), with the fields of the
    client's ``ApiException`` that this module reads (``status``, ``reason``, ``body``)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason, self.body = status, reason, body


def is_api_error(exc: BaseException) -> TypeGuard[ApiAnswer | ApiException]:
    """Whether ``exc`` is an API server's error answer (an :class:`ApiAnswer`, or the client's
    ``ApiException`` where the client is loaded: unloaded, none can have been raised)."""
    return isinstance(exc, ApiAnswer) or ("kubernetes" in sys.modules and isinstance(exc, api_exception()))


def api_exception() -> type[ApiException]:
    """``kubernetes.client.exceptions.ApiException`` (the class every API error of the client is)."""
    # kubernetes costs ~0.4 s: vgpuctl conformance and demo load this module for their parser (--help)
    from kubernetes.client.exceptions import ApiException

    return ApiException


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an API error, ``None`` for anything else."""
    return exc.status if is_api_error(exc) else None


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
    if not is_api_error(exc):
        return str(exc)
    node = missing_node(exc)
    if node is not None:
        return f"the API server has no Node object {node!r} (404 Not Found)"
    status = _status(exc)
    message = status.get("message")
    return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")


def report_level(exc: BaseException) -> int:
    """The log level of a failed report on the Node (a label, an annotation, an Event): INFO, as the
    report is tried again; WARNING where the Node object itself is missing, which the admin must fix."""
    import logging

    return logging.WARNING if missing_node(exc) is not None else logging.INFO


def missing_node(exc: BaseException) -> str | None:
    """The node's name when ``exc`` is the API server's 404 for a Node object, else ``None``."""
    if status_of(exc) != 404:
        return None
    details = _status(exc).get("details")
    if isinstance(details, dict) and details.get("kind") == "nodes" and not details.get("group"):
        return str(details.get("name") or "")
    return None


def _status(exc: Any) -> dict:
    """The Status object an API error's body holds (``{}`` where it holds none)."""
    import json

    try:
        status = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}
