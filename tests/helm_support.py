"""Render the Helm chart with the real Helm engine and check what comes out, without a cluster.

    helm/tetriserve ──helm_python (Helm v4's Go engine, no binary)──▶ {template: manifest}
        ├─ lint: no findings
        ├─ every RayCluster ──jsonschema──▶ KubeRay v1.7.0 CRD's openAPIV3Schema (v1), made strict:
        │     an object with listed properties takes no others (what kubeconform -strict does)
        └─ golden renders in tests/data/helm_golden/<set>.yaml (TETRISERVE_REGEN_GOLDEN=1 rewrites them)

The CRD is the copy vendored in tests/data/kuberay/ (gzipped; its PROVENANCE.txt says where it comes from), checked
against the released file's sha256.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "tetriserve"
GOLDEN = ROOT / "tests" / "data" / "helm_golden"
VENDORED_CRD = ROOT / "tests" / "data" / "kuberay" / "ray.io_rayclusters.yaml.gz"
CRD_SHA256 = "c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1"  # v1.7.0, PROVENANCE.txt
RELEASE, NAMESPACE = "demo", "serving"
REGEN_ENV = "TETRISERVE_REGEN_GOLDEN"

# The three value sets with golden renders
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default-cpu": {},
    "gpu-autoscaling-tls": {
        "image": {"repository": "registry.example.com/tetriserve", "tag": "0.1.0-cuda"},
        "model": {
            "path": "/models/Llama-3.1-8B-Instruct",
            "servedModelName": "llama-3.1-8b",
            "volume": {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
        },
        "serve": {
            "numPrefill": 2,
            "numDecode": 2,
            "waitForGPUs": 4,
            "config": {"engine": {"dtype": "bfloat16", "max_model_len": 8192}, "flip": {"policy": "tetriinfer"}},
            "extraArgs": ["--transport", "tcp"],
        },
        "workerGroups": [
            {
                "name": "nvidia-l4",
                "replicas": 2,
                "minReplicas": 1,
                "maxReplicas": 8,
                "gpus": 1,
                "resources": {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"memory": "32Gi"}},
                "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
            {
                "name": "nvidia-h100",
                "replicas": 1,
                "minReplicas": 0,
                "maxReplicas": 4,
                "gpus": 8,
                "idleTimeoutSeconds": 600,
                "resources": {"requests": {"cpu": "64", "memory": "512Gi"}, "limits": {"memory": "512Gi"}},
                "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
            },
        ],
        "autoscaling": {"enabled": True, "options": {"upscalingMode": "Conservative", "idleTimeoutSeconds": 300}},
        "tls": {"enabled": True, "secretName": "tetriserve-tls"},
        "apiKey": {"existingSecret": "tetriserve-keys", "secretKey": "key"},
    },
    "frontdoors-monitoring": {
        "frontDoor": {"replicas": 3},
        "apiKey": {"value": "not-a-real-key"},
        "serviceMonitor": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "bearerTokenFromApiKey": True,
        },
        "rayDashboard": {"host": "0.0.0.0"},
    },
}


def render(values: dict[str, Any]) -> dict[str, str]:
    """Template path -> rendered text, by Helm's own engine (values.schema.json applies)."""
    from helm_python.chart import Chart

    with Chart.load(CHART) as chart:
        return chart.render(values, name=RELEASE, namespace=NAMESPACE)


def lint(values: dict[str, Any]) -> dict[str, Any]:
    from helm_python.chart import lint as helm_lint

    return helm_lint(CHART, values, namespace=NAMESPACE)


def manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object in a render (NOTES.txt is not one)."""
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def golden_text(rendered: dict[str, str]) -> str:
    """A render as `helm template` prints it: each non-empty template under a `# Source:` line."""
    parts = [f"---\n# Source: {path}\n{text.strip()}\n" for path, text in sorted(rendered.items()) if text.strip()]
    return "".join(parts)


def golden_path(name: str) -> Path:
    return GOLDEN / f"{name}.yaml"


def regenerate() -> bool:
    return os.environ.get(REGEN_ENV) == "1"


def crd_bytes() -> bytes:
    """The RayCluster CRD as released (the YAML), from the vendored copy."""
    return gzip.decompress(VENDORED_CRD.read_bytes())


@cache
def raycluster_schema() -> dict[str, Any]:
    """The v1 openAPIV3Schema of KubeRay's RayCluster CRD, strict about unknown fields."""
    data = crd_bytes()
    if hashlib.sha256(data).hexdigest() != CRD_SHA256:
        raise AssertionError("the RayCluster CRD is not KubeRay v1.7.0's (PROVENANCE.txt)")
    crd = yaml.safe_load(data)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return strict(v1["schema"]["openAPIV3Schema"])


def strict(node: Any) -> Any:
    """Copy of an OpenAPI schema where an object listing its properties forbids others, as the API server's
    pruning would silently drop them (x-kubernetes-preserve-unknown-fields keeps them open)."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out
