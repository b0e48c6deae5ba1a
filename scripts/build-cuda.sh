#!/usr/bin/env bash
# Builds agentrl and the model crate's test binary with the `cuda` feature on
# a machine without a CUDA toolkit or GPU, and packs them for a GPU machine.
#
# nvcc, the headers and the CUDA libraries come from NVIDIA's PyPI wheels,
# pinned to CUDA 13.0 so that the PTX (ISA 9.0) loads on driver 580 and
# later. libcuda.so belongs to the driver and no wheel ships it: the link
# uses a stub with every cu* symbol cudarc declares (SONAME libcuda.so.1);
# at run time the driver's real libcuda.so.1 is loaded instead.
#
#   scripts/build-cuda.sh            # build what HEAD commits (~25 min on 2 cores)
#   CUDA_BUILD_DIR=/scratch/cb scripts/build-cuda.sh
#   CUDA_COMPUTE_CAP=80 scripts/build-cuda.sh   # A100 (default 90: H100/H200)
#
# It builds a private clone of the committed tree (HEAD) in $CUDA_BUILD_DIR
# (default /tmp/agentrl-cuda), so uncommitted edits are not in the binaries.
# Rerunning skips the finished steps (venv, toolkit links, stub) and
# rebuilds incrementally. Last, it runs the model tests and a one-step RL
# bench with the cuda binaries on this machine's CPU (the link stub stands
# in for libcuda.so.1), which catches code only a cuda build compiles.
# Output, in $CUDA_BUILD_DIR/out:
#   agentrl, model_tests      stripped binaries
#   libkernel_profile.so      the per-kernel profiler (bench/kernel-profile),
#   libcupti.so.13            with the CUPTI it was built against beside it
#   cuda_bins.tar.xz          all four, one archive (Python's tarfile unpacks it)
#   MANIFEST                  commit, toolkit versions, sha256 sums and the
#                             shared libraries the binaries load at run time
#
# On the GPU machine: put only the folder holding libcudart.so.13,
# libcublas.so.13, libcublasLt.so.13 and libcurand.so.10 on LD_LIBRARY_PATH
# (e.g. site-packages/nvidia/cu13/lib of torch's CUDA 13 wheels, or this
# build's venv copied over). Adding every nvidia/ folder of a Python
# install there can pull in a second libc++ or libstdc++ and make every
# program crash. The test binary reads its fixtures from the build-time path
# $CUDA_BUILD_DIR/src/crates/model/tests/data; run it with that tree present
# or from a checkout at the same path.
set -euo pipefail

TOP=$(git rev-parse --show-toplevel)
W=${CUDA_BUILD_DIR:-/tmp/agentrl-cuda}
SRC=$W/src
CAP=${CUDA_COMPUTE_CAP:-90}
# The toolkit pieces, one pinned version set (CUDA 13.0).
WHEELS=(
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88
  nvidia-curand==10.4.0.35 nvidia-cublas==13.1.0.3 nvidia-cuda-cupti==13.0.85
)
for tool in git python3 gcc cargo strip xz; do
  command -v "$tool" >/dev/null || { echo "build-cuda: needs $tool on PATH" >&2; exit 1; }
done
mkdir -p "$W"

echo "== 1/6 the committed tree at HEAD in $SRC"
[ -d "$SRC/.git" ] || git clone -q "$TOP" "$SRC"
git -C "$SRC" fetch -q "$TOP" HEAD
# The clone is this script's own: whatever was left in it gives way.
git -C "$SRC" checkout -q --force --detach FETCH_HEAD
git -C "$SRC" clean -qfd
REV=$(git -C "$SRC" rev-parse HEAD)

echo "== 2/6 the CUDA 13.0 toolkit from PyPI"
[ -x "$W/venv/bin/pip" ] || python3 -m venv "$W/venv"
nice -n 19 "$W/venv/bin/pip" install -q --no-cache-dir "${WHEELS[@]}"
C=$("$W/venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')

# A CUDA_HOME of symlinks: bin/ (nvcc, ptxas), nvvm/ (cicc, libdevice),
# include/, and lib64/ with the unversioned names the linker looks for.
H=$W/cuda
mkdir -p "$H/lib64/stubs" "$H/targets/x86_64-linux"
ln -sfn "$C/bin" "$H/bin"
ln -sfn "$C/nvvm" "$H/nvvm"
ln -sfn "$C/include" "$H/include"
ln -sfn "$C/include" "$H/targets/x86_64-linux/include"
ln -sfn "$H/lib64" "$H/targets/x86_64-linux/lib"
ln -sfn "$H/lib64" "$H/lib"
for f in "$C"/lib/*.so.* "$C"/lib/*.a; do ln -sfn "$f" "$H/lib64/"; done
(
  cd "$H/lib64"
  ln -sfn libcudart.so.13 libcudart.so
  ln -sfn libnvrtc.so.13 libnvrtc.so
  ln -sfn libcurand.so.10 libcurand.so
  ln -sfn libcublas.so.13 libcublas.so
  ln -sfn libcublasLt.so.13 libcublasLt.so
)

echo "== 3/6 the link-time stub of libcuda.so.1"
if [ ! -f "$H/lib64/stubs/libcuda.so" ]; then
  CUDARC=$(cd "$SRC" && cargo metadata --format-version 1 --features agentrl-model/cuda 2>/dev/null |
    python3 -c 'import json, sys
print([p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"][0])')
  mkdir -p "$W/stub"
  grep -oE '^pub unsafe fn cu[A-Za-z0-9_]+' "$(dirname "$CUDARC")/src/driver/sys/mod.rs" |
    awk '{print $4}' | sort -u >"$W/stub/cuda_syms.txt"
  [ -s "$W/stub/cuda_syms.txt" ] || { echo "build-cuda: no cu* symbols found in cudarc" >&2; exit 1; }
  {
    echo '/* link-time stub for libcuda.so.1; the driver provides the real one */'
    while read -r s; do echo "int $s(void) { return 999; }"; done <"$W/stub/cuda_syms.txt"
  } >"$W/stub/cuda_stub.c"
  nice -n 19 gcc -shared -fPIC -O0 -Wl,-soname,libcuda.so.1 -o "$H/lib64/stubs/libcuda.so" "$W/stub/cuda_stub.c"
fi

echo "== 4/6 cargo build --features cuda (sm_$CAP)"
export CUDA_HOME=$H               # build.rs, cudarc's link paths, candle's kernels
export PATH=$H/bin:$PATH          # nvcc
export CUDA_COMPUTE_CAP=$CAP      # candle turns 90 into sm_90a / compute_90a
export CUDARC_CUDA_VERSION=13000  # cudarc's bindings for CUDA 13.0
export CUDAFORGE_THREADS=${CUDAFORGE_THREADS:-2}
export CARGO_TARGET_DIR=$W/target
cd "$SRC"
nice -n 19 cargo build --release --locked -p agentrl --features agentrl-model/cuda
TEST_EXE=$(nice -n 19 cargo test --release --locked -p agentrl-model --features cuda --test model \
  --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "model" and m.get("executable"):
        print(m["executable"])')
[ -n "$TEST_EXE" ] || { echo "build-cuda: the model test binary was not built" >&2; exit 1; }

echo "== 5/6 stripped binaries, the kernel profiler, archive and manifest in $W/out"
mkdir -p "$W/out"
cp "$CARGO_TARGET_DIR/release/agentrl" "$W/out/agentrl"
cp "$TEST_EXE" "$W/out/model_tests"
chmod u+w "$W/out/agentrl" "$W/out/model_tests"
nice -n 19 strip "$W/out/agentrl" "$W/out/model_tests"
# The profiler's bookkeeping is tested here; its CUPTI half needs a GPU.
KP=$SRC/bench/kernel-profile
gcc -O2 -Wall -Werror -o "$W/out/kernel_profile_test" "$KP/kernel_profile_test.c" -ldl -lpthread
"$W/out/kernel_profile_test"
# RPATH (not RUNPATH): the libcupti.so.13 beside it wins over LD_LIBRARY_PATH's.
gcc -O2 -Wall -Werror -shared -fPIC -I"$C/include" -o "$W/out/libkernel_profile.so" \
  "$KP/kernel_profile.c" -L"$C/lib" -l:libcupti.so.13 -ldl -lpthread \
  -Wl,--disable-new-dtags,-rpath,'$ORIGIN'
cp "$C/lib/libcupti.so.13" "$W/out/libcupti.so.13"
BINS=(agentrl model_tests libkernel_profile.so libcupti.so.13)
(cd "$W/out" && nice -n 19 tar cf - "${BINS[@]}" |
  nice -n 19 xz -T1 --lzma2=preset=9,dict=256MiB >cuda_bins.tar.xz)
{
  echo "commit $REV"
  echo "compute capability $CAP; CUDA wheels: ${WHEELS[*]}"
  echo
  (cd "$W/out" && sha256sum "${BINS[@]}" cuda_bins.tar.xz)
  echo
  echo "shared libraries the binaries load (NEEDED entries):"
  for b in agentrl model_tests libkernel_profile.so; do
    echo "$b: $(readelf -d "$W/out/$b" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')"
  done
} >"$W/out/MANIFEST"
cat "$W/out/MANIFEST"

echo "== 6/6 the cuda binaries on this CPU (the stub as libcuda.so.1; no GPU is touched)"
# The model tests on the CPU device and a one-step RL bench: code that only
# a cuda build compiles runs here too before a GPU machine sees it.
mkdir -p "$W/stub/run"
ln -sfn "$H/lib64/stubs/libcuda.so" "$W/stub/run/libcuda.so.1"
(
  export LD_LIBRARY_PATH=$W/stub/run:$H/lib64
  cd "$W"
  "$W/out/model_tests" --quiet
  "$W/out/agentrl" bench rollout --rl-steps 1 "$SRC/configs/smoke.toml" >/dev/null
)
echo "the cuda build's model tests and a one-step RL bench pass on the CPU"
