#!/usr/bin/env bash
# The checks a GPU machine exists for, in one run: the model crate's tests on
# GPU 0, `bench model --device cuda` against PyTorch (bf16 and f32 training
# at 16×256 and 8×1024, sampling at batch 16 and 128), then two whole RL
# steps at Qwen2.5-0.5B's shape (`bench rollout --rl-steps`), each step
# under its own time limit so one hang cannot eat the rest (~20 minutes at
# most; ONLY="tests bench-bf16-16x256" runs just the steps named). For a machine
# with a GPU, Python with torch's CUDA 13 wheels, and no Rust: it runs the
# binaries scripts/build-cuda.sh packed elsewhere.
#
#   scripts/gpu-check.sh [ARCHIVE] [OUT]
#     ARCHIVE  cuda_bins.tar.xz from scripts/build-cuda.sh
#              (default: target/cuda-bins/cuda_bins.tar.xz)
#     OUT      where the logs and JSON figures go (default: $OUT, else
#              /tmp/gpu-check); summary.txt lists every step's exit status
#
# Run it from a checkout of the commit the binaries were built from: the
# test binary reads its fixtures from the build's path
# ($CUDA_BUILD_DIR/src, default /tmp/agentrl-cuda/src), which this script
# points at the checkout when nothing is there. Only torch's
# site-packages/nvidia/cu13/lib goes on LD_LIBRARY_PATH: adding every nvidia/
# folder can pull in a second C++ runtime and crash every program.
set -uo pipefail

ARCHIVE=${1:-target/cuda-bins/cuda_bins.tar.xz}
OUT=${2:-${OUT:-/tmp/gpu-check}}
BUILD_SRC=${CUDA_BUILD_DIR:-/tmp/agentrl-cuda}/src
mkdir -p "$OUT/bin"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
  "$ARCHIVE" "$OUT/bin" || { echo "gpu-check: cannot unpack $ARCHIVE" >&2; exit 1; }
LIB=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))') ||
  { echo "gpu-check: no nvidia wheels in python3 (pip install torch)" >&2; exit 1; }
export LD_LIBRARY_PATH=$LIB
if [ ! -e "$BUILD_SRC" ]; then
  mkdir -p "$(dirname "$BUILD_SRC")"
  ln -s "$PWD" "$BUILD_SRC"
fi

# step NAME SECONDS COMMAND...: runs COMMAND with a time limit, its output
# in $OUT/NAME.log, and its exit status and wall time in the summary.
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
    return
  fi
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$SUMMARY"
}

step gpu 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
step tests 300 env AGENTRL_TEST_DEVICE=cuda "$OUT/bin/model_tests" --test-threads 1 \
  fixture:: generation:: token_loss causal_softmax norm_and_mlp \
  adamw_on_the_test_device clipping_and_adamw
A=$OUT/bin/agentrl
BENCH=(bench model --device cuda --shape qwen2.5-0.5b --python python3 --json)
step bench-bf16-16x256 240 "$A" "${BENCH[@]}" --dtype bf16
step bench-bf16-8x1024 240 "$A" "${BENCH[@]}" --dtype bf16 --batch 8 --seq-len 1024 --sample-runs 1
step bench-f32-16x256 240 "$A" "${BENCH[@]}" --dtype f32
step bench-bf16-sample128 240 "$A" "${BENCH[@]}" --dtype bf16 --batch 128 --steps 1
# Whole RL steps of the default recipe with a random model of Qwen2.5-0.5B's
# body (the tiny tokenizer's vocabulary), each phase timed.
step rl-steps-0.5b 300 "$A" bench rollout --rl-steps 2 --device cuda --json trainer.val_tasks=8 \
  model.hidden_size=896 model.num_hidden_layers=24 model.num_attention_heads=14 \
  model.num_key_value_heads=2 model.intermediate_size=4864 model.rope_theta=1000000
grep -h -E "passed|failed|test result" "$OUT/tests.log" | tail -3 >>"$SUMMARY"
cat "$SUMMARY"
