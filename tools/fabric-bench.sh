#!/usr/bin/env bash
# The fabric path's figures in one sitting (issue 27), on network-namespace hosts (tools/netns-cluster.sh):
#   1. libfabric's own yardstick between two hosts: fi_pingpong over the provider, 8 B and 64 MiB;
#   2. Chorus's AllReduce between the same hosts (1 rank each), 8 B and 64 MiB, over NCCL_NET=OFI, over
#      its socket transport (NCCL_NET=Socket) and over the same sockets behind the net interface
#      (NCCL_NET=Socket CHORUS_SOCKET_NET=1), then the last two once more on one host's loopback;
#   3. two rails: hosts with two links each shaped to RATE, a 64 MiB AllReduce on 2 channels over one
#      rail (FI_TCP_IFACE=eth0) and over both, for OFI and for the socket network behind the interface.
# Prints one line per figure. Needs root, iproute2, libfabric-bin (fi_pingpong) and a build (make).
#
# Usage: sudo tools/fabric-bench.sh [PROVIDER] [RATE]    (defaults: 'tcp;ofi_rxm', 1gbit)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
prov=${1:-tcp;ofi_rxm}
rate=${2:-1gbit}
bin=${BUILD:-$root/build}/bin
export CHORUS_NETNS_PREFIX=${CHORUS_NETNS_PREFIX:-fbench}
nc="$here/netns-cluster.sh"
command -v fi_pingpong >/dev/null || { echo "fabric-bench: no fi_pingpong (apt-get install libfabric-bin)" >&2; exit 1; }
[ -x "$bin/all_reduce_perf" ] || { echo "fabric-bench: no $bin/all_reduce_perf (make)" >&2; exit 1; }
trap '"$nc" down >/dev/null 2>&1' EXIT

# fi_pingpong SIZE ITERS: the client's row (bytes, iterations, time, MB/s, usec/xfer).
pingpong() {
  local size=$1 iters=$2
  FI_TCP_IFACE=eth0 "$nc" exec 0 timeout 120 fi_pingpong -p "$prov" -e rdm -m tagged -I "$iters" -S "$size" \
    >/dev/null 2>&1 &
  local srv=$!
  sleep 1
  FI_TCP_IFACE=eth0 "$nc" exec 1 timeout 120 fi_pingpong -p "$prov" -e rdm -m tagged -I "$iters" -S "$size" \
    10.77.0.1 2>&1 | awk 'NR > 1 && $1 ~ /^[0-9]/ { print "fi_pingpong  size " $1 "  usec/xfer " $7 "  MB/s " $6 }'
  wait $srv 2>/dev/null
}

# chorus NET SIZE ITERS [env...]: all_reduce_perf's row (time and bus bandwidth) for 2 ranks on 2 hosts.
chorus() {
  local net=$1 size=$2 iters=$3
  shift 3
  env NCCL_NET="$net" FI_PROVIDER="$prov" "$@" "$nc" run 2 --timeout 300 "$bin/all_reduce_perf" -b "$size" \
    -e "$size" -n "$iters" -w 3 2>&1 | awk -v net="$net" -v extra="$*" '
      $1 ~ /^[0-9]+$/ && NF >= 8 { print "chorus " net " " extra "  size " $1 "  time_us " $6 "  busbw_GB/s " $8; exit }'
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), provider $prov"
"$nc" up 2 >/dev/null || exit $?
pingpong 8 2000
pingpong 67108864 5
for rep in 1 2; do
  for net in OFI Socket Socket-table; do
    extra=()
    [ "$net" = Socket-table ] && net=Socket && extra=(CHORUS_SOCKET_NET=1)
    chorus "$net" 8 2000 FI_TCP_IFACE=eth0 "${extra[@]}"
    chorus "$net" 64M 5 FI_TCP_IFACE=eth0 "${extra[@]}"
  done
done

# The socket transport and the socket network behind the interface on loopback: 2 processes, one host.
local_run() {
  local size=$1 iters=$2
  shift 2
  env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_NET_PLUGIN=none NCCL_SOCKET_IFNAME=lo "$@" \
    "$bin/chorusrun" -n 2 --timeout 120 "$bin/all_reduce_perf" -b "$size" -e "$size" -n "$iters" -w 3 2>&1 |
    awk -v extra="$*" '$1 ~ /^[0-9]+$/ && NF >= 8 { print "loopback Socket " extra "  size " $1 "  time_us " $6 "  busbw_GB/s " $8; exit }'
}
for rep in 1 2; do
  for m in 0 1; do
    local_run 8 2000 CHORUS_SOCKET_NET=$m
    local_run 64M 5 CHORUS_SOCKET_NET=$m
  done
done

echo "# two rails, each link shaped to $rate"
"$nc" up 2 --rails 2 --rate "$rate" >/dev/null || exit $?
chorus OFI 64M 3 FI_TCP_IFACE=eth0 NCCL_MIN_NCHANNELS=2 NCCL_MAX_NCHANNELS=2
chorus OFI 64M 3 NCCL_MIN_NCHANNELS=2 NCCL_MAX_NCHANNELS=2
chorus Socket 64M 3 NCCL_MIN_NCHANNELS=2 NCCL_MAX_NCHANNELS=2
# the socket network behind the interface: one device per interface (eth0, eth1), channels spread
chorus Socket 64M 3 CHORUS_SOCKET_NET=1 NCCL_SOCKET_IFNAME==eth0 NCCL_MIN_NCHANNELS=2 NCCL_MAX_NCHANNELS=2
chorus Socket 64M 3 CHORUS_SOCKET_NET=1 NCCL_MIN_NCHANNELS=2 NCCL_MAX_NCHANNELS=2
