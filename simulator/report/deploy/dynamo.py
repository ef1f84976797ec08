"""NVIDIA Dynamo: one DynamoGraphDeployment (``nvidia.com/v1alpha1``) holding the Frontend (the OpenAI-compatible
HTTP server and router) and the workers: a prefill and a decode worker service for disaggregated pools, one worker
service otherwise, each with its replicas, GPUs and the engine's flags.

The layout follows Dynamo's own examples (examples/backends/vllm/deploy/disagg.yaml and agg.yaml in
github.com/ai-dynamo/dynamo): workers run ``python3 -m dynamo.vllm`` (or ``dynamo.sglang``), which take the engine's
own flags; a prefill worker is told ``--is-prefill-worker`` (SGLang: ``--disaggregation-mode prefill``) and Dynamo
wires the KV transfer itself, so the launch command's NIXL flags are left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.report.deploy import common

if TYPE_CHECKING:
    from simulator.plan.engine_run import EngineRun

RELEASE = "0.9.0"
IMAGES = {"vllm": f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{RELEASE}", "sglang": f"nvcr.io/nvidia/ai-dynamo/sglang-runtime:{RELEASE}"}
# The simulated router's policy as the Frontend's router mode (DYN_ROUTER_MODE): Dynamo's KV router places by
# cached blocks and load (as --router prefix does); round_robin is its own mode; least_outstanding has no match
# and gets the KV router.
ROUTER_MODES = {"round_robin": "round-robin", "least_outstanding": "kv", "least_kv": "kv", "prefix": "kv"}
SERVICE_NAMES = {"vllm": {"server": "VllmWorker", "prefill": "VllmPrefillWorker", "decode": "VllmDecodeWorker"},
                 "sglang": {"server": "SGLangWorker", "prefill": "SGLangPrefillWorker", "decode": "SGLangDecodeWorker"}}


def _worker_args(engine: str, model: str, worker: common.Worker) -> list[str]:
    if engine == "vllm":
        role = {"prefill": ["--is-prefill-worker"], "decode": ["--is-decode-worker"]}.get(worker.role, [])
        return ["--model", model, *worker.args, *role]
    role = [] if worker.role == "server" else ["--disaggregation-mode", worker.role, "--disaggregation-transfer-backend", "nixl"]
    return ["--model-path", model, *worker.args, *role]


def manifests(run: "EngineRun") -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """({file name: [objects]}, notes) for ``--deploy dynamo``."""
    engine = common.engine_of(run.settings, "dynamo")
    model = common.served(run)
    name = common.base_name(run)
    mode = ROUTER_MODES[run.settings.router]
    services: dict[str, Any] = {
        "Frontend": {
            "componentType": "frontend",
            "replicas": 1,
            "envs": [{"name": "DYN_ROUTER_MODE", "value": mode}],
            "extraPodSpec": {"mainContainer": {"name": "main", "image": IMAGES[engine]}},
        }
    }
    described = []
    for worker in common.workers(run, engine, "dynamo", kv_transfer=False):
        service: dict[str, Any] = {
            "envFromSecret": common.HF_SECRET,
            "componentType": "worker",
            "replicas": worker.replicas,
            "resources": {"limits": {"gpu": str(worker.gpus)}},
            "extraPodSpec": {"mainContainer": {
                "name": "main",  # the operator's name for it; a Kubernetes Container needs one
                "image": IMAGES[engine],
                "workingDir": f"/workspace/examples/backends/{engine}",
                "command": ["python3", "-m", f"dynamo.{engine}"],
                "args": _worker_args(engine, model, worker),
            }},
        }
        if worker.role != "server":
            service["subComponentType"] = worker.role
        services[SERVICE_NAMES[engine][worker.role]] = service
        described.append(f"{worker.replicas} {SERVICE_NAMES[engine][worker.role]} x {worker.gpus} GPU{'s' if worker.gpus > 1 else ''}")
    graph = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": name},
        "spec": {"backendFramework": engine, "services": services},
    }
    notes = [f"Dynamo: Frontend (router mode {mode}) and {', '.join(described)}; needs the Dynamo operator "
             f"(its CRDs) and a Secret {common.HF_SECRET} for gated checkpoints"]
    return {"dynamographdeployment.yaml": [graph]}, notes
