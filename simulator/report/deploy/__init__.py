"""Deployment manifests for a simulated configuration: ``--deploy k8s|llm-d|dynamo DIR``.

:func:`deployment_manifests` gives the Kubernetes objects (plain dicts) each platform needs for the run's deployment,
file by file; :func:`write_deployment` writes them to a folder as YAML. The engine's container arguments are the
``--launch-command`` ones (simulator.report.vllm_format). The schemas the tests check the files against are in
tests/data/schemas/ (with their sources).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import yaml

from simulator.errors import InputError
from simulator.files import atomic_write, check_output_folder

if TYPE_CHECKING:
    from simulator.plan.engine_run import EngineRun
    from simulator.plan.settings import RunSettings

PLATFORMS = ("k8s", "llm-d", "dynamo")
APPLY = {
    "k8s": "kubectl apply -f {dir}",
    "llm-d": "kubectl apply -f {dir} (needs the Gateway API Inference Extension CRDs and a Gateway; route it to the InferencePool)",
    "dynamo": "kubectl apply -f {dir} (needs the Dynamo operator)",
}


def _builders() -> dict[str, Callable[["EngineRun"], tuple[dict[str, list[dict[str, Any]]], list[str]]]]:
    from simulator.report.deploy import dynamo, k8s, llmd

    return {"k8s": k8s.manifests, "llm-d": llmd.manifests, "dynamo": dynamo.manifests}


def deployment_manifests(run: "EngineRun", platform: str) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """({file name: [Kubernetes objects]}, notes) for ``platform``; InputError (one line) for what it cannot deploy."""
    if platform not in PLATFORMS:
        raise InputError(f"--deploy: unknown platform {platform!r}; allowed: {', '.join(PLATFORMS)}")
    return _builders()[platform](run)


class _Dumper(yaml.SafeDumper):
    """Writes a repeated value out again rather than as an anchor and alias: the files are read by people."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def check_deployable(settings: "RunSettings", platform: str) -> None:
    """Refuse, before any run, what ``platform`` cannot deploy (an engine without a server, disaggregated pools on
    plain Kubernetes); the rest is checked on the run (GPUs per node)."""
    if platform not in PLATFORMS:
        raise InputError(f"--deploy: unknown platform {platform!r}; allowed: {', '.join(PLATFORMS)}")
    from simulator.report.deploy import common, k8s, llmd

    engine = common.engine_of(settings, platform)
    if platform == "k8s" and settings.pools is not None:
        raise InputError(k8s.DISAGGREGATED)
    if platform == "llm-d" and engine != "vllm":
        raise InputError(llmd.only_vllm(engine))


def to_yaml(objects: list[dict[str, Any]], header: str) -> str:
    """Objects as one multi-document YAML text (keys in the order written), after a comment header."""
    body = "---\n".join(yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000) for obj in objects)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def write_deployment(run: "EngineRun", platform: str, folder: str | Path) -> tuple[list[Path], list[str]]:
    """Write the manifests of ``run`` for ``platform`` into ``folder`` (created; files of the same names replaced).
    Returns (the files written, notes for the report)."""
    out = check_output_folder(folder, "--deploy")
    files, notes = deployment_manifests(run, platform)
    try:
        out.mkdir(exist_ok=True)
    except OSError as exc:
        raise InputError(f"--deploy: cannot create folder '{out}' ({exc.strerror or exc})") from None
    model = run.deployment.system.model.name
    header = (f"Written by memwall (simulate --deploy {platform}) for {model} on {run.deployment.system.gpu.name}.\n"
              f"Apply: {APPLY[platform].format(dir=out)}")
    written = []
    for name, objects in files.items():
        path = out / name
        atomic_write(path, to_yaml(objects, header), "--deploy")
        written.append(path)
    return written, notes


def deployment_text(platform: str, written: list[Path], notes: list[str]) -> str:
    """The report's lines naming the files written (printed beside the launch commands)."""
    lines = [f"deploy   {platform}: {', '.join(str(path) for path in written)}"]
    lines += [f"         {note}" for note in notes]
    lines.append(f"         apply: {APPLY[platform].format(dir=written[0].parent if written else '.')}")
    return "\n".join(lines)
