"""Checks of a run request that run before anything is created or loaded (docs/md.md)."""

from fastmace.preflight.request import (
    CheckedRequest,
    check_arguments,
    check_environment,
    check_request,
)
from fastmace.preflight.values import RequestError, RequestTypeError

__all__ = [
    "CheckedRequest",
    "RequestError",
    "RequestTypeError",
    "check_arguments",
    "check_environment",
    "check_request",
]
