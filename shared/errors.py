"""Error types whose meaning survives every boundary (engine, gRPC, HTTP).

Each maps to one gRPC status and one HTTP status, so front ends translate
them mechanically instead of guessing from messages.
"""

from __future__ import annotations


class PagodaError(Exception):
    """Base of all errors Pagoda raises on purpose."""

    grpc_code = "INTERNAL"
    http_status = 500


class InvalidRequestError(PagodaError, ValueError):
    """The request is wrong; the message says which field and what to fix."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 400

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ConfigError(PagodaError, ValueError):
    """The engine or service cannot start with this configuration."""


class UnsupportedModelError(ConfigError):
    """The checkpoint's architecture is not one Pagoda implements."""


class ModelNotFoundError(PagodaError):
    grpc_code = "NOT_FOUND"
    http_status = 404


class CapacityError(PagodaError):
    """No room right now (queue full); retrying later may succeed."""

    grpc_code = "RESOURCE_EXHAUSTED"
    http_status = 503


class UnavailableError(PagodaError):
    """The service is shutting down or has no worker to take the request."""

    grpc_code = "UNAVAILABLE"
    http_status = 503
