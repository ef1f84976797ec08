"""Collective communication time by algorithm, against numbers worked out by hand."""

import numpy as np
import pytest

from simulator.cost.collectives import (
    all_gather_seconds,
    all_to_all_seconds,
    allreduce_seconds,
    collective_network,
    gather_phase_seconds,
    group_bandwidth,
    nccl_allreduce_seconds,
    one_shot_allreduce_seconds,
    point_to_point_seconds,
    reduce_scatter_seconds,
    ring_allreduce_seconds,
    tree_allreduce_seconds,
    two_shot_allreduce_seconds,
)
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import IDEAL, load_engine_profile
from simulator.model.interconnect import load_interconnect
from simulator.model.precision import Precision
from simulator.model.step import Step

MIB = 1_048_576


def test_ring_allreduce_of_one_mib_over_four_gpus():
    # steps 2 (4 - 1) = 6: 8.4 us + 6 * 3.4 us = 28.8 us; bytes 6 / 4 * 1,048,576 / 1e11 = 15.72864 us
    seconds = ring_allreduce_seconds(MIB, 4, 1e11, 8.4e-6, 3.4e-6)
    assert seconds == pytest.approx(28.8e-6 + 15.72864e-6, rel=1e-12)


def test_one_shot_reads_every_peer_and_two_shot_twice_the_ring_share():
    # one-shot, 8 GPUs, 256 KiB: 6 us + 7 * 262,144 / 1e11 = 6 + 18.35008 = 24.35008 us
    assert one_shot_allreduce_seconds(262_144, 8, 1e11, 6e-6) == pytest.approx(24.35008e-6, rel=1e-12)
    # two-shot, 8 GPUs, 1 MiB: 13 us + 2 * 7 / 8 * 1,048,576 / 1e11 = 13 + 18.35008 = 31.35008 us
    assert two_shot_allreduce_seconds(MIB, 8, 1e11, 13e-6) == pytest.approx(31.35008e-6, rel=1e-12)


def test_tree_gather_scatter_all_to_all_and_point_to_point():
    # tree, 8 GPUs: depth ceil(log2 8) = 3: 8.4 + 2 * 3 * 3.4 = 28.8 us; bytes 2 * 1 MiB / 1e11 = 20.97152 us
    assert tree_allreduce_seconds(MIB, 8, 1e11, 8.4e-6, 3.4e-6) == pytest.approx(49.77152e-6, rel=1e-12)
    # all-gather, 4 GPUs: 8.4 + 3 * 3.4 = 18.6 us; bytes 3 / 4 * 1 MiB / 1e11 = 7.86432 us
    assert all_gather_seconds(MIB, 4, 1e11, 8.4e-6, 3.4e-6) == pytest.approx(26.46432e-6, rel=1e-12)
    assert reduce_scatter_seconds(MIB, 4, 1e11, 8.4e-6, 3.4e-6) == pytest.approx(26.46432e-6, rel=1e-12)
    # all-to-all, 8 GPUs: 8.4 + 3.4 = 11.8 us; bytes 7 / 8 * 1 MiB / 1e11 = 9.17504 us
    assert all_to_all_seconds(MIB, 8, 1e11, 8.4e-6, 3.4e-6) == pytest.approx(20.97504e-6, rel=1e-12)
    # point to point: 11.8 us + 1 MiB / 1e11 = 10.48576 us
    assert point_to_point_seconds(MIB, 1e11, 8.4e-6, 3.4e-6) == pytest.approx(22.28576e-6, rel=1e-12)


def test_one_gpu_and_empty_messages_cost_nothing():
    assert ring_allreduce_seconds(MIB, 1, 1e11, 8.4e-6, 3.4e-6) == 0.0
    assert one_shot_allreduce_seconds(0.0, 8, 1e11, 6e-6) == 0.0
    got = ring_allreduce_seconds(np.array([0.0, MIB]), 4, 1e11, 8.4e-6, 3.4e-6)
    assert got[0] == 0.0 and got[1] == pytest.approx(44.52864e-6, rel=1e-12)


def _h100_network(gpus: int = 8, algorithm: str = "auto", engine=None):
    gpu = load_gpu("h100")
    return collective_network(gpus, gpu.link_bandwidth_bytes_per_second, gpu.efficiency.link, gpu.max_gpus_per_node,
                              load_interconnect(gpu.interconnect), engine or load_engine_profile("vllm"), algorithm)


def test_nccl_picks_ll_for_small_messages_and_simple_for_large_on_nvlink4():
    net = _h100_network(algorithm="nccl")
    # H100: 450e9 * 0.75 = 337.5e9 bytes/s. 8 GPUs, 14 ring steps, 2 * 7 / 8 = 1.75 of the message per GPU.
    # LL: 6.6 + 14 * 0.6 = 15.0 us; bandwidth min(0.5 * 337.5e9, 141e9 cap) = 141e9
    # LL128: 14 + 14 * 1.9 = 40.6 us at 0.92 * 337.5e9 = 310.5e9; Simple: 8.4 + 14 * 3.4 = 56.0 us at 337.5e9.
    small = 1024.0
    assert nccl_allreduce_seconds(small, net) == pytest.approx(15.0e-6 + 1.75 * 1024 / 141e9, rel=1e-12)
    large = 64.0 * MIB
    ll = 15.0e-6 + 1.75 * large / 141e9  # 847.9 us
    ll128 = 40.6e-6 + 1.75 * large / 310.5e9  # 418.8 us
    simple = 56.0e-6 + 1.75 * large / 337.5e9  # 404.0 us
    assert simple < ll128 < ll
    assert nccl_allreduce_seconds(large, net) == pytest.approx(simple, rel=1e-12)


def test_attention_dps_gather_is_ncclls_ring_all_gather_at_its_fastest_protocol():
    net = _h100_network(algorithm="auto")  # the engine's custom all-reduce does not gather: NCCL's ring does
    # 8 GPUs, 7 ring steps, 7 / 8 of the gathered message through each GPU's link.
    # 64 MiB, Simple: 8.4 + 7 x 3.4 = 32.2 us, plus 7 / 8 x 67,108,864 / 337.5e9 = 174.0 us: 206.2 us; LL128:
    # 14 + 7 x 1.9 = 27.3 us + 189.1 us = 216.4 us; LL: 6.6 + 7 x 0.6 = 10.8 us + 416.5 us = 427.3 us.
    large = 64.0 * MIB
    simple = 32.2e-6 + 7 / 8 * large / 337.5e9
    assert simple == pytest.approx(206.2e-6, rel=1e-3)
    assert gather_phase_seconds(large, net) == pytest.approx(simple, rel=1e-12)
    # 1 KiB: LL, 10.8 us + 7 / 8 x 1,024 / 141e9.
    assert gather_phase_seconds(1024.0, net) == pytest.approx(10.8e-6 + 7 / 8 * 1024 / 141e9, rel=1e-12)
    assert gather_phase_seconds(0.0, net) == 0.0 and gather_phase_seconds(large, _h100_network(1)) == 0.0


def test_auto_follows_vllms_custom_allreduce_thresholds():
    bandwidth = 337.5e9
    eight = _h100_network(8)
    # 128 KiB < 256 KiB on 8 GPUs: one-shot, 6 us + 7 * 131,072 / 337.5e9
    assert allreduce_seconds(131_072, eight) == pytest.approx(6e-6 + 7 * 131_072 / bandwidth, rel=1e-12)
    # 512 KiB on 8 GPUs: two-shot, 13 us + 1.75 * 524,288 / 337.5e9
    assert allreduce_seconds(524_288, eight) == pytest.approx(13e-6 + 1.75 * 524_288 / bandwidth, rel=1e-12)
    # 16 MiB is over vLLM's 8 MiB buffer: NCCL
    assert allreduce_seconds(16 * MIB, eight) == pytest.approx(nccl_allreduce_seconds(16 * MIB, eight), rel=1e-12)
    four = _h100_network(4)
    # 384 KiB < 512 KiB on 4 GPUs: one-shot, 6 us + 3 * 393,216 / 337.5e9
    assert allreduce_seconds(393_216, four) == pytest.approx(6e-6 + 3 * 393_216 / bandwidth, rel=1e-12)
    sizes = np.array([131_072.0, 524_288.0])
    assert allreduce_seconds(sizes, eight) == pytest.approx(
        [allreduce_seconds(131_072.0, eight), allreduce_seconds(524_288.0, eight)], rel=1e-12)


def test_no_custom_allreduce_over_pcie_or_for_an_nccl_engine():
    gpu = load_gpu("l40s")
    pcie = collective_network(4, gpu.link_bandwidth_bytes_per_second, gpu.efficiency.link, gpu.max_gpus_per_node,
                              load_interconnect(gpu.interconnect), load_engine_profile("vllm"))
    assert not pcie.custom
    # PCIe has no LL128: LL 6.6 + 6 * 1.0 = 12.6 us at 0.5 * 32e9 * 0.75 = 12e9; Simple 8.4 + 6 * 5.7 = 42.6 us at 24e9
    m = 65_536.0
    assert allreduce_seconds(m, pcie) == pytest.approx(min(12.6e-6 + 1.5 * m / 12e9, 42.6e-6 + 1.5 * m / 24e9), rel=1e-12)
    assert not _h100_network(8, engine=IDEAL).custom


def test_a_mesh_group_uses_only_its_share_of_the_links():
    # MI300X: 448e9 * 0.75 = 336e9 over 7 links; 2 GPUs use one of them: 48e9; 8 GPUs all seven.
    assert group_bandwidth(448e9, 0.75, "mesh", 2, 8) == pytest.approx(48e9, rel=1e-12)
    assert group_bandwidth(448e9, 0.75, "mesh", 8, 8) == pytest.approx(336e9, rel=1e-12)
    assert group_bandwidth(450e9, 0.75, "switch", 2, 8) == pytest.approx(337.5e9, rel=1e-12)


def test_off_is_free_and_a_fixed_latency_replaces_the_algorithms():
    assert allreduce_seconds(MIB, _h100_network(8, "off")) == 0.0
    gpu = load_gpu("h100")
    net = collective_network(4, gpu.link_bandwidth_bytes_per_second, 0.5, 8, load_interconnect("nvlink4"), IDEAL,
                             "ring", latency_override_seconds=10e-6)
    # 10 us + 6 / 4 * 1 MiB / (450e9 * 0.5) = 10 + 6.990507 us
    assert allreduce_seconds(MIB, net) == pytest.approx(10e-6 + 1.5 * MIB / 225e9, rel=1e-12)


def test_unknown_algorithm_is_one_line():
    with pytest.raises(InputError, match="--collectives: unknown 'butterfly'"):
        _h100_network(8, "butterfly")


def test_the_allreduce_operator_is_costed_by_the_collective_model():
    # llama2-70b decode at batch 32 on 4x H100: each all-reduce moves 32 * 8192 * 2 = 524,288 bytes (512 KiB),
    # not below vLLM's 512 KiB one-shot limit for 4 GPUs: two-shot, 13 us + 1.5 * 524,288 / 337.5e9 = 15.33 us.
    system = System(load_model("llama2-70b"), load_gpu("h100"), Precision(), tp=4,
                    engine=load_engine_profile("vllm"), collectives="auto")
    cost = next(c for c in system.step_cost(Step.decode(32, 1024)).operators if c.name == "mlp_allreduce")
    per_layer = 13e-6 + 1.5 * 524_288 / 337.5e9
    assert cost.link_bytes == 80 * 524_288
    assert cost.seconds == pytest.approx(80 * per_layer, rel=1e-12)
    free = System(load_model("llama2-70b"), load_gpu("h100"), Precision(), tp=4, collectives="off")
    assert free.step_cost(Step.decode(32, 1024)).communication_seconds == 0.0


def test_every_shipped_gpu_names_a_shipped_interconnect():
    from simulator.model.gpu import list_gpus

    for gpu in list_gpus():
        assert load_interconnect(gpu.interconnect).nccl, gpu.name
