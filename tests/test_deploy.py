"""--deploy k8s|llm-d|dynamo: the manifests are valid against their schemas and say what was simulated.

Kubernetes' own kinds are checked with kubernetes-validate's strict schemas (shipped in that package, offline); the
InferencePool and DynamoGraphDeployment against the schemas in tests/data/schemas (sources in its README.md), made
strict as `kubectl apply --validate=strict` is (an unknown field fails).
"""

from __future__ import annotations

import copy
import json
import shlex
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from simulator.cli import main
from simulator.errors import InputError
from simulator.plan.run import simulate_settings
from simulator.plan.settings import RunSettings
from simulator.report.deploy import check_deployable, deployment_manifests, write_deployment
from simulator.report.vllm_format import launch_command

kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

SCHEMAS = Path(__file__).parent / "data" / "schemas"
K8S_VERSION = "1.30"  # a release every managed Kubernetes still runs; its schemas ship with kubernetes-validate


def strict(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others (Kubernetes' strict field validation)."""
    schema = copy.deepcopy(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return schema


def crd_validator(name: str) -> Any:
    schema = strict(json.loads((SCHEMAS / name).read_text()))
    return jsonschema.Draft202012Validator(schema)


def k8s_validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def k8s_type_validator(file: str) -> Any:
    """A strict validator of one Kubernetes type (``container-v1.json``) from kubernetes-validate's schemas."""
    from importlib.resources import files

    from referencing import Registry, Resource

    folder = files("kubernetes_validate") / "kubernetes-json-schema" / f"v{K8S_VERSION}.0-local-strict"
    schema = json.loads((folder / file).read_text())
    definitions = json.loads((folder / "_definitions.json").read_text())
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def read_objects(path: Path) -> list[dict[str, Any]]:
    return [obj for obj in yaml.safe_load_all(path.read_text()) if obj is not None]


def launch_words(run: Any, engine: str) -> list[str]:
    """The printed launch command as the shell splits it (backslash-newline continues a line)."""
    text = "\n".join(line for line in launch_command(run, engine).splitlines() if not line.startswith("#"))
    return shlex.split(text.replace("\\\n", ""))


def small(**extra: Any) -> Any:
    return simulate_settings(RunSettings(model="llama2-7b", gpu="a100", batch=4, ctx=256, gen=4, **extra))


def test_k8s_deployment_requests_tp_times_pp_gpus_and_runs_the_launch_command(tmp_path):
    run = small(tp=2, pp=2, replicas=3)
    written, _ = write_deployment(run, "k8s", tmp_path / "k8s")
    assert [p.name for p in written] == ["deployment.yaml", "service.yaml"]
    (deployment,) = read_objects(tmp_path / "k8s" / "deployment.yaml")
    (service,) = read_objects(tmp_path / "k8s" / "service.yaml")
    for obj in (deployment, service):
        k8s_validate(obj)
    assert deployment["spec"]["replicas"] == 3
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # tp 2 x pp 2 = 4 GPUs per pod, requested and limited alike
    assert container["resources"] == {"requests": {"nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "4"}}
    words = container["command"] + container["args"]
    # The same server as --launch-command vllm for one replica, with where it listens added.
    one = small(tp=2, pp=2)
    expected = launch_words(one, "vllm")
    assert words[:3] == expected[:3] == ["vllm", "serve", "meta-llama/Llama-2-7b-hf"]
    assert words[3:7] == ["--host", "0.0.0.0", "--port", "8000"]
    assert words[7:] == expected[3:]
    assert "--pipeline-parallel-size" in words and words[words.index("--tensor-parallel-size") + 1] == "2"
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]


def test_sglang_server_takes_sglangs_flags():
    run = small(engine="sglang", tp=2)
    files, _ = deployment_manifests(run, "k8s")
    (container,) = files["deployment.yaml"][0]["spec"]["template"]["spec"]["containers"]
    k8s_validate(files["deployment.yaml"][0])
    expected = launch_words(run, "sglang")  # python -m sglang.launch_server --model-path M --tp 2 ...
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    assert container["args"][:2] == ["--model-path", "meta-llama/Llama-2-7b-hf"]
    assert container["args"][6:] == expected[5:]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}


def test_llm_d_disaggregated_pools_an_inference_pool_and_a_pd_endpoint_picker(tmp_path):
    run = small(disaggregate="1:3", tp=2)
    written, notes = write_deployment(run, "llm-d", tmp_path / "llmd")
    assert sorted(p.name for p in written) == ["endpoint-picker.yaml", "inferencepool.yaml", "modelserver.yaml"]
    prefill, decode = read_objects(tmp_path / "llmd" / "modelserver.yaml")
    (pool,) = read_objects(tmp_path / "llmd" / "inferencepool.yaml")
    picker = read_objects(tmp_path / "llmd" / "endpoint-picker.yaml")
    for obj in (prefill, decode, *picker):
        k8s_validate(obj)
    crd_validator("inferencepool-v1.json").validate(pool)
    assert (prefill["spec"]["replicas"], decode["spec"]["replicas"]) == (1, 3)  # 1:3
    for server, role in ((prefill, "prefill"), (decode, "decode")):
        labels = server["spec"]["template"]["metadata"]["labels"]
        assert labels["llm-d.ai/role"] == role
        # the pool selects every serving pod of both roles
        assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
        (engine,) = server["spec"]["template"]["spec"]["containers"]
        assert engine["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        kv_role = json.loads(engine["args"][engine["args"].index("--kv-transfer-config") + 1])["kv_role"]
        assert kv_role == {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
    # decode pods: vLLM on 8200 behind the routing sidecar on 8000, the pool's port
    (sidecar,) = decode["spec"]["template"]["spec"]["initContainers"]
    assert "--vllm-port=8200" in sidecar["args"] and pool["spec"]["targetPorts"] == [{"number": 8000}]
    config_map = next(obj for obj in picker if obj["kind"] == "ConfigMap")
    config = yaml.safe_load(config_map["data"]["epp-config.yaml"])
    assert [profile["name"] for profile in config["schedulingProfiles"]] == ["prefill", "decode"]
    service = next(obj for obj in picker if obj["kind"] == "Service")
    assert pool["spec"]["endpointPickerRef"] == {"name": service["metadata"]["name"], "port": {"number": 9002},
                                                 "failureMode": "FailClose"}
    assert "1 prefill, 3 decode" in notes[0]


def test_dynamo_graph_has_a_frontend_and_prefill_and_decode_workers(tmp_path):
    run = small(disaggregate="2:3", tp=2)
    write_deployment(run, "dynamo", tmp_path / "dyn")
    (graph,) = read_objects(tmp_path / "dyn" / "dynamographdeployment.yaml")
    crd_validator("dynamographdeployment-v1alpha1.json").validate(graph)
    container_validator, env_validator = k8s_type_validator("container-v1.json"), k8s_type_validator("envvar-v1.json")
    services = graph["spec"]["services"]
    assert set(services) == {"Frontend", "VllmPrefillWorker", "VllmDecodeWorker"}
    for service in services.values():
        container_validator.validate(service["extraPodSpec"]["mainContainer"])
        for env in service.get("envs", []):
            env_validator.validate(env)
    prefill, decode = services["VllmPrefillWorker"], services["VllmDecodeWorker"]
    assert (prefill["replicas"], decode["replicas"]) == (2, 3)  # 2:3
    assert prefill["subComponentType"] == "prefill" and decode["subComponentType"] == "decode"
    assert prefill["resources"] == {"limits": {"gpu": "2"}}
    args = prefill["extraPodSpec"]["mainContainer"]["args"]
    assert args[:2] == ["--model", "meta-llama/Llama-2-7b-hf"] and args[-1] == "--is-prefill-worker"
    assert "--kv-transfer-config" not in args  # Dynamo wires the transfer itself
    assert graph["spec"]["backendFramework"] == "vllm"


def test_colocated_llm_d_and_dynamo_are_valid_too():
    run = small(replicas=2, router="least_kv")
    files, _ = deployment_manifests(run, "llm-d")
    (server,) = files["modelserver.yaml"]
    k8s_validate(server)
    crd_validator("inferencepool-v1.json").validate(files["inferencepool.yaml"][0])
    assert server["spec"]["replicas"] == 2 and "initContainers" not in server["spec"]["template"]["spec"]
    config = yaml.safe_load(next(o for o in files["endpoint-picker.yaml"] if o["kind"] == "ConfigMap")["data"]["epp-config.yaml"])
    assert config["plugins"][0]["type"] == "kv-cache-utilization-scorer"  # the simulated least_kv router
    graph = deployment_manifests(run, "dynamo")[0]["dynamographdeployment.yaml"][0]
    crd_validator("dynamographdeployment-v1alpha1.json").validate(graph)
    assert graph["spec"]["services"]["VllmWorker"]["replicas"] == 2
    assert "subComponentType" not in graph["spec"]["services"]["VllmWorker"]


@pytest.mark.parametrize("router", typing.get_args(RunSettings.model_fields["router"].annotation))
def test_every_router_has_a_counterpart_on_llm_d_and_dynamo(router):
    # --router prefix came after the manifests and ended in KeyError: 'prefix' (the long fuzz profile found it).
    run = small(replicas=2, router=router)
    files, _ = deployment_manifests(run, "llm-d")
    config = yaml.safe_load(next(o for o in files["endpoint-picker.yaml"] if o["kind"] == "ConfigMap")["data"]["epp-config.yaml"])
    scorers = [p["type"] for p in config["plugins"] if p["type"].endswith("-scorer")]
    expected = {"round_robin": ["queue-scorer"], "least_outstanding": ["queue-scorer"],
                "least_kv": ["kv-cache-utilization-scorer"], "prefix": ["prefix-cache-scorer", "queue-scorer"]}
    assert scorers == expected[router]
    (profile,) = config["schedulingProfiles"]
    assert [r["pluginRef"] for r in profile["plugins"]] == [*expected[router], "max-score-picker"]
    graph = deployment_manifests(run, "dynamo")[0]["dynamographdeployment.yaml"][0]
    crd_validator("dynamographdeployment-v1alpha1.json").validate(graph)


def test_the_schemas_catch_a_misspelt_field():
    run = small(disaggregate="1:1")
    files, _ = deployment_manifests(run, "llm-d")
    pool = copy.deepcopy(files["inferencepool.yaml"][0])
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    with pytest.raises(jsonschema.ValidationError):
        crd_validator("inferencepool-v1.json").validate(pool)
    graph = copy.deepcopy(deployment_manifests(run, "dynamo")[0]["dynamographdeployment.yaml"][0])
    graph["spec"]["services"]["VllmDecodeWorker"]["replica"] = 1
    with pytest.raises(jsonschema.ValidationError):
        crd_validator("dynamographdeployment-v1alpha1.json").validate(graph)
    deployment = copy.deepcopy(files["modelserver.yaml"][0])
    deployment["spec"]["template"]["spec"]["containers"][0]["arg"] = ["x"]
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(deployment)


@pytest.mark.parametrize(("extra", "platform", "reason"), [
    ({"disaggregate": "1:3"}, "k8s", "plain Kubernetes has not"),
    ({"engine": "trtllm"}, "dynamo", "'trtllm' has no server to deploy"),
    ({"engine": "sglang"}, "llm-d", "written here for vLLM"),
])
def test_unsupported_combinations_are_refused_before_the_run(extra, platform, reason):
    settings = RunSettings(model="llama2-7b", gpu="a100", batch=4, ctx=256, gen=4, **extra)
    with pytest.raises(InputError, match=reason):
        check_deployable(settings, platform)


def test_a_replica_larger_than_a_node_is_refused():
    run = small(tp=8, pp=2)  # 8 x 2 = 16 GPUs, an A100 node has 8
    with pytest.raises(InputError, match="needs 16 GPUs, more than one A100-SXM4-80GB node's 8"):
        deployment_manifests(run, "k8s")


def test_cli_names_the_files_beside_the_launch_command(tmp_path):
    args = ["--model", "llama2-7b", "--gpu", "a100", "--batch", "4", "--ctx", "256", "--gen", "4", "-q"]
    result = CliRunner().invoke(main, [*args, "--launch-command", "vllm", "--deploy", "k8s", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    tail = result.output[result.output.index("vllm serve"):]
    assert f"deploy   k8s: {tmp_path / 'out' / 'deployment.yaml'}, {tmp_path / 'out' / 'service.yaml'}" in tail
    missing = CliRunner().invoke(main, [*args, "--deploy", "k8s", str(tmp_path / "no" / "such")])
    assert missing.exit_code == 2 and "does not exist" in missing.output and "Latency" not in missing.output
    refused = CliRunner().invoke(main, [*args, "--engine", "trtllm", "--deploy", "k8s", str(tmp_path / "t")])
    assert refused.exit_code == 2 and "Latency" not in refused.output and len(refused.output.strip().splitlines()) == 1


def test_a_sweep_deploys_its_best_point_of_each_objective(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("base: {model: llama2-7b, gpu: a100, ctx: 256, gen: 4}\nsweep: {grid: {batch: [1, 8]}}\n")
    result = CliRunner().invoke(main, ["sweep", str(scenario), "--workers", "1", "--out", str(tmp_path / "r.csv"),
                                       "--deploy", "k8s", str(tmp_path / "deploy")])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "deploy" / "highest-output-throughput"
    assert f"deploy   k8s: {folder / 'deployment.yaml'}, {folder / 'service.yaml'}" in result.output
    (deployment,) = read_objects(folder / "deployment.yaml")
    k8s_validate(deployment)
    # batch 8 out-produces batch 1 (8 sequences per step against 1): point 1 is the throughput winner
    assert "# best highest output throughput (point 1):" in result.output


DOC = Path(__file__).parent.parent / "docs" / "deploy.md"
DOC_COMMANDS = [
    ["--deploy", "k8s", "card-k8s"],
    ["--disaggregate", "1:3", "--deploy", "dynamo", "pd-dynamo"],
    ["--disaggregate", "1:3", "--deploy", "llm-d", "pd-llm-d"],
]


def test_the_files_shown_in_docs_deploy_are_what_the_program_writes(tmp_path, monkeypatch):
    """docs/deploy.md shows the card command's files: each `<!-- deploy-file: PATH -->` block equals the file."""
    import re

    shown = re.findall(r"<!-- deploy-file: (\S+) -->\n```yaml\n(.*?)```\n", DOC.read_text(), re.S)
    assert {path for path, _ in shown} == {"card-k8s/deployment.yaml", "card-k8s/service.yaml",
                                           "pd-dynamo/dynamographdeployment.yaml", "pd-llm-d/inferencepool.yaml"}
    monkeypatch.chdir(tmp_path)
    card = ["--model", "llama2-70b", "--gpu", "a100", "--batch", "64", "--ctx", "4096", "-q"]
    for extra in DOC_COMMANDS:
        result = CliRunner().invoke(main, [*card, *extra])
        assert result.exit_code == 0, result.output
    for path, text in shown:
        assert (tmp_path / path).read_text() == text, f"docs/deploy.md shows an old {path}: python -m docs.regenerate does not rewrite it; paste the new file"
