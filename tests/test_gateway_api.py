"""The gateway's API boundary (issue 33): who may reach a gang through it.

- A client without one of the stack's keys gets 401 from the gateway itself, with an
  OpenAI-style error body, and no gang sees the request (whatever the gangs' state:
  tests/test_waker.py shows that nothing wakes either).
- A client with the current key, or with the previous one during a rotation, reaches a
  gang; the gang receives the heads' key, never the client's.
- Only the stack's routes pass, and each passes as the route itself: a path as sent
  that nginx would normalise into a route (`curl --path-as-is .../metrics/../v1/models`)
  is refused, and never reaches vLLM's unauthenticated mounts.
- A rotation changes the keys with a graceful reload; a keys file nginx would refuse
  leaves the working keys in place.

Real nginx serving the site components/bootstrap.py renders, with the gateway's own
script installing the keys, under tests/test_gateway_pool.py's scratch root."""

from __future__ import annotations

import stat

import pytest

from components import api_routes
from tests.test_gateway_pool import (  # noqa: F401 - fixtures
    CLIENT_KEY,
    HEADS_KEY,
    PREVIOUS_KEY,
    Gang,
    assert_ran,
    gateway,
    needs_host_tools,
)


@pytest.fixture
def served(gateway):  # noqa: F811 - test_gateway_pool's fixture
    """The gateway with one gang that serves."""
    gang = Gang("gang0", "127.0.0.2").start()
    try:
        assert_ran(gateway.configure(gang))
        yield gateway, gang
    finally:
        gang.stop()


COMPLETION = {"model": "m", "prompt": "hello"}


def test_without_a_valid_key_the_gateway_answers_401_and_no_gang_sees_the_request(served):
    front, gang = served
    for key in (None, "", "wrong" + "w" * 43, CLIENT_KEY[:-1], CLIENT_KEY + "x", HEADS_KEY):
        for method, path, body in (("POST", "/v1/completions", COMPLETION), ("GET", "/v1/models", None)):
            status, answer = front.request(method, path, body, key=key)
            assert status == 401, (key, path, answer)
            assert answer["error"]["code"] == "invalid_api_key" and answer["error"]["type"] == "invalid_request_error"
        assert front.request("GET", "/health", key=key)[0] == 401
    assert gang.seen == []


def test_a_keyed_request_reaches_the_gang_with_the_heads_key_not_the_clients(served):
    front, gang = served
    assert front.complete() == (200, "gang0")
    assert front.request("GET", "/v1/models")[0] == 200
    assert [(method, path) for method, path, _ in gang.seen] == [("POST", "/v1/completions"), ("GET", "/v1/models")]
    assert {authorization for _, _, authorization in gang.seen} == {f"Bearer {HEADS_KEY}"}


@pytest.mark.parametrize(
    "path",
    [
        "/metrics/../v1/models",
        "/v1/models/../../metrics",
        "/v1//models",
        "//v1/models",
        "/v1/./models",
        "/v1/%6dodels",
        "/v1/models%2F..%2F..%2Fmetrics",
        "/v1/completions/..",
    ],
)
def test_a_path_as_sent_that_is_not_its_route_is_refused_with_404(served, path):
    """curl --path-as-is: nginx would match /metrics/../v1/models as /v1/models; before,
    it forwarded the path as sent, and vLLM answered its /metrics with no key."""
    front, gang = served
    method, body = ("POST", COMPLETION) if "completions" in path else ("GET", None)
    status, answer = front.request(method, path, body)
    assert status == 404 and answer["error"]["code"] == "unknown_url", answer
    assert gang.seen == []


def test_only_the_stacks_routes_pass_each_as_itself_with_its_query(served):
    front, gang = served
    for path in ("/metrics", "/tokenize", "/invocations", "/collective_rpc", "/v1/models/", "/v1", "/"):
        assert front.request("GET", path)[0] == 404, path
    assert gang.seen == []
    assert front.request("GET", "/v1/models?limit=2")[0] == 200
    assert gang.seen[-1][:2] == ("GET", "/v1/models?limit=2")
    assert front.request("POST", "/v1/responses", {"model": "m", "input": "hi"})[0] == 200
    assert gang.seen[-1][:2] == ("POST", "/v1/responses")


def test_routes_a_stack_adds_pass_and_the_others_stay_404(gateway):  # noqa: F811
    gang = Gang("gang0", "127.0.0.2").start()
    try:
        routes = ("/v1/models", "/v1/completions", "/tokenize", "/detokenize", "/health")
        assert_ran(gateway.configure(gang, site=gateway.site(api_routes=routes)))
        assert gateway.request("POST", "/tokenize", {"model": "m", "prompt": "hi"})[0] == 200
        assert gateway.request("POST", "/tokenize", {"model": "m", "prompt": "hi"}, key=None)[0] == 401
        for path in ("/v1/chat/completions", "/v1/responses"):
            assert gateway.request("POST", path, COMPLETION)[0] == 404, path
        pooling = gateway.site(api_routes=api_routes.DEFAULT_POOLING_ROUTES)
        assert_ran(gateway.configure(gang, site=pooling))
        assert gateway.request("POST", "/v1/embeddings", {"model": "m", "input": "hi"})[0] == 200
        assert gateway.request("POST", "/v1/completions", COMPLETION)[0] == 404
    finally:
        gang.stop()


def test_a_rotation_accepts_both_keys_then_only_the_new_one_without_restarting_a_gang(served):
    front, gang = served
    new_key = "rotated" + "r" * 41
    # Step 1: the new key in apiKey, the old one in previousApiKey.
    assert_ran(front.install_keys({"current": new_key, "previous": CLIENT_KEY}))
    assert front.request("POST", "/v1/completions", COMPLETION, key=new_key)[0] == 200
    assert front.request("POST", "/v1/completions", COMPLETION, key=CLIENT_KEY)[0] == 200
    # Step 2: previousApiKey removed.
    assert_ran(front.install_keys({"current": new_key}))
    assert front.request("POST", "/v1/completions", COMPLETION, key=CLIENT_KEY)[0] == 401
    assert front.request("POST", "/v1/completions", COMPLETION, key=new_key)[0] == 200
    # The gang always got the heads' key: nothing on it had to change.
    assert {authorization for _, _, authorization in gang.seen} == {f"Bearer {HEADS_KEY}"}


def test_the_keys_file_is_root_only_and_a_bad_one_keeps_the_working_keys(served):
    front, _ = served
    mode = stat.S_IMODE(front.api_keys.stat().st_mode)
    assert mode == 0o600, oct(mode)
    assert PREVIOUS_KEY not in front.api_keys.read_text()
    before = front.api_keys.read_text()
    empty = front.run("install-api-keys", stdin="")
    assert empty.returncode != 0 and "not the keys' maps" in empty.stderr
    # Valid-looking maps nginx refuses (an unbalanced quote): restored, and the error
    # does not quote the file's lines (a key).
    broken = before.replace(f'"Bearer {CLIENT_KEY}" current;', f'"Bearer {CLIENT_KEY} current;')
    result = front.run("install-api-keys", stdin=broken)
    assert result.returncode != 0 and "previous ones were kept" in result.stderr
    assert CLIENT_KEY not in result.stderr + result.stdout
    assert front.api_keys.read_text() == before
    assert front.complete() == (200, "gang0")


def test_configure_needs_the_keys_first(gateway):  # noqa: F811
    gateway.api_keys.unlink()
    gang = Gang("gang0", "127.0.0.2").start()
    try:
        result = gateway.configure(gang)
        assert result.returncode != 0 and "install-api-keys first" in result.stderr
    finally:
        gang.stop()
