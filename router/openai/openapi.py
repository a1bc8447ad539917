"""The HTTP API's OpenAPI document (/openapi.json), for clients and for fuzzing.

The OpenAI routes read their bodies themselves (to check size and type before
parsing, router/limits.py), so FastAPI cannot see them; the document gets each
route's request body from its pydantic model and the error body every status
shares, so schemathesis can generate requests from it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
# What any OpenAI route may answer besides 200.
_ERROR_STATUSES = {
    "400": "The request is invalid; the message names the field.",
    "401": "No or a wrong API key.",
    "404": "Unknown model.",
    "413": "The body is larger than --max-request-body-bytes.",
    "415": "The body is not JSON.",
    "503": "No worker can take the request now; retry.",
}


def install_openapi(app: FastAPI, bodies: dict[str, type[BaseModel]]) -> None:
    """Serve a document where each POST path in `bodies` takes that model as JSON."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["Error"] = ERROR_SCHEMA
        error = {"application/json": {"schema": {"$ref": _REF.format(model="Error")}}}
        for path, model in bodies.items():
            body = model.model_json_schema(ref_template=_REF)
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
            operation = schema["paths"][path]["post"]
            ref = {"$ref": _REF.format(model=model.__name__)}
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": ref}},
            }
            operation["responses"] = {
                "200": {
                    "description": "The answer: JSON, or server-sent events when streamed.",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                **{s: {"description": d, "content": error} for s, d in _ERROR_STATUSES.items()},
            }
            operation["security"] = [{"bearer": []}]
        schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
