"""The Helm chart (helm/tetriserve): rendered by Helm's engine, linted, checked against KubeRay's CRD and golden
renders, and read for what the service needs. No cluster, no Ray, no vLLM.

Regenerate the golden renders after a deliberate chart change:
    TETRISERVE_REGEN_GOLDEN=1 python -m pytest -q tests/unit/test_helm_chart.py
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from helm_python.errors import HelmError

from tests import helm_support as hs


@pytest.fixture(scope="module", params=sorted(hs.VALUE_SETS))
def value_set(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], dict[str, str]]:
    values = hs.VALUE_SETS[request.param]
    return request.param, values, hs.render(values)


def _head(rendered: dict[str, str] | list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The RayCluster and its head's Ray container, from a render or its objects."""
    docs = hs.manifests(rendered) if isinstance(rendered, dict) else rendered
    (cluster,) = hs.of_kind(docs, "RayCluster")
    return cluster, cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]


def test_lint_has_no_findings(value_set: tuple[str, dict[str, Any], dict[str, str]]) -> None:
    _, values, _ = value_set
    report = hs.lint(values)
    assert report["messages"] == [] and report["errors"] == [], report


def test_rayclusters_validate_against_kuberay_crd(value_set: tuple[str, dict[str, Any], dict[str, str]]) -> None:
    _, _, rendered = value_set
    clusters = hs.of_kind(hs.manifests(rendered), "RayCluster")
    assert len(clusters) == 1
    validator = jsonschema.Draft7Validator(hs.raycluster_schema())
    for cluster in clusters:
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(cluster)]
        assert errors == []


def test_golden_render(value_set: tuple[str, dict[str, Any], dict[str, str]]) -> None:
    name, _, rendered = value_set
    text, path = hs.golden_text(rendered), hs.golden_path(name)
    if hs.regenerate():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden render: run with {hs.REGEN_ENV}=1"
    assert text == path.read_text(), f"{path} is stale: check the diff, then regenerate with {hs.REGEN_ENV}=1"


def test_the_strict_crd_schema_catches_a_misspelt_field() -> None:
    """The CRD check has teeth: a field KubeRay does not know fails (the API server would drop it)."""
    (cluster,) = hs.of_kind(hs.manifests(hs.render({})), "RayCluster")
    cluster["spec"]["workerGroupSpecs"][0]["maxReplica"] = 3
    assert not jsonschema.Draft7Validator(hs.raycluster_schema()).is_valid(cluster)


def test_values_schema_is_draft7_and_accepts_the_value_sets() -> None:
    schema = json.loads((hs.CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    defaults = yaml.safe_load((hs.CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(defaults)


@pytest.mark.parametrize(
    "values",
    [
        {"frontDoor": {"replicas": -1}},
        {"workerGroups": [{"name": "cpu", "minReplicas": 0, "maxReplicas": -2}]},
        {"workerGroups": [{"name": "cpu", "minReplicas": 0}]},  # no maxReplicas
        {"workerGroups": [{"name": "GPU_group", "minReplicas": 0, "maxReplicas": 1}]},
        {"workerGroups": [{"name": "l4", "minReplicas": 0, "maxReplicas": 1, "role": "prefill"}]},
        {"workerGroups": [{"name": "cpu", "minReplicas": 0, "maxReplicas": 1, "rayStartParams": {"num-cpus": 4}}]},
        {"replicaCount": 2},  # unknown top-level key
        {"serve": {"numDecode": -1}},
        {"serve": {"httpPort": 70000}},
        {"tls": {"enabled": True}},  # no secret
        {"apiKey": {"existingSecret": "keys", "value": "k"}},  # both
        {"autoscaling": {"enabled": True, "options": {"upscalingMode": "Eager"}}},
        {"head": {"resources": {"requests": {"cpu": "two"}}}},
        # the template's own checks, past the schema
        {"workerGroups": [{"name": "cpu", "minReplicas": 3, "maxReplicas": 1}]},
        {"workerGroups": [{"name": "cpu", "replicas": 5, "minReplicas": 0, "maxReplicas": 4}]},
        {"workerGroups": [{"name": "l4", "minReplicas": 0, "maxReplicas": 1}] * 2},
        {"serviceMonitor": {"enabled": True, "bearerTokenFromApiKey": True}},  # no key to send
    ],
)
def test_bad_values_are_refused(values: dict[str, Any]) -> None:
    with pytest.raises(HelmError):
        hs.render(values)


@pytest.mark.parametrize(
    "values",
    [
        {"workerGroups": []},  # every engine on the head
        {"workerGroups": [{"name": "cpu", "minReplicas": 2, "maxReplicas": 3}]},  # replicas: minReplicas
    ],
)
def test_edge_value_sets_render_valid_rayclusters(values: dict[str, Any]) -> None:
    (cluster,) = hs.of_kind(hs.manifests(hs.render(values)), "RayCluster")
    jsonschema.Draft7Validator(hs.raycluster_schema()).validate(cluster)
    assert [g["replicas"] for g in cluster["spec"]["workerGroupSpecs"]] == [2] * len(values["workerGroups"])


def test_head_starts_ray_then_serves_in_the_foreground() -> None:
    cluster, head = _head(hs.render({}))
    assert cluster["apiVersion"] == "ray.io/v1"
    assert cluster["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    shell, flag, script, argv0 = head["command"]
    assert (shell, flag, argv0) == ("/bin/bash", "-c", "tetriserve-head")
    lines = [line.strip() for line in script.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert lines[-2] == "${KUBERAY_GEN_RAY_START_CMD/ --block / }"  # Ray in the background
    assert lines[-1] == 'exec tetriserve serve "$@"'  # SIGTERM reaches serve: it drains
    subprocess.run(["bash", "-n", "-c", script], check=True)
    args = head["args"]
    assert args[:4] == ["--address", "auto", "--host", "0.0.0.0"]
    assert _flag(args, "--grpc-port") == "50051" and _flag(args, "--http-port") == "8000"
    assert _flag(args, "--num-prefill") == "1" and _flag(args, "--num-decode") == "1"
    # KubeRay's generated `ray start` contains " --block " between its flags (pod.go convertParamMap)
    generated = "ray start --head  --block  --dashboard-host=127.0.0.1  --metrics-export-port=8080 "
    assert "--block" not in _expand_like_bash(generated)


def _expand_like_bash(generated: str) -> list[str]:
    out = subprocess.run(
        ["bash", "-c", 'printf "%s\\n" ${G/ --block / }'], env={"G": generated}, capture_output=True, text=True
    )
    return out.stdout.split()


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_worker_groups_have_no_role_and_get_their_gpus() -> None:
    cluster, head = _head(hs.render(hs.VALUE_SETS["gpu-autoscaling-tls"]))
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert list(groups) == ["nvidia-l4", "nvidia-h100"]
    for name, gpus in (("nvidia-l4", 1), ("nvidia-h100", 8)):
        container = groups[name]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
        assert container["command"][-1].endswith("exec $KUBERAY_GEN_RAY_START_CMD")
        rendered = json.dumps(groups[name])
        assert "prefill" not in rendered and "decode" not in rendered  # roles are the control plane's, at run time
    assert (groups["nvidia-l4"]["minReplicas"], groups["nvidia-l4"]["maxReplicas"]) == (1, 8)
    assert cluster["spec"]["enableInTreeAutoscaling"] is True
    assert cluster["spec"]["autoscalerOptions"] == {"upscalingMode": "Conservative", "idleTimeoutSeconds": 300}
    script = head["command"][2]
    heredoc = script.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    compile(heredoc, "wait-for-gpus", "exec")
    assert "python3 - 4 600 <<'PY'" in script


def test_services_select_every_front_door_and_not_the_dashboard() -> None:
    rendered = hs.render(hs.VALUE_SETS["frontdoors-monitoring"])
    docs = hs.manifests(rendered)
    cluster, head = _head(rendered)
    (deployment,) = hs.of_kind(docs, "Deployment")
    services = {s["metadata"]["name"]: s for s in hs.of_kind(docs, "Service")}
    assert set(services) == {"demo-tetriserve-grpc", "demo-tetriserve-http"}
    head_labels = cluster["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    door_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for svc, port in (("demo-tetriserve-grpc", ("grpc", 50051)), ("demo-tetriserve-http", ("http", 8000))):
        selector = services[svc]["spec"]["selector"]
        assert selector.items() <= head_labels.items() and selector.items() <= door_labels.items()
        assert [(p["targetPort"], p["port"]) for p in services[svc]["spec"]["ports"]] == [port]
    for group in cluster["spec"]["workerGroupSpecs"]:
        labels = group["template"]["metadata"]["labels"]
        assert not services["demo-tetriserve-http"]["spec"]["selector"].items() <= labels.items()
    assert 8265 in [p["containerPort"] for p in head["ports"]]
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    default_cluster, _ = _head(hs.render({}))
    assert default_cluster["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    for container in (head, deployment["spec"]["template"]["spec"]["containers"][0]):
        assert container["livenessProbe"]["httpGet"]["path"] == "/health"
        assert container["startupProbe"]["httpGet"]["path"] == "/health"
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready"


def test_extra_front_doors_join_as_ray_nodes_with_the_keys() -> None:
    docs = hs.manifests(hs.render(hs.VALUE_SETS["frontdoors-monitoring"]))
    (deployment,) = hs.of_kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    bash, dash_c, script, _entry = container["command"]
    assert (bash, dash_c) == ("bash", "-c")
    # a Ray node of its own (Ray client cannot carry streaming calls) that offers no resources to actors
    assert script.startswith("ray start --address=demo-tetriserve-head-svc:6379 --num-cpus=0 --num-gpus=0")
    assert script.endswith('exec tetriserve "$@"')
    assert shlex.join(container["args"][:7]) == "frontdoor --address auto --grpc-port 50051 --http-port 8000"
    env = {e["name"]: e for e in container["env"]}
    assert env["TETRISERVE_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "demo-tetriserve-api-key",
        "key": "api-key",
    }
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "demo-tetriserve", "key": "auth_token"}
    (secret,) = hs.of_kind(docs, "Secret")
    assert secret["metadata"]["name"] == "demo-tetriserve-api-key"
    (monitor,) = hs.of_kind(docs, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"]) == ("http", "/metrics", "http")
    assert endpoint["authorization"]["credentials"] == {"name": "demo-tetriserve-api-key", "key": "api-key"}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert hs.of_kind(hs.manifests(hs.render({})), "Deployment") == []


def test_tls_and_an_existing_key_secret() -> None:
    docs = hs.manifests(hs.render(hs.VALUE_SETS["gpu-autoscaling-tls"]))
    cluster, head = _head(docs)
    args = head["args"]
    assert _flag(args, "--tls-cert") == "/etc/tetriserve/tls/tls.crt"
    assert _flag(args, "--tls-key") == "/etc/tetriserve/tls/tls.key"
    assert _flag(args, "--model") == "/models/Llama-3.1-8B-Instruct"
    assert _flag(args, "--config") == "/etc/tetriserve/config/cluster.yaml"
    assert args[-2:] == ["--transport", "tcp"]
    volumes = {v["name"]: v for v in cluster["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "tetriserve-tls"
    assert volumes["model"]["persistentVolumeClaim"]["claimName"] == "models"
    assert head["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (env,) = head["env"]
    assert env == {
        "name": "TETRISERVE_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "tetriserve-keys", "key": "key"}},
    }
    assert hs.of_kind(docs, "Secret") == []  # the key's Secret exists already
    (config,) = hs.of_kind(docs, "ConfigMap")
    assert yaml.safe_load(config["data"]["cluster.yaml"]) == hs.VALUE_SETS["gpu-autoscaling-tls"]["serve"]["config"]


def test_golden_files_are_the_three_value_sets() -> None:
    assert sorted(p.stem for p in Path(hs.GOLDEN).glob("*.yaml")) == sorted(hs.VALUE_SETS)


def test_vendored_crd_is_kuberay_1_7_0() -> None:
    """The CRD the checks read is the vendored copy, and it is KubeRay v1.7.0's released file."""
    assert hashlib.sha256(hs.crd_bytes()).hexdigest() == hs.CRD_SHA256


def test_pod_commands_run_ray_then_tetriserve(tmp_path: Path) -> None:
    """The head's and a worker's commands, run by bash with stand-ins for `ray` and `tetriserve` that log their
    argv: Ray starts without --block, then `tetriserve serve` gets the chart's flags."""
    log = tmp_path / "calls"
    for tool in ("ray", "tetriserve"):
        stub = tmp_path / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\n')
        stub.chmod(0o755)
    cluster, head = _head(hs.render({}))
    generated = "ray start --head  --block  --dashboard-host=127.0.0.1  --metrics-export-port=8080 "
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "KUBERAY_GEN_RAY_START_CMD": generated}
    subprocess.run([*head["command"], *head["args"]], env=env, check=True)
    ray, serve = log.read_text().splitlines()
    assert ray.split() == ["ray", "start", "--head", "--dashboard-host=127.0.0.1", "--metrics-export-port=8080"]
    assert serve == "tetriserve serve " + shlex.join(head["args"])
    log.unlink()
    worker = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    env["KUBERAY_GEN_RAY_START_CMD"] = (
        "ray start  --address=demo-tetriserve-head-svc.serving.svc.cluster.local:6379  --block "
    )
    subprocess.run(worker["command"], env=env, check=True)
    assert log.read_text().split() == [
        "ray",
        "start",
        "--address=demo-tetriserve-head-svc.serving.svc.cluster.local:6379",
        "--block",
    ]
