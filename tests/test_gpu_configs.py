"""Shipped GPU configs (capacities as the engines see them, the new GPUs) and collectives across nodes.

Every expected number below is worked out by hand from the YAML's own figures (comments show the
arithmetic), not read back from the code.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from simulator.cost.collectives import (
    all_to_all_group_seconds,
    allreduce_seconds,
    collective_network,
    collective_path,
)
from simulator.cost.kernel_tables.aiconfigurator import SYSTEMS
from simulator.cost.memory import kv_bytes_per_token, kv_bytes_per_token_per_gpu
from simulator.errors import InputError
from simulator.model import load_gpu
from simulator.model.architecture import load_model
from simulator.model.engine_profile import IDEAL
from simulator.model.gpu import GPUSpec
from simulator.model.gpu_family import family_of
from simulator.model.interconnect import load_interconnect
from simulator.model.precision import Precision

MIB = 2**20


@pytest.mark.parametrize(("alias", "mib"), [
    ("b200", 183_359), ("h100", 81_559), ("h200-sxm-141gb", 143_771), ("a100-sxm4-80gb", 81_920),
    ("a100-sxm4-40gb", 40_960), ("l40s", 46_068), ("l4", 23_034), ("a10g", 23_028), ("h20", 97_871),
    ("b300", 275_040), ("gb200", 189_471), ("gb300", 284_208), ("rtx-pro-6000", 97_887),
])
def test_hbm_is_what_nvidia_smi_reports(alias: str, mib: int) -> None:
    assert load_gpu(alias).hbm_bytes == mib * MIB


def test_mi300x_hbm_is_what_rocm_smi_reports() -> None:
    assert load_gpu("mi300x").hbm_bytes == 206_141_652_992  # rocm-smi "VRAM Total Memory (B)"


def test_b200_kv_cache_gains_from_the_capacity_fix() -> None:
    # llama3-70b fp16: 2 (K, V) x 80 layers x 8 KV heads x 128 dims x 2 bytes = 327,680 bytes per token.
    model = load_model("llama3-70b")
    precision = Precision()
    assert kv_bytes_per_token(model, precision) == 327_680
    # At TP 8 each GPU holds 1 of the 8 KV heads: 40,960 bytes per token.
    per_gpu = kv_bytes_per_token_per_gpu(model, precision, 8)
    assert per_gpu == 40_960
    # 183,359 MiB - 180e9 = 192,265,846,784 - 180,000,000,000 = 12,265,846,784 bytes more per GPU; at a
    # 0.9 memory utilisation (vLLM's default) 11,039,262,105.6 bytes more of KV, 269,513 tokens per GPU.
    gained = 0.9 * (load_gpu("b200").hbm_bytes - 180e9)
    assert gained == pytest.approx(11_039_262_105.6)
    assert int(gained // per_gpu) == 269_513


@pytest.mark.parametrize(("alias", "name", "family", "nodes"), [
    ("b300", "B300", "blackwell", 8), ("gb200", "GB200", "blackwell", 72), ("gb300", "GB300", "blackwell", 72),
    ("h20", "H20", "hopper", 8), ("rtx-pro-6000", "RTX-PRO-6000", "blackwell-rtx", 8),
    ("mi325x", "MI325X", "cdna3", 8), ("mi355x", "MI355X", "cdna4", 8),
    ("a30", "A30", "ampere", 8), ("a100-pcie", "A100-PCIe-80GB", "ampere", 8),
])
def test_new_gpus_load_by_alias(alias: str, name: str, family: str, nodes: int) -> None:
    gpu = load_gpu(alias)
    assert gpu.name == name
    assert family_of(name) == family
    assert gpu.max_gpus_per_node == nodes


def test_the_pcie_ampere_parts_have_their_data_sheets_figures() -> None:
    # A30: 165 TFLOPS FP16 dense over 933 GB/s = 176.85 FLOP/byte; 24 GiB of HBM2. A100 80GB PCIe: the SXM4
    # part's 312 TFLOPS over 1,935 GB/s = 161.24 FLOP/byte (the SXM4's 2,039 GB/s: 153.02); 80 GiB.
    a30, pcie, sxm = load_gpu("a30"), load_gpu("a100-pcie"), load_gpu("a100")
    assert a30.peak("fp16") / a30.hbm_bandwidth_bytes_per_second == pytest.approx(176.849, rel=1e-5)
    assert a30.hbm_bytes == 24 * 2**30 and a30.sm_count == 56
    assert pcie.peak("fp16") / pcie.hbm_bandwidth_bytes_per_second == pytest.approx(161.240, rel=1e-5)
    assert sxm.peak("fp16") / sxm.hbm_bandwidth_bytes_per_second == pytest.approx(153.016, rel=1e-5)
    assert pcie.hbm_bytes == 80 * 2**30 and pcie.interconnect == "pcie4" and a30.interconnect == "pcie4"
    assert "fp8" not in a30.peak_flops and "fp8" not in pcie.peak_flops


def test_every_aiconfigurator_system_is_a_shipped_gpu() -> None:
    for name in SYSTEMS:
        assert load_gpu(name).name == name


def _network(gpu: GPUSpec, gpus: int, algorithm: str = "auto"):
    return collective_network(
        gpus=gpus, link_bytes_per_second=gpu.link_bandwidth_bytes_per_second, link_efficiency=gpu.efficiency.link,
        gpus_per_node=gpu.max_gpus_per_node, interconnect=load_interconnect(gpu.interconnect), engine=IDEAL,
        algorithm=algorithm, network=load_interconnect(gpu.network) if gpu.network else None,
        network_bytes_per_second=gpu.network_bandwidth_bytes_per_second, gpu_name=gpu.name)


def test_h100_allreduce_over_two_nodes_by_hand() -> None:
    # 16 H100s = 2 nodes of 8. m = 16 MiB. NVLink: 450e9 x efficiency.link 0.75 = 337.5e9 bytes/s;
    # NIC: NDR 50e9 x 0.75 = 37.5e9. LL128 (x 0.92) is the fastest protocol in every phase here:
    #   reduce-scatter in the node: 14 us + 7 x 1.9 us + 7/8 x m / (0.92 x 337.5e9)
    #     = 27.3 us + 14,680,064 / 310.5e9 = 27.3 + 47.279 = 74.579 us (Simple: 32.2 + 43.497 = 75.70 us)
    #   all-reduce of m / 8 = 2,097,152 bytes across 2 nodes: 14 us + 2 x 4.0 us + 2,097,152 / (0.92 x 37.5e9)
    #     = 22 us + 60.787 us = 82.787 us (Simple: 36.4 + 55.924 = 92.32 us)
    #   all-gather in the node: as the reduce-scatter, 74.579 us.
    # Total 231.944 us.
    net = _network(load_gpu("h100"), 16)
    assert net.network is not None and net.node_gpus == 8
    seconds = allreduce_seconds(16 * MIB, net)
    assert seconds == pytest.approx(231.944e-6, rel=1e-4)
    # Within one node (a ring of 8, LL128): 14 us + 14 x 1.9 us + 2 x 7/8 x m / 310.5e9 = 40.6 + 94.557 = 135.157 us.
    assert allreduce_seconds(16 * MIB, _network(load_gpu("h100"), 8)) == pytest.approx(135.157e-6, rel=1e-4)


def test_h100_all_to_all_over_two_nodes_by_hand() -> None:
    # 16 GPUs, 8 per node, m = 1e6 bytes to the 15 others: 7/15 over NVLink at 337.5e9 (1.383 us) and
    # 8/15 over the NIC at 37.5e9 (14.222 us) at once; plus the network's Simple base 8.4 + hop 14 us.
    net = _network(load_gpu("h100"), 16)
    assert all_to_all_group_seconds(1e6, net) == pytest.approx((8.4 + 14.0 + 14.2222) * 1e-6, rel=1e-4)


def test_gb200_tp16_stays_on_nvlink() -> None:
    gpu = load_gpu("gb200")
    net = _network(gpu, 16)
    assert net.network is None and net.gpus == 16
    assert collective_path(gpu.interconnect, gpu.network, 16, gpu.max_gpus_per_node) == "nvlink5"
    assert collective_path(gpu.interconnect, gpu.network, 144, gpu.max_gpus_per_node) == "nvlink5 + infiniband"
    # 16 GPUs in one NVLink domain: one ring over NVLink 5 (900e9 x 0.75 = 675e9 bytes/s), 30 steps. Simple
    # for 16 MiB: 8.4 us + 30 x 3.4 us + 30/16 x 16,777,216 / 675e9 = 110.4 + 46.603 = 157.0 us; LL128:
    # 14 + 30 x 1.9 + 31,457,280 / 621e9 = 71 + 50.656 = 121.66 us, the fastest.
    assert allreduce_seconds(16 * MIB, net) == pytest.approx(121.656e-6, rel=1e-4)


def test_h100_report_path_names_the_network() -> None:
    gpu = load_gpu("h100")
    assert collective_path(gpu.interconnect, gpu.network, 8, gpu.max_gpus_per_node) == "nvlink4"
    assert collective_path(gpu.interconnect, gpu.network, 16, gpu.max_gpus_per_node) == "nvlink4 + infiniband"


def test_group_wider_than_a_node_without_a_network_is_refused() -> None:
    with pytest.raises(InputError, match=r"^a group of 16 GPUs spans 2 nodes of 8 L40S, but the GPU config names "
                                         r"no network between nodes .*at most 8$"):
        _network(load_gpu("l40s"), 16)


def test_uneven_or_custom_allreduce_across_nodes_is_refused() -> None:
    gpu = load_gpu("h100")
    with pytest.raises(InputError, match="unevenly"):
        _network(gpu, 12)
    with pytest.raises(InputError, match="--collectives one-shot"):
        _network(gpu, 16, "one-shot")


def test_network_without_bandwidth_is_a_config_error() -> None:
    data = load_gpu("h100").model_dump()
    data["network_bandwidth_bytes_per_second"] = None
    with pytest.raises(ValidationError, match="give both or neither"):
        GPUSpec.model_validate(data)
