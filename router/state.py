"""What a request handler needs from the router, in one object the fronts share."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from router.config import RouterConfig
from router.errors import AuthenticationError
from router.metrics import RouterMetrics
from router.model import ModelContext
from router.routing.dispatcher import Dispatcher
from router.routing.worker_pool import WorkerPool
from shared.errors import ModelNotFoundError, UnavailableError


@dataclass
class RouterState:
    config: RouterConfig
    metrics: RouterMetrics
    pool: WorkerPool
    dispatcher: Dispatcher
    model: ModelContext | None = None
    model_error: str | None = None  # why the model context could not be built

    def check_api_key(self, authorization: str | None) -> None:
        """Raise unless `authorization` is `Bearer <the key>` (or no key is set)."""
        key = self.config.api_key
        if key is None:
            return
        if not authorization:
            raise AuthenticationError(
                "no API key provided: send it in the Authorization header as 'Bearer KEY'"
            )
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), key.encode()
        ):
            raise AuthenticationError("incorrect API key provided")

    def model_for(self, name: str) -> ModelContext:
        if self.model is None:
            raise UnavailableError(
                self.model_error or "no worker has announced its model yet; retry shortly"
            )
        if name != self.model.name:
            raise ModelNotFoundError(
                f"the model '{name}' does not exist; this server serves '{self.model.name}'"
            )
        return self.model
