"""Plain Kubernetes: a Deployment of the run's replicas (each the launch command's server, ``tp x pp`` GPUs) and a
Service in front of them. Disaggregated pools need a prefill/decode router, which plain Kubernetes lacks: they are
written for llm-d or Dynamo instead."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.errors import InputError
from simulator.report.deploy import common

if TYPE_CHECKING:
    from simulator.plan.engine_run import EngineRun

DISAGGREGATED = ("--deploy k8s: a disaggregated run needs a router that sends each request to a prefill and then a "
                 "decode worker, which plain Kubernetes has not; use --deploy llm-d or --deploy dynamo")


def manifests(run: "EngineRun") -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """({file name: [objects]}, notes) for ``--deploy k8s``."""
    if run.result.extra.get("pools") is not None:
        raise InputError(DISAGGREGATED)
    engine = common.engine_of(run.settings, "k8s")
    (worker,) = common.workers(run, engine, "k8s")
    name = common.base_name(run)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "memwall"}
    port = common.PORTS[engine]
    container = common.server_container(engine, engine, common.served(run), worker.args, worker.gpus, port)
    deployment = common.deployment(name, labels, worker.replicas, [container])
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"type": "ClusterIP", "selector": dict(labels),
                 "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]},
    }
    notes = [f"{worker.replicas} pod{'s' if worker.replicas > 1 else ''} of {worker.gpus} {worker.gpu_name} "
             f"GPU{'s' if worker.gpus > 1 else ''} ({engine}); Service {name} on port 80"]
    if worker.replicas > 1 and run.settings.router != "round_robin":
        notes.append(f"a Service spreads connections over the pods without looking at their load; the simulated "
                     f"{run.settings.router} router needs a load-aware gateway (--deploy llm-d)")
    return {"deployment.yaml": [deployment], "service.yaml": [service]}, notes
