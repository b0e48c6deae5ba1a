#!/usr/bin/env bash
# The checks a GPU machine exists for, in one run: the model crate's tests on
# GPU 0, `bench model --device cuda` against PyTorch (bf16 and f32 training
# at 16×256 and 8×1024, flash attention against the materialised scores at
# both, sampling at batch 16 and 128), a per-kernel profile
# of both sides' bf16 training step and sampling (bench/kernel-profile),
# then two whole RL steps at Qwen2.5-0.5B's shape (`bench rollout
# --rl-steps`) in f32 and under bf16 autocast, the rollout phase with and
# without the KV cache kept between turns, and a profile of one RL step,
# each step under its own time limit so one hang cannot eat the rest (the
# limits add up to 51.5 minutes; ONLY="tests
# bench-bf16-16x256" runs just the steps named). For a machine with a GPU,
# Python with torch's CUDA 13 wheels, and no Rust: it runs the binaries
# scripts/build-cuda.sh packed elsewhere.
#
#   scripts/gpu-check.sh [ARCHIVE] [OUT]
#     ARCHIVE  cuda_bins.tar.xz from scripts/build-cuda.sh
#              (default: target/cuda-bins/cuda_bins.tar.xz)
#     OUT      where the results go (default: $OUT, else /tmp/gpu-check):
#              summary.txt (every step's exit status and wall time) and
#              logs.tar.gz (every step's log and the profiles), repacked
#              after each step so a run cut short still returns what it did
#
# The binaries and logs are unpacked and written under $GPU_CHECK_WORK
# (default /tmp/gpu-check-work). Run it from a checkout of the commit the
# binaries were built from: the test binary reads its fixtures from the
# build's path ($CUDA_BUILD_DIR/src, default /tmp/agentrl-cuda/src), which
# this script points at the checkout when nothing is there. Only torch's
# site-packages/nvidia/cu13/lib goes on LD_LIBRARY_PATH: adding every
# nvidia/ folder can pull in a second C++ runtime and crash every program.
set -uo pipefail

ARCHIVE=${1:-target/cuda-bins/cuda_bins.tar.xz}
OUT=${2:-${OUT:-/tmp/gpu-check}}
WORK=${GPU_CHECK_WORK:-/tmp/gpu-check-work}
BUILD_SRC=${CUDA_BUILD_DIR:-/tmp/agentrl-cuda}/src
BIN=$WORK/bin
LOGS=$WORK/logs
mkdir -p "$OUT" "$BIN" "$LOGS"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
  "$ARCHIVE" "$BIN" || { echo "gpu-check: cannot unpack $ARCHIVE" >&2; exit 1; }
LIB=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))') ||
  { echo "gpu-check: no nvidia wheels in python3 (pip install torch)" >&2; exit 1; }
export LD_LIBRARY_PATH=$LIB
if [ ! -e "$BUILD_SRC" ]; then
  mkdir -p "$(dirname "$BUILD_SRC")"
  ln -s "$PWD" "$BUILD_SRC"
fi

# step NAME SECONDS COMMAND...: runs COMMAND with a time limit, its output
# in $LOGS/NAME.log, its exit status and wall time in the summary, and
# repacks the logs into $OUT/logs.tar.gz.
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
    return
  fi
  local start=$SECONDS
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$SUMMARY"
  tar czf "$OUT/logs.tar.gz" -C "$WORK" logs
}

step gpu 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
step tests 300 env AGENTRL_TEST_DEVICE=cuda "$BIN/model_tests" --test-threads 1 \
  fixture:: generation:: cache_reuse:: token_loss causal_softmax norm_and_mlp flash_attention:: precision:: \
  adamw_on_the_test_device clipping_and_adamw
A=$BIN/agentrl
BENCH=(bench model --device cuda --shape qwen2.5-0.5b --python python3 --json)
step bench-bf16-16x256 240 "$A" "${BENCH[@]}" --dtype bf16
step bench-bf16-8x1024 240 "$A" "${BENCH[@]}" --dtype bf16 --batch 8 --seq-len 1024 --sample-runs 1
# The same two bf16 shapes with attention materialised instead of the flash
# kernels (agentrl alone): the op's gain, within one run.
OURS=(bench model --device cuda --shape qwen2.5-0.5b --no-torch --json --dtype bf16)
step bench-bf16-16x256-materialized 180 "$A" "${OURS[@]}" --attention materialized --sample-runs 1
step bench-bf16-8x1024-materialized 180 "$A" "${OURS[@]}" --attention materialized \
  --batch 8 --seq-len 1024 --sample-runs 1
step bench-f32-16x256 240 "$A" "${BENCH[@]}" --dtype f32
step bench-bf16-sample128 240 "$A" "${BENCH[@]}" --dtype bf16 --batch 128 --steps 1
# Where each side's GPU time goes: both processes of a bf16 16×256 bench
# under the CUPTI profiler, one report each (profile-PID.txt, naming its
# program). Range 1 is the timed training steps, range 2 the sampling run.
mkdir -p "$LOGS/profile-bf16-16x256"
step profile-bf16-16x256 300 env CUDA_INJECTION64_PATH="$BIN/libkernel_profile.so" \
  KERNEL_PROFILE_OUT="$LOGS/profile-bf16-16x256" KERNEL_PROFILE_TOP=25 \
  "$A" "${BENCH[@]}" --dtype bf16 --steps 2 --sample-runs 1
# Whole RL steps of the default recipe with a random model of Qwen2.5-0.5B's
# body (the tiny tokenizer's vocabulary), each phase timed.
step rl-steps-0.5b 300 "$A" bench rollout --rl-steps 2 --device cuda --json trainer.val_tasks=8 \
  model.hidden_size=896 model.num_hidden_layers=24 model.num_attention_heads=14 \
  model.num_key_value_heads=2 model.intermediate_size=4864 model.rope_theta=1000000
# The same steps under bf16 autocast (f32 weights and moments, bf16 compute).
step rl-steps-0.5b-bf16 300 "$A" bench rollout --rl-steps 2 --device cuda --json trainer.val_tasks=8 \
  model.precision=bf16 model.hidden_size=896 model.num_hidden_layers=24 \
  model.num_attention_heads=14 model.num_key_value_heads=2 model.intermediate_size=4864 \
  model.rope_theta=1000000
# The rollout phase at that shape with each dialogue's KV cache kept on the
# device between turns, against every turn re-encoded (the same seeds; it
# says whether both played the same tokens).
step rollout-reuse-0.5b 240 "$A" bench rollout --device cuda --json --repeats 1 \
  model.precision=bf16 model.hidden_size=896 model.num_hidden_layers=24 \
  model.num_attention_heads=14 model.num_key_value_heads=2 model.intermediate_size=4864 \
  model.rope_theta=1000000
# Where a whole RL step's GPU time goes at that shape: one step, profiled
# (range 1: rollout, scoring and update together).
mkdir -p "$LOGS/profile-rl-step-0.5b"
step profile-rl-step-0.5b 300 env CUDA_INJECTION64_PATH="$BIN/libkernel_profile.so" \
  KERNEL_PROFILE_OUT="$LOGS/profile-rl-step-0.5b" KERNEL_PROFILE_TOP=25 \
  "$A" bench rollout --rl-steps 1 --device cuda --json trainer.val_tasks=8 \
  model.hidden_size=896 model.num_hidden_layers=24 model.num_attention_heads=14 \
  model.num_key_value_heads=2 model.intermediate_size=4864 model.rope_theta=1000000
[ -f "$LOGS/tests.log" ] && grep -h -E "passed|failed|test result" "$LOGS/tests.log" | tail -3 >>"$SUMMARY"
# The figures, in the output too: the start of each profile and the JSON lines.
for f in "$LOGS"/profile-*/profile-*.txt; do
  [ -f "$f" ] && head -45 "$f"
done
grep -h '^{' "$LOGS"/bench-*.log "$LOGS"/rl-steps-*.log "$LOGS"/rollout-*.log 2>/dev/null
cat "$SUMMARY"
