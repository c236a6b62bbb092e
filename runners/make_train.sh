#!/usr/bin/env bash
# `make train [MODEL=...] [CONFIG=...]`: one real 2-rank job under the deepspeed launcher, sized to finish in a
# few minutes on 2 CPU cores, then the runner prints its summary (CF timeline, bytes, eval, the loss next to the
# dense run's when one exists, wandb run dir).
#
# Default: ResNet101 with ds_configs/resnet101_recommended.json (static PowerSGD rank 16: the configuration that
# reached DeepSpeed dense's loss soonest in docs/BENCHMARKS.md) on synthetic CIFAR-10, micro batch 16 per rank
# instead of the config's 32 (ResNet101 fwd+bwd at 16 is ~0.5 s on one core): about 3-4 minutes including
# start-up. With the default CONFIG and another MODEL, ds_configs/<model>_recommended.json is used (VGG16-bn,
# PowerSGD rank 64: 80 steps; the LSTM: runners/train_ptb.py, "medium" 650 wide, 60 steps).
# MODEL=resnet18/tiny_cnn/mlp run runners/train_cifar.py with the ResNet101 config.
# Environment knobs: STEPS, MICRO_BATCH (empty: the config's), NPROC (2), MASTER_PORT (default: a free port),
# TRAIN_ARGS (extra runner options, e.g. "--system deepspeed --no-wandb").
set -euo pipefail
MODEL="${1:-resnet101}"
CONFIG="${2:-ds_configs/resnet101_recommended.json}"
DEFAULT_CONFIG="ds_configs/resnet101_recommended.json"

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
if [ "$CONFIG" = "$DEFAULT_CONFIG" ] && [ "$MODEL" != resnet101 ] && [ -f "ds_configs/${MODEL}_recommended.json" ]; then
  CONFIG="ds_configs/${MODEL}_recommended.json"
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
