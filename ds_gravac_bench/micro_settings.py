"""Fixed settings of the compressor micro-benchmark, in one place so the row builders, the memory rows, the
quantizer rows and the report agree on the same gradient sets, world sizes, phases and targets."""
from __future__ import annotations

SETS = ("resnet101", "vgg16", "lstm")
MODEL_ARGS = {"resnet101": ("resnet101", {"num_classes": 10}), "vgg16": ("vgg16", {"num_classes": 100}),
              "lstm": ("lstm", {"vocab_size": 10000, "size": "large"})}
COMPUTE_REF_S = {"resnet101": 1.3, "vgg16": 2.1, "lstm": None}   # reference fwd+bwd s, batch 32, one core
TOPK_ALGORITHMS = ("auto", "topk", "kthvalue", "sort")
SMOKE_SHAPES = [(250, 240), (20000,), (64, 3, 7, 7), (1000,), (9592,)]   # 10^5 elements
SMOKE_BUCKET_CAP_MB = 0.1            # several buckets even in the smoke set
OPTIMIZER = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}           # the ResNet/VGG configs' SGD
DECODE_NS = (2, 4)                   # world sizes whose decode is timed
MEMORY_NS = (2, 8)                   # world sizes whose extra memory is reported
SEARCH_SEND, SEARCH_PROBES = 10.0, (10.0, 20.0, 40.0, 160.0, 1000.0)   # a 5-level GraVAC search step
TARGET_EXTRA_X = 2.0                 # Top-k with error feedback: at most two extra fp32 copies of the gradients
STEP_KEYS = ("t_stage", "t_norm", "t_compress", "t_leave_memory", "t_commit_memory", "t_round2", "t_aggregate",
             "t_residual")
PHASES = ("t_stage", "t_norm", "t_compress", "t_round2", "t_decompress_n2", "t_decompress_n4", "t_residual")
LOWRANK_RANKS = (1, 2, 4)
