"""The admin API mounted on a small Starlette app, exercised over ASGI.

The reproducers of issue #15 (admin part) are regression tests here: an unbuildable goodput
``cost_table`` (422, nothing changes), a YAML alias bomb, an empty PUT, the file's mode,
malformed JSON bodies, and ``Forwarded:`` on the loopback-only check."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from controller.admin import AdminAuth, admin_routes
from controller.admin_auth import forwarded_for, is_loopback
from controller.policy.document import DEFAULT_POLICY_TEXT
from controller.policy.store import PolicyStore
from tests.policy_texts import STATIC_POLICY_TEXT

CHAT_OFF = STATIC_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [0, 0, 0, 0]")
CHAT_SMALL = STATIC_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [4, 4, 0, 0]")
LOOPBACK = ("127.0.0.1", 50123)
REMOTE = ("203.0.113.7", 50123)


@pytest.fixture
def store(tmp_path: Path) -> PolicyStore:
    return PolicyStore(tmp_path / "policy.yaml", tmp_path / "versions")


def client_for(
    store: PolicyStore, token: str | None = None, peer: tuple[str, int] = LOOPBACK
) -> TestClient:
    app = Starlette(routes=admin_routes(store, AdminAuth(token=token)))
    return TestClient(app, client=peer)


def test_get_policy_returns_yaml_with_etag(store: PolicyStore) -> None:
    response = client_for(store).get("/admin/policy")
    assert response.status_code == 200
    assert response.text == DEFAULT_POLICY_TEXT
    assert response.headers["content-type"].startswith("application/yaml")
    assert response.headers["etag"] == store.etag()
    assert response.headers["x-draftctl-policy-version"] == "1"


def test_put_applies_and_returns_new_version(store: PolicyStore) -> None:
    client = client_for(store)
    etag = client.get("/admin/policy").headers["etag"]
    response = client.put("/admin/policy", content=CHAT_OFF, headers={"If-Match": etag})
    assert response.status_code == 200
    assert response.json()["version"] == 2
    assert response.headers["etag"] != etag
    assert client.get("/admin/policy").text == CHAT_OFF
    assert store.current()[0] == 2


def test_put_with_stale_if_match_is_412_and_changes_nothing(store: PolicyStore) -> None:
    client = client_for(store)
    stale = client.get("/admin/policy").headers["etag"]
    assert client.put("/admin/policy", content=CHAT_OFF).status_code == 200
    response = client.put("/admin/policy", content=CHAT_SMALL, headers={"If-Match": stale})
    assert response.status_code == 412
    assert response.json()["error"]["code"] == "etag_mismatch"
    assert response.headers["etag"] == store.etag()
    assert store.current()[1] == CHAT_OFF


def test_put_invalid_is_422_with_paths_and_lines(store: PolicyStore) -> None:
    bad = STATIC_POLICY_TEXT.replace("min_spec_tokens: 4", "min_spec_tokens: 0").replace(
        "concurrency_bands: [8, 32, 64]", "concurrency_bands: [8, 32, 64]\n  surprise: true"
    )
    response = client_for(store).put("/admin/policy", content=bad)
    assert response.status_code == 422
    errors = {e["path"]: e for e in response.json()["errors"]}
    assert set(errors) == {"min_spec_tokens", "static.surprise"}
    assert errors["min_spec_tokens"]["line"] == 3
    assert errors["static.surprise"] == {
        "path": "static.surprise",
        "message": "unknown key",
        "line": 7,
    }
    assert store.current()[0] == 1


def test_put_broken_yaml_is_422_with_line(store: PolicyStore) -> None:
    response = client_for(store).put("/admin/policy", content="kind: static\nstatic: [\n")
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["message"].startswith("invalid YAML") and error["line"] == 3


def test_put_over_size_limit_is_413(store: PolicyStore) -> None:
    response = client_for(store).put("/admin/policy", content="#" * 300_000)
    assert response.status_code == 413
    assert "bytes" in response.json()["error"]["message"]


def test_write_failure_is_500_and_running_policy_stays(
    store: PolicyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("controller.policy.versions.write_atomically", disk_full)
    response = client_for(store).put("/admin/policy", content=CHAT_OFF)
    assert response.status_code == 500
    assert "No space left" in response.json()["error"]["message"]
    assert store.current()[:2] == (1, DEFAULT_POLICY_TEXT)


def test_validate_does_not_apply(store: PolicyStore) -> None:
    client = client_for(store)
    ok = client.post("/admin/policy/validate", content=CHAT_OFF)
    assert ok.status_code == 200 and ok.json() == {"ok": True, "errors": [], "kind": "static"}
    bad = client.post("/admin/policy/validate", content="kind: nope\n")
    assert bad.status_code == 200 and bad.json()["ok"] is False
    assert bad.json()["errors"][0]["path"] == "kind" and bad.json()["errors"][0]["line"] == 1
    assert store.current()[0] == 1


def test_versions_and_rollback(store: PolicyStore) -> None:
    client = client_for(store)
    client.put("/admin/policy", content=CHAT_OFF)
    client.put("/admin/policy", content=CHAT_SMALL)
    listing = client.get("/admin/policy/versions").json()
    assert listing["current"] == 3
    assert [v["version"] for v in listing["versions"]] == [3, 2, 1]
    assert listing["file"]["last_error"] is None
    assert client.get("/admin/policy/versions/2").text == CHAT_OFF

    response = client.post("/admin/policy/rollback", json={"version": 1})
    assert response.status_code == 200
    assert response.json()["version"] == 4 and response.json()["rolled_back_to"] == 1
    assert client.get("/admin/policy").text == DEFAULT_POLICY_TEXT
    assert client.get("/admin/policy/versions").json()["versions"][0]["source"] == "rollback:1"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"version": 42}, 404, "unknown_version"),
        ({"version": "1"}, 400, "bad_version"),
        ({"v": 1}, 400, "bad_version"),
    ],
)
def test_rollback_bad_requests(
    store: PolicyStore, body: dict[str, object], status: int, code: str
) -> None:
    response = client_for(store).post("/admin/policy/rollback", json=body)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert store.current()[0] == 1


def test_rollback_non_json_is_400(store: PolicyStore) -> None:
    response = client_for(store).post("/admin/policy/rollback", content="version=1")
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_json"


def test_unknown_version_text_is_404(store: PolicyStore) -> None:
    assert client_for(store).get("/admin/policy/versions/9").status_code == 404


# -- issue #15 reproducers: a policy that cannot be built, bounded YAML, bodies -------------

ROOT = Path(__file__).resolve().parents[2]
GOODPUT = "kind: goodput\ngoodput:\n  cost_table: {table}\n"
# 9 levels of 9 aliases: about 387 million values once expanded, in a few hundred bytes.
ALIAS_BOMB = "kind: static\n" + "".join(
    f"{name}: &{name} [{','.join([f'*{prev}'] * 9) if prev else ','.join(['x'] * 9)}]\n"
    for prev, name in zip(["", "a", "b", "c", "d", "e", "f", "g", "h"], "abcdefghi", strict=True)
)


def _unbuildable_table(tmp_path: Path, case: str) -> str:
    if case == "folder":
        (tmp_path / "tables").mkdir()
        return "tables"
    if case == "invalid-json":
        (tmp_path / "cost.json").write_text("{not json")
        return "cost.json"
    return "missing.json"


def _assert_openai_error(response: object, status: int, code: str) -> dict[str, object]:
    assert response.status_code == status  # type: ignore[attr-defined]
    assert response.headers["content-type"].startswith("application/json")  # type: ignore[attr-defined]
    error = response.json()["error"]  # type: ignore[attr-defined]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    return error  # type: ignore[no-any-return]


@pytest.mark.parametrize("case", ["missing", "folder", "invalid-json"])
def test_put_goodput_whose_cost_table_cannot_be_built_is_422_and_changes_nothing(
    store: PolicyStore, tmp_path: Path, case: str
) -> None:
    # Before: 200 with a new version recorded as active while the old policy kept running,
    # and the daemon then refused to start.
    client = client_for(store)
    before = client.get("/admin/policy/versions").json()
    running = store.running()
    text = GOODPUT.format(table=_unbuildable_table(tmp_path, case))
    response = client.put("/admin/policy", content=text)
    error = _assert_openai_error(response, 422, "invalid_policy")
    assert error["type"] == "invalid_request_error" and "cost table" in str(error["message"])
    [problem] = response.json()["errors"]
    assert (problem["path"], problem["line"]) == ("goodput.cost_table", 3)
    assert client.get("/admin/policy/versions").json() == before
    assert (tmp_path / "policy.yaml").read_text() == DEFAULT_POLICY_TEXT
    assert store.running() is running
    checked = client.post("/admin/policy/validate", content=text).json()
    assert checked["ok"] is False and checked["errors"] == [problem]
    again = PolicyStore(tmp_path / "policy.yaml", tmp_path / "versions")  # still starts
    assert again.current()[:2] == (1, DEFAULT_POLICY_TEXT)


def test_put_goodput_with_a_readable_cost_table_is_200(store: PolicyStore, tmp_path: Path) -> None:
    shutil.copy(ROOT / "cost_tables" / "qwen3-8b-h200.json", tmp_path / "cost.json")
    response = client_for(store).put("/admin/policy", content=GOODPUT.format(table="cost.json"))
    assert response.status_code == 200 and response.json()["version"] == 2
    assert store.running().models is not None


@pytest.mark.parametrize("path", ["/admin/policy", "/admin/policy/validate"])
def test_yaml_alias_bomb_is_refused_quickly(store: PolicyStore, path: str) -> None:
    assert len(ALIAS_BOMB.encode()) <= 322
    client = client_for(store)
    started = time.monotonic()
    response = client.request(
        "PUT" if path == "/admin/policy" else "POST", path, content=ALIAS_BOMB
    )
    assert time.monotonic() - started < 2.0, "the alias bomb was expanded"
    [problem] = response.json()["errors"]
    assert "100000 values" in problem["message"] and problem["line"] is not None
    assert response.status_code == (422 if path == "/admin/policy" else 200)
    assert store.current()[0] == 1


@pytest.mark.parametrize("body", ["", "\n  \n"])
def test_empty_put_is_422_and_the_file_is_never_empty(
    store: PolicyStore, tmp_path: Path, body: str
) -> None:
    response = client_for(store).put("/admin/policy", content=body)
    _assert_openai_error(response, 422, "invalid_policy")
    assert "empty" in response.json()["errors"][0]["message"]
    assert (tmp_path / "policy.yaml").read_text() == DEFAULT_POLICY_TEXT
    assert store.current()[0] == 1


def test_put_keeps_the_policy_files_mode(store: PolicyStore, tmp_path: Path) -> None:
    os.chmod(tmp_path / "policy.yaml", 0o644)
    client = client_for(store)
    assert client.put("/admin/policy", content=CHAT_OFF).status_code == 200
    assert client.post("/admin/policy/rollback", json={"version": 1}).status_code == 200
    assert stat.S_IMODE((tmp_path / "policy.yaml").stat().st_mode) == 0o644


MALFORMED_JSON = [
    ("nested-2000", ("[" * 2000 + "]" * 2000).encode(), "bad_json"),
    ("nested-in-object", ('{"version": ' + "[" * 5000 + "]" * 5000 + "}").encode(), "bad_json"),
    ("int-5000-digits", ('{"version": ' + "7" * 5000 + "}").encode(), "bad_json"),
    ("lone-surrogate-utf8", b'{"version": "\xed\xa0\x80"}', "bad_encoding"),
    ("lone-surrogate-escape", b'{"version": "\\ud800"}', "bad_version"),
    ("empty", b"", "bad_json"),
]


@pytest.mark.parametrize(
    ("body", "code"), [(b, c) for _, b, c in MALFORMED_JSON], ids=[i for i, _, _ in MALFORMED_JSON]
)
def test_rollback_malformed_json_is_a_json_400(store: PolicyStore, body: bytes, code: str) -> None:
    # Before: nesting and the long integer answered a plain-text 500.
    response = client_for(store).post("/admin/policy/rollback", content=body)
    _assert_openai_error(response, 400, code)
    assert store.current()[0] == 1


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (("[" * 2000 + "]" * 2000).encode(), 422),
        (("kind: " + "7" * 5000).encode(), 422),
        (b'kind: static\n"\\ud800": 1\n', 422),
        (b"kind: \xed\xa0\x80\n", 400),
    ],
    ids=["nested-2000", "int-5000-digits", "surrogate-key", "lone-surrogate-utf8"],
)
def test_put_malformed_documents_answer_json_never_500(
    store: PolicyStore, body: bytes, status: int
) -> None:
    response = client_for(store).put("/admin/policy", content=body)
    assert response.status_code == status
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["message"]
    assert store.current()[0] == 1


async def _asgi_put(app: Starlette, body: bytes) -> int:
    """PUT /admin/policy straight through ASGI on this event loop; returns the status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "PUT",
        "scheme": "http",
        "path": "/admin/policy",
        "raw_path": b"/admin/policy",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"admin"), (b"content-length", str(len(body)).encode())],
        "client": LOOPBACK,
        "server": ("admin", 80),
    }
    chunks = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        if chunks:
            return chunks.pop()
        await asyncio.Event().wait()  # the client never disconnects
        raise AssertionError("unreachable")

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return int(sent[0]["status"])  # type: ignore[call-overload]


async def test_put_parses_and_builds_off_the_event_loop(
    store: PolicyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_build = store.build

    def slow_build(text: str) -> object:
        time.sleep(0.5)  # a policy that takes long to parse or build
        return real_build(text)

    monkeypatch.setattr(store, "build", slow_build)
    app = Starlette(routes=admin_routes(store, AdminAuth(token=None)))
    put = asyncio.create_task(_asgi_put(app, CHAT_OFF.encode()))
    num_ticks = 0
    while not put.done():
        await asyncio.sleep(0.01)
        num_ticks += 1
    assert await put == 200 and store.current()[0] == 2
    assert num_ticks >= 20, "the event loop was blocked while the policy was built"


def test_version_path_that_is_not_a_small_number_is_404(store: PolicyStore) -> None:
    client = client_for(store)
    for path in ("/admin/policy/versions/" + "9" * 5000, "/admin/policy/versions/one"):
        _assert_openai_error(client.get(path), 404, "unknown_version")


def test_unexpected_failure_is_a_json_500(
    store: PolicyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> list[object]:
        raise RuntimeError("bug")

    monkeypatch.setattr(store, "versions", broken)
    response = client_for(store).get("/admin/policy/versions")
    error = _assert_openai_error(response, 500, "internal")
    assert error["type"] == "server_error"


# -- auth ----------------------------------------------------------------------------------


ADMIN_CALLS = [
    ("GET", "/admin/policy", None),
    ("PUT", "/admin/policy", CHAT_OFF),
    ("POST", "/admin/policy/validate", CHAT_OFF),
    ("GET", "/admin/policy/versions", None),
    ("GET", "/admin/policy/versions/1", None),
    ("POST", "/admin/policy/rollback", '{"version": 1}'),
]


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
def test_without_token_remote_clients_get_403(
    store: PolicyStore, method: str, path: str, body: str | None
) -> None:
    response = client_for(store, peer=REMOTE).request(method, path, content=body)
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["type"] == "permission_error" and "DRAFTCTL_ADMIN_TOKEN" in error["message"]
    assert store.current()[0] == 1


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
def test_with_token_every_call_needs_bearer(
    store: PolicyStore, method: str, path: str, body: str | None
) -> None:
    client = client_for(store, token="s3cret", peer=LOOPBACK)
    missing = client.request(method, path, content=body)
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    assert missing.headers["www-authenticate"].startswith("Bearer")
    wrong = client.request(method, path, content=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert store.current()[0] == 1


def test_with_token_remote_client_with_bearer_is_allowed(store: PolicyStore) -> None:
    client = client_for(store, token="s3cret", peer=REMOTE)
    auth = {"Authorization": "Bearer s3cret"}
    assert client.get("/admin/policy", headers=auth).status_code == 200
    response = client.put("/admin/policy", content=CHAT_OFF, headers=auth)
    assert response.status_code == 200 and response.json()["version"] == 2
    basic = client.get("/admin/policy", headers={"Authorization": "Basic s3cret"})
    assert basic.status_code == 401


def test_auth_from_env_uses_the_configured_variable_name() -> None:
    auth = AdminAuth.from_env("MY_ADMIN_TOKEN", {"MY_ADMIN_TOKEN": "abc"})
    assert auth.token == "abc" and auth.token_env == "MY_ADMIN_TOKEN"
    assert AdminAuth.from_env("MY_ADMIN_TOKEN", {"DRAFTCTL_ADMIN_TOKEN": "x"}).token is None
    assert AdminAuth.from_env("MY_ADMIN_TOKEN", {"MY_ADMIN_TOKEN": ""}).token is None


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("testclient", False),
        (None, False),
    ],
)
def test_is_loopback(host: str | None, expected: bool) -> None:
    assert is_loopback(host) is expected


# -- proxies: X-Forwarded-For and RFC 7239 Forwarded ---------------------------------------


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({}, True),
        ({"Forwarded": "for=127.0.0.1"}, True),
        ({"Forwarded": 'for="[::1]:4711";proto=http'}, True),
        ({"Forwarded": "for=127.0.0.1, for=127.0.0.2;by=127.0.0.1"}, True),
        ({"X-Forwarded-For": "127.0.0.1"}, True),
        ({"Forwarded": "for=203.0.113.7"}, False),
        ({"Forwarded": "For=203.0.113.7;proto=https"}, False),
        ({"Forwarded": 'for="[2001:db8:cafe::17]:4711"'}, False),
        ({"Forwarded": "for=198.51.100.1:8080"}, False),
        ({"Forwarded": "for=127.0.0.1, for=203.0.113.7"}, False),
        ({"Forwarded": "for=unknown"}, False),
        ({"Forwarded": "for=_hidden"}, False),
        ({"Forwarded": "proto=https"}, False),
        ({"Forwarded": "for=127.0.0.1;;;garbage"}, False),
        ({"X-Forwarded-For": "203.0.113.7, 127.0.0.1"}, False),
    ],
)
def test_loopback_only_honours_forwarded_headers(
    store: PolicyStore, headers: dict[str, str], allowed: bool
) -> None:
    # Before: a loopback proxy sending only ``Forwarded:`` let any remote client in.
    response = client_for(store).get("/admin/policy", headers=headers)
    assert response.status_code == (200 if allowed else 403)
    if not allowed:
        assert response.json()["error"]["code"] == "admin_loopback_only"


def test_forwarded_header_parsing() -> None:
    assert forwarded_for(['for=192.0.2.60;proto=http;by=203.0.113.43, for="[::1]:80"']) == [
        "192.0.2.60",
        "[::1]:80",
    ]
    assert forwarded_for(["proto=https", 'for="a\\"b"']) == [None, 'a"b']
    with pytest.raises(ValueError):
        forwarded_for(["for=1.2.3.4 junk"])
