"""The README's curl commands work as printed, against the real front end and control plane (only the
ports differ: the tests' deployment listens on free ones instead of 8000 and 8700)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import TOKEN

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def readme_curls() -> list[str]:
    """Every curl command in the README's bash blocks, continuation lines joined."""
    text = ROOT.joinpath("README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            if cmd.startswith("curl "):
                out.append(cmd.split("  #")[0].strip())
    return out


CURLS = readme_curls()


def _run(cmd: str, frontend, deployment) -> str:
    port = deployment.cfg.control_port
    cmd = cmd.replace("localhost:8000", frontend.url.removeprefix("http://")).replace("localhost:8700", f"127.0.0.1:{port}")
    r = subprocess.run(["bash", "-c", cmd + " -w '\\n%{http_code}'"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "SPECCTL_TOKEN": TOKEN})
    body, _, code = r.stdout.rpartition("\n")
    assert r.returncode == 0 and code == "200", (cmd, r.returncode, code, body[:300], r.stderr[:300])
    return body


def test_the_readme_has_the_commands_this_test_checks():
    assert any("/v1/overrides" in c for c in CURLS) and any("/v1/completions" in c for c in CURLS)
    assert sum("/v2/models/" in c for c in CURLS) >= 3


@pytest.mark.parametrize("cmd", [c for c in CURLS if "/v1/overrides" in c], ids=["override"])
def test_the_override_curl_works_as_printed(cmd, frontend, deployment, policy):  # policy: cleared after
    body = json.loads(_run(cmd, frontend, deployment))
    want = json.loads(re.search(r"-d '(\{.*?\})'", cmd).group(1))["policy"]
    assert body["overrides"]["policy"] == want, body


@pytest.mark.parametrize("cmd", [c for c in CURLS if "localhost:8000" in c], ids=lambda c: c.split()[2][15:60])
def test_the_generate_curls_work_as_printed(cmd, frontend, deployment):
    body = _run(cmd, frontend, deployment)
    if "generate_stream" in cmd:
        events = [json.loads(ln[5:]) for ln in body.splitlines() if ln.startswith("data:")]
        assert events and all("text_output" in e for e in events), body[:300]
    elif '"stats": true' in cmd:
        assert "kv_slots" in json.loads(json.loads(body)["text_output"])
    elif "/v1/completions" in cmd:
        assert json.loads(body)["choices"][0]["text"]
    else:
        assert json.loads(body)["text_output"]
