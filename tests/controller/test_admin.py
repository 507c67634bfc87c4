"""The admin API mounted on a small Starlette app, exercised over ASGI."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from controller.admin import AdminAuth, admin_routes
from controller.admin_auth import is_loopback
from controller.policy_store import DEFAULT_POLICY_TEXT, PolicyStore

CHAT_OFF = DEFAULT_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [0, 0, 0, 0]")
CHAT_SMALL = DEFAULT_POLICY_TEXT.replace("chat: [7, 4, 4, 0]", "chat: [4, 4, 0, 0]")
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
    bad = DEFAULT_POLICY_TEXT.replace("min_spec_tokens: 4", "min_spec_tokens: 0").replace(
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

    monkeypatch.setattr("controller.policy_versions.write_atomically", disk_full)
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
