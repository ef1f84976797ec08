"""What every platform's manifests share: the engine and its container, names, labels, GPU counts.

The container arguments are the launch command's (simulator.report.vllm_format), split into argv words, so a
manifest starts the same server that ``--launch-command`` prints. Image tags are the releases the shipped engine
profiles describe; a platform team pins its own (every image is one value in the written files).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simulator.errors import InputError
from simulator.plan.deployment_planner import engine_from_options
from simulator.report.vllm_format import _sglang_args, _vllm_args, kv_transfer_flags, served_model

if TYPE_CHECKING:
    from simulator.plan.engine_run import EngineRun
    from simulator.plan.settings import RunSettings

# The servers' images and where they listen (vLLM's and SGLang's defaults: 8000 and 30000).
IMAGES = {"vllm": "vllm/vllm-openai:v0.10.2", "sglang": "lmsysorg/sglang:v0.4.10"}
PORTS = {"vllm": 8000, "sglang": 30000}
HF_SECRET = "hf-token-secret"  # a Secret holding HF_TOKEN, for gated checkpoints (optional in every pod)
NAME_LIMIT = 40  # leaves room for suffixes ("-prefill", "-epp") under Kubernetes' 63-character label limit


@dataclass(frozen=True)
class Worker:
    """One kind of serving pod: its role, how many, GPUs each, the engine's arguments (argv words, model excluded)."""

    role: str  # "server" (colocated), "prefill" or "decode"
    replicas: int
    gpus: int  # per pod: tensor x pipeline degree
    gpu_name: str
    args: list[str]


def engine_of(settings: "RunSettings", platform: str) -> str:
    """vllm or sglang: the serving engine the settings' profile describes; InputError for an engine with no server to run."""
    profile = engine_from_options(settings.model_dump())
    for family in ("vllm", "sglang"):
        if profile.name == family or profile.name.startswith(f"{family}-"):
            return family
    raise InputError(f"--deploy {platform}: engine profile '{profile.name}' has no server to deploy; "
                     "run with --engine vllm or --engine sglang (the engines --launch-command writes)")


def argv(parts: list[str]) -> list[str]:
    """The launch command's flags (``"--tp 2"``, ``"--speculative-config '{...}'"``) as argv words."""
    return [word for part in parts for word in shlex.split(part)]


def engine_args(system: Any, pp: int, run: "EngineRun", engine: str) -> list[str]:
    """The flags ``--launch-command`` gives one server of ``system`` (the model and port excluded)."""
    builder = _vllm_args if engine == "vllm" else _sglang_args
    return argv(builder(system, pp, run.config, run.settings))


def workers(run: "EngineRun", engine: str, platform: str, kv_transfer: bool = True) -> list[Worker]:
    """The serving pods of the run: one kind for colocated replicas, a prefill and a decode kind when disaggregated
    (with the launch command's KV-transfer flags when ``kv_transfer``; Dynamo's workers set their own).
    InputError when one replica needs more GPUs than a node has (multi-node serving is not written)."""
    pools = run.result.extra.get("pools")
    if pools is None:
        dep = run.deployment
        kinds = [("server", run.settings.replicas, dep)]
    else:
        kinds = [(pool.role, pool.replicas, pool.deployment) for pool in pools]
    out = []
    for role, replicas, dep in kinds:
        system = dep.system
        if dep.gpus > system.gpu.max_gpus_per_node:
            raise InputError(f"--deploy {platform}: a {role} replica needs {dep.gpus} GPUs, more than one "
                             f"{system.gpu.name} node's {system.gpu.max_gpus_per_node}; multi-node serving "
                             "(LeaderWorkerSet, Dynamo multinode) is not written: choose a smaller --tp/--pp")
        args = engine_args(system, dep.pp, run, engine)
        if role != "server" and kv_transfer:
            args += transfer_args(engine, role)
        out.append(Worker(role, int(replicas), int(dep.gpus), system.gpu.name, args))
    return out


def transfer_args(engine: str, role: str) -> list[str]:
    """A disaggregated worker's KV-transfer flags as argv words: the launch command's (:func:`kv_transfer_flags`)."""
    return argv(kv_transfer_flags(engine, role))


def served(run: "EngineRun") -> str:
    """The checkpoint the pods serve (the model's Hugging Face id, else its config name)."""
    return served_model(run.deployment.system.model)[0]


def base_name(run: "EngineRun") -> str:
    """A Kubernetes object name for the deployment: lower-case letters, digits and dashes (RFC 1123)."""
    text = re.sub(r"[^a-z0-9-]+", "-", f"memwall-{run.deployment.system.model.name}".lower())
    return re.sub(r"-+", "-", text)[:NAME_LIMIT].strip("-") or "memwall"


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label value (63 characters at most; letters, digits, '-', '_', '.' inside)."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def gpu_resources(gpus: int) -> dict[str, Any]:
    """Requests equal to limits: Kubernetes requires it of extended resources such as nvidia.com/gpu."""
    amount = {"nvidia.com/gpu": str(gpus)}
    return {"requests": dict(amount), "limits": dict(amount)}


def hf_token_env() -> list[dict[str, Any]]:
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HF_SECRET, "key": "HF_TOKEN", "optional": True}}}]


def shm_volume() -> dict[str, Any]:
    """/dev/shm in memory: NCCL and the engines' worker processes exchange tensors through it."""
    return {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}


def server_container(name: str, engine: str, model: str, args: list[str], gpus: int, port: int) -> dict[str, Any]:
    """The engine's container: the launch command's server with ``args``, listening on ``port``, ``gpus`` GPUs."""
    if engine == "vllm":
        command, words = ["vllm", "serve"], [model, "--host", "0.0.0.0", "--port", str(port), *args]
    else:
        command = ["python3", "-m", "sglang.launch_server"]
        words = ["--model-path", model, "--host", "0.0.0.0", "--port", str(port), *args]
    probe = {"httpGet": {"path": "/health", "port": port}}
    return {
        "name": name,
        "image": IMAGES[engine],
        "command": command,
        "args": words,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": hf_token_env(),
        "resources": gpu_resources(gpus),
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
        # Loading weights takes minutes: the startup probe allows 30 minutes before liveness applies.
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": 180},
        "readinessProbe": {**probe, "periodSeconds": 5},
        "livenessProbe": {**probe, "periodSeconds": 10},
    }


def deployment(name: str, labels: dict[str, str], replicas: int, containers: list[dict[str, Any]],
               init_containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An apps/v1 Deployment of ``replicas`` pods labelled ``labels``."""
    pod: dict[str, Any] = {"containers": containers, "volumes": [shm_volume()]}
    if init_containers:
        pod["initContainers"] = init_containers
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }
