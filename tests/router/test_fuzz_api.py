"""The HTTP API fuzzed from its own OpenAPI document (schemathesis) against `pagoda
serve`: no request it generates gets a 5xx, every error is an OpenAI-shaped body,
and the server serves afterwards. A short run here; a long one under `-m slow`."""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.router.conftest import MODEL

# The default run's budget per operation; the slow run's (PAGODA_FUZZ_EXAMPLES overrides).
SHORT, LONG = 5, int(os.environ.get("PAGODA_FUZZ_EXAMPLES", "400"))


@pytest.fixture(scope="module")
def api_schema(served):
    return schemathesis.openapi.from_url(f"{served.base_url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def check_response(response, case) -> None:
    status = response.status_code
    assert status < 500, f"{status} for {case.body!r}: {response.text[:500]}"
    if status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, response.text
        assert isinstance(error["message"], str) and error["message"]


def fuzz(case, served, short: bool) -> None:
    if isinstance(case.body, dict):
        case.body.setdefault("model", MODEL)  # mostly the served model, so requests run
        if short:  # valid requests generate a little, so the default run stays quick
            case.body.setdefault("max_tokens", 4)
    response = case.call(headers=served.headers, timeout=120)
    check_response(response, case)


@schema.parametrize()
@settings(max_examples=SHORT, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_requests_get_no_5xx_and_openai_errors(case, served):
    fuzz(case, served, short=True)


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=LONG, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_requests_long_run(case, served):
    fuzz(case, served, short=False)


def test_the_document_describes_the_openai_bodies_and_the_server_serves_on(served):
    document = httpx.get(f"{served.base_url}/openapi.json", timeout=10).json()
    body = document["paths"]["/v1/completions"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/CompletionRequest")
    assert "prompt" in document["components"]["schemas"]["CompletionRequest"]["properties"]
    response = httpx.post(
        f"{served.base_url}/v1/completions", headers=served.headers, timeout=60,
        json={"model": MODEL, "prompt": "still here", "max_tokens": 3},
    )  # fmt: skip
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
    served.router.process.check_alive()
