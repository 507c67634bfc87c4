"""The config file model: defaults, unknown keys, line-numbered problems, path resolution."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controller.config import load_config, parse_config
from engines.config import EmbeddedConfig, PoolConfig
from policies.validation import InvalidDocument

ROOT = Path(__file__).resolve().parents[2]

POOL = """\
backends:
  - name: k7
    kind: vllm
    urls: [http://127.0.0.1:8101/]
    model: demo
    spec_tokens: 7
    block_size: 16
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(InvalidDocument) as info:
        parse_config(text, Path("/cfg"))
    return [str(p) for p in info.value.problems]


def test_defaults_fill_every_section() -> None:
    config = parse_config(POOL, Path("/cfg"))
    assert config.server.port == 8000 and config.server.drain_timeout_s == 30
    assert config.policy.path == Path("/cfg/policy.yaml")
    assert config.classifier.fallback_task == "chat"
    pool = config.backends[0]
    assert isinstance(pool, PoolConfig)
    assert pool.urls == ["http://127.0.0.1:8101"]  # trailing slash dropped


def test_embedded_paths_resolve_against_config_folder() -> None:
    text = "backends:\n  - {name: e, kind: embedded, model: demo, target: m/t, draft: /abs/d}\n"
    backend = parse_config(text, Path("/etc/draftctl")).backends[0]
    assert isinstance(backend, EmbeddedConfig)
    assert backend.target == Path("/etc/draftctl/m/t") and backend.draft == Path("/abs/d")
    # the caches too: the cost profile's and torch.compile's
    assert backend.cost_cache_dir == Path("/etc/draftctl/.draftctl/cost-tables")
    assert backend.compile_cache_dir == Path("/etc/draftctl/.draftctl/compile-cache")
    off = parse_config(text.replace("/abs/d}", "/abs/d, compile_cache_dir: null}"), Path("/e"))
    assert off.backends[0].compile_cache_dir is None  # type: ignore[union-attr]


def test_torch_compile_on_cpu_is_a_config_problem() -> None:
    text = (
        "backends:\n  - {name: e, kind: embedded, model: demo, target: t, draft: d,\n"
        "     device: cpu, torch_compile: true}\n"
    )
    (problem,) = _problems(text)
    assert problem.startswith("backends.0.embedded: Value error, torch_compile needs CUDA graphs")
    assert parse_config(text.replace("cpu", "cuda"), Path("/cfg")).backends[0].torch_compile


def test_a_compile_scope_without_torch_compile_is_a_config_problem() -> None:
    text = (
        "backends:\n  - {name: e, kind: embedded, model: demo, target: t, draft: d,\n"
        "     device: cuda, torch_compile_scope: layer}\n"
    )
    (problem,) = _problems(text)
    assert "torch_compile_scope: layer only applies with torch_compile: true" in problem
    on = parse_config(text.replace("layer}", "layer, torch_compile: true}"), Path("/cfg"))
    assert on.backends[0].torch_compile_scope == "layer"  # type: ignore[union-attr]
    (problem,) = _problems(text.replace("scope: layer", "scope: model"))
    assert "torch_compile_scope" in problem and "'forward' or 'layer'" in problem


def test_a_compile_mode_without_torch_compile_is_a_config_problem() -> None:
    text = (
        "backends:\n  - {name: e, kind: embedded, model: demo, target: t, draft: d,\n"
        "     device: cuda, torch_compile_mode: max-autotune}\n"
    )
    (problem,) = _problems(text)
    assert "torch_compile_mode: max-autotune only applies with torch_compile: true" in problem
    on = parse_config(text.replace("autotune}", "autotune, torch_compile: true}"), Path("/cfg"))
    assert on.backends[0].torch_compile_mode == "max-autotune"  # type: ignore[union-attr]


def test_triton_attention_needs_cuda() -> None:
    text = (
        "backends:\n  - {name: e, kind: embedded, model: demo, target: t, draft: d,\n"
        "     device: cpu, attention: triton}\n"
    )
    (problem,) = _problems(text)
    assert "attention: triton runs on CUDA" in problem
    on = parse_config(text.replace("cpu", "cuda"), Path("/cfg"))
    assert on.backends[0].attention == "triton"  # type: ignore[union-attr]
    (problem,) = _problems(text.replace("triton}", "dense}"))
    assert "attention" in problem and "'auto', 'sdpa' or 'triton'" in problem
    auto = parse_config(text.replace(", attention: triton", ""), Path("/cfg"))
    assert auto.backends[0].attention == "auto"  # type: ignore[union-attr]  # triton on CUDA


def test_verify_mode_defaults_to_ragged_and_names_a_bad_value() -> None:
    text = "backends:\n  - {name: e, kind: embedded, model: demo, target: t, draft: d}\n"
    backend = parse_config(text, Path("/cfg")).backends[0]
    assert isinstance(backend, EmbeddedConfig) and backend.verify_mode == "ragged"
    padded = parse_config(text.replace("d}", "d, verify_mode: padded}"), Path("/cfg"))
    assert padded.backends[0].verify_mode == "padded"  # type: ignore[union-attr]
    (problem,) = _problems(text.replace("d}", "d, verify_mode: packed}"))
    assert problem == (
        "backends.0.verify_mode: Input should be 'padded' or 'ragged' (got 'packed') (line 2)"
    )


def test_problems_name_dotted_key_and_line() -> None:
    text = (
        POOL.replace("spec_tokens: 7", "spec_tokens: 7\n    colour: red") + "server:\n  port: x\n"
    )
    assert sorted(_problems(text)) == [
        "backends.0.colour: unknown key (line 7)",
        "server.port: Input should be a valid integer, unable to parse string as an integer "
        "(got 'x') (line 10)",
    ]


def test_k_must_fit_the_block_and_names_be_unique() -> None:
    assert any(
        "exceeds block_size - 1 = 7" in p
        for p in _problems(
            POOL.replace("block_size: 16", "block_size: 8").replace(
                "spec_tokens: 7", "spec_tokens: 9"
            )
        )
    )
    twice = POOL + POOL.split("backends:\n", 1)[1]
    assert any("'k7' is used twice" in p for p in _problems(twice))


def test_unknown_backend_kind_and_bad_url() -> None:
    problems = _problems(POOL.replace("kind: vllm", "kind: tgi"))
    assert problems[0].startswith("backends.0: Input tag 'tgi'")
    problems = _problems(POOL.replace("http://127.0.0.1:8101/", "127.0.0.1:8101"))
    assert problems == [
        "backends.0.urls: Value error, '127.0.0.1:8101' must start with http:// or https:// "
        "(line 4)"
    ]


def test_missing_file_is_a_problem(tmp_path: Path) -> None:
    with pytest.raises(InvalidDocument, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_config_check_cli(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(POOL)
    result = _cli("config", "check", str(good))
    assert (result.returncode, result.stdout) == (0, "ok\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(POOL + "bogus: 1\nstats: {window_s: -1}\n")
    result = _cli("config", "check", str(bad))
    assert result.returncode == 1
    assert sorted(result.stdout.splitlines()) == [
        "bogus: unknown key (line 8)",
        "stats.window_s: Input should be greater than 0 (got -1) (line 9)",
    ]


def test_repository_config_is_valid_and_schema_prints() -> None:
    assert _cli("config", "check", str(ROOT / "config.yaml")).stdout == "ok\n"
    schema = json.loads(_cli("config", "schema").stdout)
    assert schema["additionalProperties"] is False
    assert {"server", "admin", "policy", "classifier", "stats", "backends"} <= set(
        schema["properties"]
    )


def test_bursts_default_to_4_and_name_a_bad_value() -> None:
    text = "backends:\n  - {name: e, kind: embedded, model: demo, target: t, draft: d}\n"
    backend = parse_config(text, Path("/cfg")).backends[0]
    assert isinstance(backend, EmbeddedConfig) and backend.plain_burst == 4
    assert backend.spec_burst == 4
    off = parse_config(text.replace("d}", "d, plain_burst: 1}"), Path("/cfg"))
    assert off.backends[0].plain_burst == 1  # type: ignore[union-attr]
    (problem,) = _problems(text.replace("d}", "d, plain_burst: 17}"))
    assert problem.startswith("backends.0.plain_burst: Input should be less than or equal to 16")
    assert backend.plain_chain is True  # chained plain bursts: on (measured, session 46)
    unchained = parse_config(text.replace("d}", "d, plain_chain: false}"), Path("/cfg"))
    assert unchained.backends[0].plain_chain is False  # type: ignore[union-attr]
