#!/usr/bin/env bash
# The pretraining step's speed on an accelerator: BERT-base in bf16 at 128 and 512 tokens, XLA's
# attention (with attention dropout: spelled out) against cuDNN's fused attention (without), scanned against unrolled layers, and transformers'
# BertForPreTraining (bf16 autocast, same GPU, same batch) timed alternately in the same process.
#   bash benchmarks/accelerator_speed.sh OUT_DIR [PYTHON]
# Each run writes OUT_DIR/NAME.json and OUT_DIR/NAME.log; a run that fails is reported and the
# rest go on. PRESET, BATCH128, BATCH512, STEPS and RUN_TIMEOUT override the sizes (PRESET=tiny
# with small batches runs it on a CPU in minutes, where the cuDNN runs are refused in one line).
set -uo pipefail
out=${1:?usage: accelerator_speed.sh OUT_DIR [PYTHON]}
python=${2:-python3}
preset=${PRESET:-base} b128=${BATCH128:-256} b512=${BATCH512:-32} steps=${STEPS:-10}
mkdir -p "$out"
# Both frameworks share the GPU in one process: JAX takes 60% of its memory, not 75%.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.6}

bench() {
  local name=$1; shift
  timeout "${RUN_TIMEOUT:-240}" "$python" -m bertjax.bench --config=configs/base.py \
    --config.model.preset="$preset" --config.model.dtype=bfloat16 --steps "$steps" --warmup 3 \
    --json "$out/$name.json" "$@" >"$out/$name.log" 2>&1
  echo "== $name: exit $?"; tail -n 14 "$out/$name.log"
}

bench b128_scanned_xla_torch --seq-len 128 --batch "$b128" --compare-torch --torch-bf16
bench b128_scanned_cudnn --seq-len 128 --batch "$b128" --config.model.attention_implementation=cudnn \
  --config.model.attention_dropout=0.0
bench b128_unrolled_xla --seq-len 128 --batch "$b128" --config.model.scan_layers=false
bench b128_unrolled_cudnn --seq-len 128 --batch "$b128" --config.model.scan_layers=false \
  --config.model.attention_implementation=cudnn --config.model.attention_dropout=0.0
bench b2x128_unrolled_cudnn --seq-len 128 --batch $((2 * b128)) --config.model.scan_layers=false \
  --config.model.attention_implementation=cudnn --config.model.attention_dropout=0.0
bench b512_unrolled_xla --seq-len 512 --batch "$b512" --predictions 80 \
  --config.model.scan_layers=false
bench b512_unrolled_cudnn_torch --seq-len 512 --batch "$b512" --predictions 80 \
  --config.model.scan_layers=false --config.model.attention_implementation=cudnn \
  --config.model.attention_dropout=0.0 --compare-torch --torch-bf16
