"""llm-d: the model servers as Deployments labelled by role, an InferencePool (Gateway API Inference Extension,
``inference.networking.k8s.io/v1``) that selects them, and its endpoint picker (llm-d's inference scheduler) with
the scheduling profile: prefill then decode for disaggregated pools, one decode profile otherwise.

The layout follows llm-d's guides (guides/pd-disaggregation in github.com/llm-d/llm-d): decode pods run vLLM on
8200 behind the routing sidecar on 8000, which asks a prefill pod for the KV (NIXL) before decoding; pods carry
``llm-d.ai/role`` and ``llm-d.ai/inference-serving`` labels. A Gateway and an HTTPRoute to the pool are the
cluster's own (one per cluster, not per model) and are not written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.errors import InputError
from simulator.report.deploy import common

if TYPE_CHECKING:
    from simulator.plan.engine_run import EngineRun

SCHEDULER_IMAGE = "ghcr.io/llm-d/llm-d-inference-scheduler:v0.5.0"
SIDECAR_IMAGE = "ghcr.io/llm-d/llm-d-routing-sidecar:v0.3.0"
EPP_PORT, EPP_HEALTH_PORT = 9002, 9003
DECODE_ENGINE_PORT = 8200  # vLLM behind the routing sidecar, as in llm-d's guides
# The simulated router's policy as the endpoint picker's scorer (both pick the least loaded pod by that measure).
# The simulated router's policy as the endpoint picker's scorers (llm-d inference scheduler plugins): prefix places by
# cached prefix and load, as --router prefix does, so it scores both.
SCORERS = {"round_robin": ("queue-scorer",), "least_outstanding": ("queue-scorer",),
           "least_kv": ("kv-cache-utilization-scorer",), "prefix": ("prefix-cache-scorer", "queue-scorer")}


def only_vllm(engine: str) -> str:
    return (f"--deploy llm-d: llm-d's routing sidecar and scheduler are written here for vLLM; the run's engine is "
            f"{engine}: run with --engine vllm, or use --deploy dynamo or --deploy k8s")


def _scheduler_config(disaggregated: bool, scorers: tuple[str, ...]) -> str:
    """The endpoint picker's EndpointPickerConfig (YAML text): llm-d's pd-profile-handler with threshold 0 (every
    request is disaggregated, as the simulated pools are) or one decode profile; each scorer weighted 1."""
    plugins = "".join(f"- type: {scorer}\n" for scorer in scorers)
    refs = "".join(f"  - pluginRef: {scorer}\n    weight: 1.0\n" for scorer in scorers)
    if disaggregated:
        return (
            "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
            f"- type: prefill-header-handler\n- type: prefill-filter\n- type: decode-filter\n{plugins}"
            "- type: max-score-picker\n- type: pd-profile-handler\n  parameters:\n    threshold: 0\n"
            "schedulingProfiles:\n"
            f"- name: prefill\n  plugins:\n  - pluginRef: prefill-filter\n{refs}"
            "  - pluginRef: max-score-picker\n"
            f"- name: decode\n  plugins:\n  - pluginRef: decode-filter\n{refs}"
            "  - pluginRef: max-score-picker\n"
        )
    return ("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
            f"{plugins}- type: max-score-picker\n- type: single-profile-handler\nschedulingProfiles:\n"
            f"- name: default\n  plugins:\n{refs}  - pluginRef: max-score-picker\n")


def _server(run: "EngineRun", engine: str, worker: common.Worker, name: str, pool_labels: dict[str, str],
            disaggregated: bool) -> dict[str, Any]:
    role = "decode" if worker.role == "server" else worker.role
    labels = {**pool_labels, "llm-d.ai/role": role}
    sidecar = None
    port = common.PORTS[engine]
    if disaggregated and role == "decode":
        port = DECODE_ENGINE_PORT
        sidecar = {
            "name": "routing-proxy",
            "image": SIDECAR_IMAGE,
            "restartPolicy": "Always",  # a native sidecar: starts before the server, lives as long as the pod
            "args": [f"--port={common.PORTS[engine]}", f"--vllm-port={DECODE_ENGINE_PORT}", "--connector=nixlv2",
                     "--secure-proxy=false"],
            "ports": [{"name": "http", "containerPort": common.PORTS[engine], "protocol": "TCP"}],
        }
    container = common.server_container("vllm", engine, common.served(run), worker.args, worker.gpus, port)
    if sidecar is not None:
        container["ports"] = [{"name": "engine", "containerPort": port, "protocol": "TCP"}]
    if disaggregated:
        # The NIXL side channel listens on the pod's own address.
        container["env"].append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    return common.deployment(f"{name}-{role}", labels, worker.replicas, [container], [sidecar] if sidecar else None)


def _picker(name: str, pool: str, config: str) -> list[dict[str, Any]]:
    """The endpoint picker: its config, account and rights (read pods and the pool), Deployment and Service."""
    epp = f"{name}-epp"
    labels = {"app.kubernetes.io/name": epp, "app.kubernetes.io/managed-by": "memwall"}
    container = {
        "name": "epp",
        "image": SCHEDULER_IMAGE,
        "args": ["--pool-name", pool, "--pool-namespace", "$(POD_NAMESPACE)", "--config-file", "/config/epp-config.yaml",
                 "--grpc-port", str(EPP_PORT), "--grpc-health-port", str(EPP_HEALTH_PORT)],
        "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [{"name": "grpc", "containerPort": EPP_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"}],
        # As the Gateway API Inference Extension's own manifests probe it (conformance/resources/base.yaml).
        "readinessProbe": {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}, "periodSeconds": 2},
        "livenessProbe": {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}, "periodSeconds": 10},
        "volumeMounts": [{"name": "config", "mountPath": "/config"}],
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": epp, "labels": dict(labels)},
        "spec": {"replicas": 1, "selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)},
                              "spec": {"serviceAccountName": epp, "containers": [container],
                                       "volumes": [{"name": "config", "configMap": {"name": f"{epp}-config"}}]}}},
    }
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{epp}-config", "labels": dict(labels)},
         "data": {"epp-config.yaml": config}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": epp, "labels": dict(labels)}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": epp, "labels": dict(labels)},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": epp, "labels": dict(labels)},
         "subjects": [{"kind": "ServiceAccount", "name": epp}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp}},
        deployment,
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": epp, "labels": dict(labels)},
         "spec": {"type": "ClusterIP", "selector": dict(labels),
                  "ports": [{"name": "grpc", "port": EPP_PORT, "targetPort": EPP_PORT, "protocol": "TCP",
                             "appProtocol": "http2"}]}},
    ]


def manifests(run: "EngineRun") -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """({file name: [objects]}, notes) for ``--deploy llm-d``."""
    engine = common.engine_of(run.settings, "llm-d")
    disaggregated = run.result.extra.get("pools") is not None
    if engine != "vllm":
        raise InputError(only_vllm(engine))
    name = common.base_name(run)
    pool_labels = {"llm-d.ai/inference-serving": "true", "llm-d.ai/model": common.label_value(name)}
    servers = [_server(run, engine, worker, name, pool_labels, disaggregated) for worker in common.workers(run, engine, "llm-d")]
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": dict(pool_labels)},
            "targetPorts": [{"number": common.PORTS[engine]}],
            "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": EPP_PORT}, "failureMode": "FailClose"},
        },
    }
    config = _scheduler_config(disaggregated, SCORERS[run.settings.router])
    pods = ", ".join(f"{s['spec']['replicas']} {s['metadata']['labels']['llm-d.ai/role']}" for s in servers)
    notes = [f"llm-d: {pods} pod(s) in InferencePool {name}; endpoint picker {name}-epp "
             f"({'prefill then decode profile' if disaggregated else 'one decode profile'}, {' + '.join(SCORERS[run.settings.router])}); "
             "route your Gateway's HTTPRoute to the InferencePool"]
    return {"modelserver.yaml": servers, "inferencepool.yaml": [pool], "endpoint-picker.yaml": _picker(name, name, config)}, notes
