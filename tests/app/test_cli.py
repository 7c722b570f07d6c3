"""Start-up and configuration errors are one line naming the field and the
fix, with exit status 2 (which the supervisor never retries)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
        ) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("JOULEGATE_")}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env={**base, **(env or {})},
                          cwd=cwd, capture_output=True, text=True, timeout=60)


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert "Traceback" not in out.stderr and lines, out.stderr
    return lines[-1]


def test_a_bad_setting_names_the_variable(tmp_path: Path) -> None:
    line = one_line(cli("serve", env={"JOULEGATE_PORT": "abc",
                                       "JOULEGATE_STATE_DIR": str(tmp_path)}))
    assert line.startswith("joulegate: JOULEGATE_PORT:") and "'abc'" in line
    line = one_line(cli("serve", env={"JOULEGATE_PORT": "99999",
                                       "JOULEGATE_STATE_DIR": str(tmp_path)}))
    assert "JOULEGATE_PORT" in line
    assert "not a port" in one_line(cli("serve", "--port", "99999"))


def test_a_copied_models_file_says_which_file_is_missing(tmp_path: Path) -> None:
    shutil.copy(ROOT / "models.yaml", tmp_path / "models.yaml")
    out = cli("serve", "--models", str(tmp_path / "models.yaml"),
              env={"JOULEGATE_STATE_DIR": str(tmp_path)})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "backends.0.curves: no file" in out.stderr
    assert "read from the models file's folder" in out.stderr


@pytest.mark.parametrize(("change", "said"), [
    ({"batch_profile": [[2, 1.0], [1, 2.0]]}, "batch_profile needs distinct concurrencies"),
    ({"batch_profile": [[1]]}, "ValueError"),
    ({"coef": None}, "missing 'coef'"),
    ({"coef": [1.0, 2.0]}, "2 coefficients, 7 features"),
])
def test_a_curves_file_that_is_not_a_curve_is_one_line(tmp_path: Path, change: dict[str, Any],
                                                       said: str) -> None:
    curve = json.loads((ROOT / "curves/cpu/small-llamacpp.json").read_text())
    curve.update(change)
    if change.get("coef", 0) is None:
        del curve["coef"]
    (tmp_path / "bad.json").write_text(json.dumps(curve))
    text = (ROOT / "models.yaml").read_text().replace(
        "curves: curves/cpu/small-llamacpp.json", f"curves: {tmp_path}/bad.json").replace(
        "curves: curves/", f"curves: {ROOT}/curves/")
    (tmp_path / "models.yaml").write_text(text)
    line = one_line(cli("serve", "--models", str(tmp_path / "models.yaml"),
                        env={"JOULEGATE_STATE_DIR": str(tmp_path)}))
    assert f"backends.0.curves: {tmp_path}/bad.json: not an operating curve" in line
    assert said in line


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this host has a GPU")
def test_nvml_on_a_host_without_a_gpu_is_one_line(tmp_path: Path) -> None:
    text = (ROOT / "models.yaml").read_text().replace("source: auto ", "source: nvml ")
    text = text.replace("curves: curves/", f"curves: {ROOT}/curves/")
    (tmp_path / "models.yaml").write_text(text)
    line = one_line(cli("serve", "--models", str(tmp_path / "models.yaml"),
                        env={"JOULEGATE_STATE_DIR": str(tmp_path)}))
    assert "devices.0 (local-cpu): source nvml" in line and "source: auto" in line


def test_usage_for_an_unknown_key_says_so(tmp_path: Path) -> None:
    line = one_line(cli("usage", "--key", "nobody", env={"JOULEGATE_STATE_DIR": str(tmp_path)}))
    assert "no key named 'nobody'" in line


def test_key_limits_are_finite_and_positive(tmp_path: Path) -> None:
    env = {"JOULEGATE_STATE_DIR": str(tmp_path)}
    for bad in (["--joule-budget", "nan"], ["--joule-budget", "-5"], ["--rpm", "-1"],
                ["--tpm", "1e30"]):
        out = cli("keys", "create", "--name", "team-a", *bad, env=env)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr


def test_an_agent_on_the_network_needs_a_token(tmp_path: Path) -> None:
    line = one_line(cli("agent", "--host", "0.0.0.0"))
    assert "refusing to serve 0.0.0.0 without a token" in line
    assert "JOULEGATE_AGENT_TOKEN" in line


def test_an_agent_makes_its_token_file_once(tmp_path: Path) -> None:
    """Compose's agent writes the token the gateway then reads (mode 600)."""
    from app.settings import Settings

    path = tmp_path / "state" / "agent-token"
    first = Settings(agent_token_file=path).agent_secret(create=True)
    assert first and len(first) >= 32 and path.stat().st_mode & 0o777 == 0o600
    assert Settings(agent_token_file=path).agent_secret() == first
    assert Settings(agent_token="given", agent_token_file=path).agent_secret() == "given"
    missing = tmp_path / "nothing"
    line = one_line(cli("serve", env={"JOULEGATE_AGENT_URL": "http://127.0.0.1:9",
                                       "JOULEGATE_AGENT_TOKEN_FILE": str(missing),
                                       "JOULEGATE_STATE_DIR": str(tmp_path)}))
    assert "JOULEGATE_AGENT_TOKEN_FILE" in line and str(missing) in line
