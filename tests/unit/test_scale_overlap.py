"""The scale model's overlap with backward: readiness from FLOPs, and the one-core / one-link schedule."""
from __future__ import annotations

import pytest
import torch

from ds_gravac_bench.scale_laws import Collectives
from ds_gravac_bench.scale_model import Kernels, predict_step
from ds_gravac_bench.scale_overlap import backward_profile
from ds_gravac_bench.scale_workload import workloads

ALPHA, BETA = 2e-4, 8.5e-8


def test_readiness_and_share_of_a_two_layer_net_by_hand() -> None:
    """Linear(4→8), ReLU, Linear(8→3), batch 2. Forward: 2·2·4·8 = 128 and 2·2·8·3 = 96 FLOPs. Backward runs the
    last layer first: its weight and input gradients, 2 × 96 = 192; then the first layer's weight gradient only
    (its input needs none), 128. So the last layer is ready at 192/320, the first at 1, and backward is
    320/(320 + 224) of the step's FLOPs."""
    with torch.device("meta"):
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        prof = backward_profile(net, torch.empty(2, 4))
    assert prof.ready == {"0.weight": 1.0, "0.bias": 1.0, "2.weight": pytest.approx(0.6), "2.bias": pytest.approx(0.6)}
    assert prof.share == pytest.approx(320 / 544)


def coll_two_ranks() -> Collectives:
    sizes = (2**18, 2**21, 2**23)                     # ring all-reduce at N = 2: 2α + β·x
    return Collectives.from_probes({2: {"all_reduce": [(x, 2 * ALPHA + BETA * x) for x in sizes],
                                        "all_gather": [(x, ALPHA + BETA * x) for x in sizes],
                                        "all_to_all": [(x, ALPHA + BETA * x / 2) for x in sizes]}})


def dense(ready: float) -> dict:
    return {"exchange": "dense", "numel": 10**6, "words1": 10**6, "words2": 0, "calls": 1, "ready": ready}


def test_schedule_against_a_hand_timeline() -> None:
    """Two dense buckets of 10⁶ values: stage 0.01 s and write-back 0.02 s each, all-reduce 2α + 4·10⁶β = 0.3404 s
    each; compute 1 s of which backward 0.5 s. Bucket A is ready at 20% of backward: staged by 0.1 + 0.01, sent
    0.11 → 0.4504. B is ready at the end: staged by 0.5 + 0.02, sent 0.52 → 0.8604. Exposed: 0.8604 − 0.52 =
    0.3404; step 1 + 0.06 + 0.3404."""
    k = Kernels(compute_s=1.0, backward_share=0.5, stage=1e-8, writeback=2e-8)
    link = 2 * ALPHA + BETA * 4e6
    got = predict_step(k, [dense(1.0), dense(0.2)], coll_two_ranks(), 2)      # any order: sorted by readiness
    assert got["comm_total"] == pytest.approx(2 * link, rel=1e-4)
    assert got["comm"] == pytest.approx(0.8604 - 0.52, rel=1e-4)
    assert got["codec"] == pytest.approx(0.06, rel=1e-6)
    assert got["step"] == pytest.approx(1.0 + 0.06 + 0.3404, rel=1e-4)
    # B ready at half of backward: the link, not backward, is the bottleneck (0.4504 → 0.7908; exposed 0.2708)
    mid = predict_step(k, [dense(0.2), dense(0.5)], coll_two_ranks(), 2)
    assert mid["comm"] == pytest.approx(0.4504 + link - 0.52, rel=1e-4)
    # everything ready before backward ends and a long backward: nothing is exposed
    long = predict_step(Kernels(compute_s=10.0, backward_share=0.5, stage=1e-8, writeback=2e-8),
                        [dense(0.1), dense(0.2)], coll_two_ranks(), 2)
    assert long["comm"] == 0.0 and long["step"] == pytest.approx(10.06)


def test_without_a_profile_nothing_overlaps() -> None:
    k = Kernels(compute_s=1.0, stage=1e-8, writeback=2e-8)
    got = predict_step(k, [dense(0.2), dense(1.0)], coll_two_ranks(), 2)
    assert got["comm"] == got["comm_total"] == pytest.approx(2 * (2 * ALPHA + BETA * 4e6), rel=1e-4)


def test_workload_buckets_carry_readiness() -> None:
    """ResNet-18: DeepSpeed all-reduces after backward (1.0); the synchronizer's first bucket (the last layers)
    is ready early, the one holding the stem at the end."""
    w = workloads("resnet18", {"ds_dense": None, "gv_topk_100": {"mode": "static", "compressor": "topk", "cf": 100}}, [2])
    assert [b["ready"] for b in w["ds_dense"]["2"]] == [1.0]
    ready = [b["ready"] for b in w["gv_topk_100"]["2"]]
    assert ready[0] < 0.5 and max(ready) == 1.0 and ready == sorted(ready)
