#!/usr/bin/env bash
# `make train [MODEL=...] [CONFIG=...]`: one real 2-rank job under the deepspeed launcher, sized to finish in a
# few minutes on 2 CPU cores, then the runner prints its summary (CF timeline, bytes, eval, wandb run dir).
#
# Default: ResNet101 + GraVAC exponential Top-k (ds_configs/gravac_topk.json: window 24, so the 120-step run
# walks through several candidate CFs) on synthetic CIFAR-10, micro batch 16 per rank instead of the config's 32
# (ResNet101 fwd+bwd at 16 is ~0.5 s on one core, ~1-2 s per step with Top-k and 2 ranks sharing 2 cores):
# about 4-5 minutes including start-up. MODEL=lstm runs runners/train_ptb.py (LSTM "medium", 650 wide);
# MODEL=vgg16/resnet18/tiny_cnn run runners/train_cifar.py. With the default CONFIG and a model other than
# resnet101, ds_configs/<model>_gravac_exp.json is used.
# Environment knobs: STEPS, MICRO_BATCH (empty: the config's), NPROC (2), MASTER_PORT (default: a free port),
# TRAIN_ARGS (extra runner options, e.g. "--system deepspeed --no-wandb").
set -euo pipefail
MODEL="${1:-resnet101}"
CONFIG="${2:-ds_configs/gravac_topk.json}"
DEFAULT_CONFIG="ds_configs/gravac_topk.json"

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
export WANDB_MODE="${WANDB_MODE:-offline}"
export WANDB_SILENT="${WANDB_SILENT:-true}"

RUNNER=runners/train_cifar.py
EXTRA=()
case "$MODEL" in
  resnet101) steps=120; micro=16 ;;
  vgg16)     steps=60;  micro=16 ;;
  lstm)      steps=60;  micro=""; RUNNER=runners/train_ptb.py; EXTRA=(--lstm-size medium) ;;
  *)         steps=120; micro="" ;;
esac
if [ "$CONFIG" = "$DEFAULT_CONFIG" ] && [ "$MODEL" != resnet101 ] && [ -f "ds_configs/${MODEL}_gravac_exp.json" ]; then
  CONFIG="ds_configs/${MODEL}_gravac_exp.json"
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
