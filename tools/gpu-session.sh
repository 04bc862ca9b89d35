#!/usr/bin/env bash
# One sitting on a GPU machine for the CUDA issue: the device tool lends one for 30 minutes a session
# and 10 minutes a command, so the work is split into steps of a few minutes, each writing its results
# under $OUT (the tool brings that folder back).
#
#   tools/gpu-session.sh build     # build with nvcc/torch found, chorus-info, nvidia-smi        (~2 min)
#   tools/gpu-session.sh test      # the cuda suite and every collective x type x op on the GPU  (~3 min)
#   tools/gpu-session.sh perf      # AllReduce 8 B..256 MiB, 2 and 4 processes on one GPU, copy rates,
#                                  # the synchronous path, real NCCL on the same tool if present (~6 min)
#   tools/gpu-session.sh torch     # ProcessGroupNCCL on Chorus: 2 ranks on cuda:0, DDP vs Gloo   (~2 min)
#
# Real NCCL for the comparison: the *_perf tools call nccl* through libchorus, so preloading a real
# libnccl.so.2 runs the same tool on NCCL (NCCL_NCCL_LIB names it; default: the one torch's wheel
# brings). NCCL before 2.30 refuses two ranks on one GPU ("Duplicate GPU detected"): that is recorded.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
py=$(command -v python3)
step=${1:-all}

run() { # run NAME CMD...: log the command and its output to $OUT/NAME.txt
  local name=$1; shift
  { echo "\$ $*"; "$@"; echo "exit $?"; } >>"$OUT/$name.txt" 2>&1
}

if [[ $step == build || $step == all ]]; then
  run env nvidia-smi
  run env nproc
  # Without nvcc there, carry build/chorus_kernels.fatbin from a build machine and pass it:
  # CHORUS_FATBIN=path tools/gpu-session.sh build
  run env make -j"$(nproc)" CMAKE_FLAGS="-DCHORUS_PYTHON=$py${CHORUS_FATBIN:+ -DCHORUS_FATBIN_FILE=$CHORUS_FATBIN}"
  run env build/bin/chorus-info --brief
fi

if [[ $step == test || $step == all ]]; then
  run test build/bin/chorus-tests 'cuda*' 'perf_check.every_collective_real_gpu' 'perf_modes*'
fi

if [[ $step == perf || $step == all ]]; then
  for np in 2 4; do
    run perf build/bin/all_reduce_perf --device -np "$np" -b 8 -e 256M -f 4 -n 20 -w 5
  done
  run perf build/bin/all_reduce_perf --device -g 2 -b 8 -e 256M -f 4 -n 20 -w 5         # 2 thread ranks
  run perf env CHORUS_CUDA_ASYNC=0 build/bin/all_reduce_perf --device -np 2 -b 8 -e 256M -f 16 -n 10 -w 3
  run perf env CHORUS_CUDA_DIRECT=0 build/bin/all_reduce_perf --device -np 2 -b 8 -e 256M -f 16 -n 10 -w 3 # staging
  for t in all_gather reduce_scatter broadcast; do
    run perf build/bin/${t}_perf --device -np 2 -b 8 -e 256M -f 64 -n 10 -w 3
  done
  run perf build/bin/all_reduce_perf --device -b 8 -e 8 -n 2000 -w 100                  # 1 rank, 8 B
  # Copy rates on this GPU (pinned host <-> device, device -> device), for the targets' yardsticks.
  run perf "$py" -c '
import torch, time
n = 256 << 20
d = torch.empty(n, dtype=torch.uint8, device="cuda"); e = torch.empty_like(d)
h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
def rate(f, reps=20):
    f(); torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(reps): f()
    torch.cuda.synchronize(); return n * reps / (time.perf_counter() - t) / 1e9
print("pinned HtoD %.1f GB/s, DtoH %.1f GB/s, DtoD %.1f GB/s (bytes read + written: x2)" % (
    rate(lambda: d.copy_(h, non_blocking=True)), rate(lambda: h.copy_(d, non_blocking=True)), rate(lambda: e.copy_(d))))'
  nccl=${NCCL_NCCL_LIB:-$("$py" -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)}
  if [[ -n $nccl && -f $nccl ]]; then
    run perf env LD_PRELOAD="$nccl" build/bin/all_reduce_perf --device -b 8 -e 8 -n 2000 -w 100
    for np in 2 4; do
      run perf env LD_PRELOAD="$nccl" NCCL_MULTI_RANK_GPU_ENABLE=1 build/bin/all_reduce_perf --device -np "$np" \
        -b 8 -e 256M -f 4 -n 20 -w 5
    done
  else
    echo "no real libnccl.so.2 found (set NCCL_NCCL_LIB)" >>"$OUT/perf.txt"
  fi
fi

if [[ $step == torch || $step == all ]]; then
  run torch env LD_PRELOAD="$PWD/build/lib/libnccl.so.2" "$py" tests/torch/gpu_nccl_smoke.py 2
  run torch env PYTHONPATH=build/python CHORUS_TEST_NCCL_LIBRARY="$PWD/build/lib/libnccl.so.2" \
    "$py" tests/torch/test_nccl_preload.py
fi
echo "results in $OUT"
