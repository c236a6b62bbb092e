#!/usr/bin/env bash
# `make train`: the README's main job. Until the full runners land it runs the smallest real 2-rank example.
set -euo pipefail
MODEL="${1:-resnet101}"; CONFIG="${2:-ds_configs/gravac_topk.json}"
if [ -f runners/train_cifar.py ] && [ -f "$CONFIG" ]; then
  exec deepspeed --num_gpus 2 runners/train_cifar.py --model "$MODEL" --deepspeed_config "$CONFIG"
fi
echo "make train: runners/train_cifar.py or $CONFIG not available yet; running the minimal 2-rank example"
exec deepspeed --num_gpus 2 runners/minimal_example.py --deepspeed_config ds_configs/minimal_topk.json --steps 60
