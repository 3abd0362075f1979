"""Property-based fuzzing of the HTTP API from its own OpenAPI document (schemathesis): no input
may produce a 5xx, an undocumented status code, or a response that breaks the documented schema."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="needs schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app  # noqa: E402
from api.config import ServerConfig  # noqa: E402


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('schemathesis') / 'store.db'}"
    application = create_app(ServerConfig(db=url))
    # a few real episodes, so lookups by id sometimes hit
    for seed in range(3):
        application.server.sessions.start({"seed": seed, "episode_id": f"ep-{seed}"})
    return application


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(scope="module")
def api_schema(app):
    return schemathesis.openapi.from_asgi("/openapi.json", app)


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


@pytest.mark.slow  # 20-25 s on a slow day, the suite's longest test: `python -m pytest -m slow` runs it
@schema.parametrize()
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_input_breaks_the_api(case):
    case.call_and_validate(checks=CHECKS)
