"""The REST apps of the scheduler, the exchange and THL, walked route by route over real HTTP with auth on:
credentials are checked before a body is read, and /openapi.json documents bearer auth, the error answers
and typed bodies."""
import re

import httpx
import pytest

from helpers import write_auth_file
from servers import RunningExchange, RunningScheduler, RunningServer

# The routes a policy principal may call; every other /v1 route is an admin's.
POLICY_ROUTES = {"tokenizer_align": {("POST", "/v1/align"), ("POST", "/v1/align/batch"), ("GET", "/v1/tokenizers")}}


def _align_server(auth_file):
    from mrl_tokenizer_align.app import AlignServer
    from mrl_tokenizer_align.catalog import cached_paths
    from mrl_tokenizer_align.settings import AlignSettings
    settings = AlignSettings(port=0, admin_port=0, auth_file=auth_file, tokenizers={"gpt2": cached_paths()["gpt2"]})
    return RunningServer(lambda: AlignServer(settings))


@pytest.fixture(scope="module")
def services(redis_url, tmp_path_factory):
    """name -> (its REST base URL, tokens); all three with auth on."""
    path = tmp_path_factory.mktemp("auth") / "auth.yaml"
    tokens = write_auth_file(path, "run-1")
    running = {"scheduler": RunningScheduler(redis_url, auth_file=path),
               "exchange": RunningExchange(redis_url, auth_file=path),
               "tokenizer_align": _align_server(path)}
    yield {name: (server.admin, tokens) for name, server in running.items()}
    for server in running.values():
        server.stop()


def operations(openapi: dict):
    """(METHOD, path template, operation) of every /v1 operation."""
    for path, methods in openapi["paths"].items():
        if path.startswith("/v1/"):
            for method, operation in methods.items():
                yield method.upper(), path, operation


@pytest.mark.parametrize("name", ["scheduler", "exchange", "tokenizer_align"])
def test_every_route_checks_credentials_before_it_reads_the_body(services, name):
    base, tokens = services[name]
    with httpx.Client(base_url=base, timeout=10) as http:
        routes = [(method, path) for method, path, _ in operations(http.get("/openapi.json").json())]
        assert routes
        for method, path in routes:
            url = re.sub(r"\{[^}]+}", "x", path)
            bad = {"content": b'{"slots": "not json', "headers": {"content-type": "application/json"}}
            r = http.request(method, url, **bad)
            assert (r.status_code, r.json().get("error")) == (401, "Unauthenticated"), (method, path, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            bad["headers"]["authorization"] = f"Bearer {tokens['policy-a']}"
            r = http.request(method, url, **bad)
            if (method, path) in POLICY_ROUTES.get(name, ()):
                assert r.status_code in (200, 400), (method, path, r.text)  # authenticated; a body is refused
            else:
                assert (r.status_code, r.json().get("error")) == (403, "PermissionDenied"), (method, path, r.text)
            bad["headers"]["authorization"] = f"Bearer {tokens['admin']}"
            r = http.request(method, url, **bad)
            assert r.status_code in (200, 400, 404, 422), (method, path, r.text)  # a bad body is never a 500


def _resolve(openapi: dict, schema: dict) -> dict:
    ref = schema.get("$ref")
    return _resolve(openapi, openapi["components"]["schemas"][ref.rsplit("/", 1)[1]]) if ref else schema


@pytest.mark.parametrize("name", ["scheduler", "exchange", "tokenizer_align"])
def test_openapi_declares_bearer_auth_the_error_answers_and_typed_bodies(services, name):
    base, _ = services[name]
    openapi = httpx.get(f"{base}/openapi.json", timeout=10).json()
    schemes = openapi["components"]["securitySchemes"]
    bearer = [n for n, s in schemes.items() if s["type"] == "http" and s["scheme"].lower() == "bearer"]
    assert len(bearer) == 1
    for method, path, op in operations(openapi):
        where = f"{method} {path}"
        assert {bearer[0]: []} in op["security"], where
        assert not [p for p in op.get("parameters", []) if p["name"].lower() == "authorization"], where
        for status in ("401", "403", "429") + (("400",) if op.get("parameters") or "requestBody" in op else ()):
            error = _resolve(openapi, op["responses"][status]["content"]["application/json"]["schema"])
            assert set(error["properties"]) == {"error", "detail"}, (where, status)
        if "requestBody" in op:
            body = _resolve(openapi, op["requestBody"]["content"]["application/json"]["schema"])
            assert body["properties"], where
    if name == "tokenizer_align":
        align = _resolve(openapi, openapi["paths"]["/v1/align/batch"]["post"]["requestBody"]["content"]
                         ["application/json"]["schema"])
        one = _resolve(openapi, align["properties"]["requests"]["items"])
        assert one["properties"]["source_ids"] == {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                              "maximum": 2**32 - 1}}
        assert "TRACE_REDUCTION_MEAN" in _resolve(openapi, one["properties"]["traces"]["items"])["properties"][
            "reduction"]["enum"]
        answer = openapi["paths"]["/v1/align"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert "residual" in _resolve(openapi, answer)["properties"]
