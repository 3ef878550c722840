#!/usr/bin/env bash
# The trainer on one GPU node, as a single script: what a CPU machine cannot show.
#
#  1. benchmarks/trainer_memory.py --config full: the production draft model (model_full.yaml's
#     stage 1, T=16, 256x256, batch 1) under each of the five memory switches alone, all off and
#     all on: peak GPU memory of a training step and its step time, one fresh process each.
#  2. Every stage of the tiny config through `python -m vcloud.train` on the GPU (bf16 autocast,
#     no GradScaler), stage 1 stopped after one epoch and resumed from latest.pt on the GPU.
#  3. The refusal of a job given more GPUs than PyTorch sees (VCLOUD_GPUS_REQUIRED; exit 87).
#
# The run directory is packed into OUT/gpu_run.tar.gz so the checkpoints can be loaded and exported
# on a CPU machine (checkpoints must not depend on the device that wrote them).
#
#     benchmarks/gpu_node.sh PREPARED_TINY_DATASET OUT_DIR
set -uo pipefail
data=${1:?prepared tiny dataset}
out=${2:?output directory}
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export PYTHONPATH=$PWD/trainer/src PYTHONUNBUFFERED=1
mkdir -p "$out"
status=0

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' \
  | tee -a "$out/gpu.txt"

echo "== 1. full-config memory and step time"
python3 benchmarks/trainer_memory.py --config full --device cuda --steps 3 2>&1 | tee "$out/memory_full.txt" \
  || status=1

echo "== 2. tiny config, every stage on the GPU"
run=$(mktemp -d)/run
train() { VCLOUD_GPUS_REQUIRED=1 python3 -m vcloud.train --config trainer/configs/model_tiny.yaml \
            --data "$data" --out "$run" "$@" 2>&1 | tee -a "$out/train_tiny.log"; return "${PIPESTATUS[0]}"; }
train --stage 0 || status=1
train --stage 1 --max-epochs 1 || status=1
train --stage 1 || status=1
train --stage 2 || status=1
train --stage 3 || status=1
grep -q "precision bf16" "$out/train_tiny.log" || { echo "no stage trained in bf16"; status=1; }
tar -C "$(dirname "$run")" --exclude="latest*.pt" -czf "$out/gpu_run.tar.gz" run  # best.pt, markers, curves

echo "== 3. a job given 2 GPUs where PyTorch sees 1"
VCLOUD_GPUS_REQUIRED=2 python3 -m vcloud.train --stage 0 --config trainer/configs/model_tiny.yaml \
  --data "$data" --out "$run-refused" > "$out/refused.log" 2>&1
rc=$?
tail -3 "$out/refused.log"
if [[ $rc -ne 87 || -e $run-refused/stage0 ]]; then
  echo "expected exit 87 and nothing written, got $rc"; status=1
fi
echo "gpu_node: exit $status"
exit "$status"
