"""Container entrypoint of a Triton replica: write its model repository, then become tritonserver.

Two sources of the model repository:

- ``SPECCTL_MODEL_REPO``: a repository built for a GPU SKU (``specctl build --recipe ...``: its
  ``triton_repo/`` next to the engines, on a volume). It is copied into the run directory with
  ``@OUT@`` replaced by the build directory (``SPECCTL_BUILD_DIR``, default the repository's parent)
  and the ``llm`` model's config pointed at the control plane.
- otherwise ``SPECCTL_ENGINE_DIR`` (the CPU reference pair): rendered like ``specctl serve`` does.

Either way the ``llm`` model's agent finds the control plane at ``SPECCTL_CONTROL_URL`` with the token
in ``SPECCTL_TOKEN_FILE`` (a mounted Secret; the config names the file, never the token) and names
its replica ``SPECCTL_REPLICA`` (the pod's name). Triton's HTTP listens on the pod's loopback
(``SPECCTL_TRITON_HTTP_PORT``, default 8080: probes and the front end beside it), gRPC and metrics on
every address (``SPECCTL_TRITON_GRPC_PORT`` 8001, ``SPECCTL_TRITON_METRICS_PORT`` 8002).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

RUN_DIR = Path(os.environ.get("SPECCTL_RUN_DIR", "/tmp/specctl-run"))
CONTROL_PARAMS = ("control_url", "control_token_file")


def _env(name: str, default: str | None = None) -> str:
    v = os.environ.get(name, default)
    if v is None:
        sys.exit(f"triton_entrypoint: set {name} (see deploy/docker/triton_entrypoint.py)")
    return v


def _param(key: str, value: str) -> str:
    return f'parameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'


def copy_built_repo(src: Path, out: Path, build_dir: Path, control_url: str, token_file: str) -> Path:
    """Copy a built repository, fill in ``@OUT@`` and point the llm model at the control plane."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out, symlinks=True)
    for cfg in out.glob("*/config.pbtxt"):
        text = cfg.read_text().replace("@OUT@", str(build_dir))
        if cfg.parent.name == "llm" and control_url:
            lines = [ln for ln in text.splitlines(keepends=True)
                     if not any(f'key: "{k}"' in ln for k in CONTROL_PARAMS)]
            text = "".join(lines) + _param("control_url", control_url) + _param("control_token_file", token_file)
        cfg.write_text(text)
    return out


def model_repository() -> Path:
    control_url = os.environ.get("SPECCTL_CONTROL_URL", "")
    token_file = os.environ.get("SPECCTL_TOKEN_FILE", "") if control_url else ""
    built = os.environ.get("SPECCTL_MODEL_REPO")
    if built:
        src = Path(built)
        build_dir = Path(os.environ.get("SPECCTL_BUILD_DIR", str(src.parent)))
        return copy_built_repo(src, RUN_DIR / "model_repository", build_dir, control_url, token_file)
    from control.triton.repo import render_llm_repo

    profile = os.environ.get("SPECCTL_PROFILE")
    return render_llm_repo(RUN_DIR / "model_repository", engine_dir=Path(_env("SPECCTL_ENGINE_DIR")),
                           profile=Path(profile) if profile else None, policy=os.environ.get("SPECCTL_POLICY", "adaptive"),
                           control_url=control_url, control_token_file=Path(token_file) if token_file else None,
                           max_batch=int(os.environ.get("SPECCTL_MAX_BATCH", "32")),
                           max_tokens=int(os.environ.get("SPECCTL_MAX_TOKENS", "1024")),
                           threads=int(os.environ.get("SPECCTL_THREADS", "1")))


def main() -> None:
    import secrets

    from control.buildsys.triton_launch import admin_flags
    from control.triton.server import find_tritonserver, prepare_backends, server_env, write_admin_key

    RUN_DIR.mkdir(parents=True, exist_ok=True)
    repo = model_repository()
    install = find_tritonserver()
    backends = prepare_backends(install, RUN_DIR) if install.stub else install.python_backend.parent
    root = str(Path(__file__).resolve().parents[2])
    cmd = [str(install.binary), f"--model-repository={repo}", f"--backend-directory={backends}",
           "--http-address=127.0.0.1", f"--http-port={os.environ.get('SPECCTL_TRITON_HTTP_PORT', '8080')}",
           "--grpc-address=0.0.0.0", f"--grpc-port={os.environ.get('SPECCTL_TRITON_GRPC_PORT', '8001')}",
           "--metrics-address=0.0.0.0", f"--metrics-port={os.environ.get('SPECCTL_TRITON_METRICS_PORT', '8002')}",
           "--exit-on-error=true", "--exit-timeout-secs=10", "--log-verbose=0"]
    # Triton's administration (log, trace, shared memory, repository) behind a key: gRPC faces the cluster
    key = os.environ.get("SPECCTL_TRITON_ADMIN_KEY") or secrets.token_urlsafe(24)
    write_admin_key(RUN_DIR, key)
    print("triton_entrypoint: " + " ".join([*cmd, *admin_flags("<admin key>"), *sys.argv[1:]]), flush=True)
    cmd += [*admin_flags(key), *sys.argv[1:]]
    os.execve(cmd[0], cmd, server_env(install, [root]))


if __name__ == "__main__":
    main()
