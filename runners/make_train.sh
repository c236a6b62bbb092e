#!/usr/bin/env bash
# `make train [MODEL=...] [CONFIG=...]`: one real 2-rank job under the deepspeed launcher, sized to finish in a
# few minutes on 2 CPU cores, then the runner prints its summary (CF timeline, bytes, eval, the loss next to the
# dense run's when one exists, wandb run dir).
#
# Default: ResNet101 with ds_configs/default.json (`"gravac": {}`, ds_gravac's defaults (mode auto), with ResNet101's
# hyper-parameters) on synthetic CIFAR-10, micro batch 16 per rank instead of the config's 32 (ResNet101 fwd+bwd at
# 16 is ~0.5 s on one core): about 3-4 minutes including start-up. With the default CONFIG and another MODEL that
# has a ds_configs/<model>_dense.json, the defaults run with that model's hyper-parameters: its dense config with
# default.json's "gravac" section, written to runs/make-train/<model>/default.json (VGG16-bn: 80 steps; the LSTM:
# runners/train_ptb.py, "medium" 650 wide, 60 steps; the MLP). MODEL=resnet18/tiny_cnn run runners/train_cifar.py
# with default.json as it is. Per-model faster settings: CONFIG=ds_configs/<model>_recommended.json.
# Environment knobs: STEPS, MICRO_BATCH (empty: the config's), NPROC (2), MASTER_PORT (default: a free port),
# TRAIN_ARGS (extra runner options, e.g. "--system deepspeed --no-wandb").
set -euo pipefail
MODEL="${1:-resnet101}"
DEFAULT_CONFIG="ds_configs/default.json"
CONFIG="${2:-$DEFAULT_CONFIG}"

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
export WANDB_MODE="${WANDB_MODE:-offline}"
export WANDB_SILENT="${WANDB_SILENT:-true}"

RUNNER=runners/train_cifar.py
EXTRA=()
case "$MODEL" in
  resnet101) steps=120; micro=16 ;;
  vgg16)     steps=80;  micro=16 ;;
  lstm)      steps=60;  micro=""; RUNNER=runners/train_ptb.py; EXTRA=(--lstm-size medium) ;;
  *)         steps=120; micro="" ;;
esac
if [ "$CONFIG" = "$DEFAULT_CONFIG" ] && [ "$MODEL" != resnet101 ] && [ -f "ds_configs/${MODEL}_dense.json" ]; then
  CONFIG="runs/make-train/$MODEL/default.json"
  mkdir -p "runs/make-train/$MODEL"
  python - "ds_configs/${MODEL}_dense.json" "$DEFAULT_CONFIG" "$CONFIG" <<'EOF'
import json, sys
dense, defaults, out = sys.argv[1:]
with open(dense, encoding="utf-8") as f:
    cfg = json.load(f)
with open(defaults, encoding="utf-8") as f:
    cfg["gravac"] = json.load(f)["gravac"]
with open(out, "w", encoding="utf-8") as f:
    json.dump(cfg, f, indent=2)
EOF
fi
STEPS="${STEPS:-$steps}"
MICRO_BATCH="${MICRO_BATCH-$micro}"
[ -n "$MICRO_BATCH" ] && EXTRA+=(--micro-batch "$MICRO_BATCH")
PORT="${MASTER_PORT:-$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"

# Every make-train run of a config logs to runs/make-train/<model>/<config>; the summary compares the loss with the
# dense run of the same model when one exists there (make train MODEL=... CONFIG=ds_configs/<model>_dense.json).
LOG_DIR="runs/make-train/$MODEL/$(basename "$CONFIG" .json)"
REFERENCE="runs/make-train/$MODEL/${MODEL}_dense/steps.jsonl"

echo "make train: $RUNNER --model $MODEL --deepspeed_config $CONFIG --steps $STEPS ${EXTRA[*]} ${TRAIN_ARGS:-}"
# shellcheck disable=SC2086  # TRAIN_ARGS is a list of options on purpose
deepspeed --master_port "$PORT" --num_gpus "${NPROC:-2}" "$RUNNER" --model "$MODEL" \
  --deepspeed_config "$CONFIG" --steps "$STEPS" --eval-every 40 --eval-batches 10 --log-dir "$LOG_DIR" \
  --compare-to "$REFERENCE" "${EXTRA[@]}" ${TRAIN_ARGS:-}
if [ ! -f "$REFERENCE" ]; then
  echo "(for a dense reference in this summary: make train MODEL=$MODEL CONFIG=ds_configs/${MODEL}_dense.json)"
fi
