#!/usr/bin/env bash
# A multi-host test cluster on one machine: H network namespaces ("hosts") joined by veth pairs to one
# bridge, which lives in a namespace of its own so nothing is added to the machine's own network.
# Host i (0-based) is namespace PREFIX-hI with interface eth0 at 10.77.0.(i+1)/24 and fd77::(i+1)/64.
# With --rails R each host has R interfaces (NICs, rails): ethK (K < R) on bridge brK of its own subnet,
# 10.(77+K).0.(i+1)/24 and fd(77+K)::(i+1)/64, so eth1 is at 10.78.0.(i+1).
#
#   netns-cluster.sh up H [--rate RATE] [--delay D] [--rails R]
#                                          bring up H hosts (replacing an earlier cluster of this prefix);
#                                          RATE (tc syntax, e.g. 1gbit) shapes each host's link with tbf,
#                                          both directions; D (e.g. 100us) delays every packet each way
#                                          (netem, which then also applies RATE): a hop costs 2 D more;
#                                          R (1..4, default 1) interfaces per host, each shaped alike
#   netns-cluster.sh down                  tear everything down (idempotent, also after a crash)
#   netns-cluster.sh status                list the hosts and their addresses (every ethK)
#   netns-cluster.sh run N [opts] CMD...   run CMD as N ranks; rank i on host i mod H (interleaved), or
#                                          with --blocked on host i / ceil(N/H); waits for all ranks and
#                                          exits non-zero if any failed. Options:
#                                            --blocked      contiguous ranks per host
#                                            --port P       bootstrap root port (default: random)
#                                            --ipv6         NCCL_COMM_ID=[fd77::1]:P instead of 10.77.0.1:P
#                                            --timeout S    kill all ranks after S seconds (exit 124)
#                                            --tag          prefix every output line with "[rank i] "
#   netns-cluster.sh exec HOST CMD...      run one command on host HOST (0-based), e.g. ip link set eth0 down
#   netns-cluster.sh link HOST up|down     bring host HOST's link eth0 up or down (cut it)
#   netns-cluster.sh link HOST IF up|down  the same for interface IF (eth1: the second rail)
#
# Every rank gets NCCL_COMM_ID, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NCCL_HOSTID (the
# namespaces share one kernel, hostname and boot id, so the host identity must be given) and
# CHORUS_SECRET (random per run), which is what chorusInitFromEnv reads. Variables already set in the
# caller's environment (NCCL_DEBUG, NCCL_SOCKET_IFNAME, ...) pass through.
#
# CHORUS_NETNS_PREFIX (default "chorus", at most 8 characters) names the namespaces, so separate clusters
# can coexist. Needs root and iproute2; where network namespaces cannot be made the script says so and
# exits 77 (the conventional "skipped" status).
set -u

PREFIX=${CHORUS_NETNS_PREFIX:-chorus}
SUBNET4=10.77.0
SUBNET6=fd77:
# Rail K's subnets: 10.(77+K).0 and fd(77+K)::/64 (rail 0: SUBNET4, SUBNET6).
subnet4() { echo "10.$((77 + $1)).0"; }
subnet6() { echo "fd$((77 + $1)):"; }
SKIP=77

die() { echo "netns-cluster: $*" >&2; exit 1; }
skip() { echo "netns-cluster: SKIP: $*" >&2; exit $SKIP; }

[[ $PREFIX =~ ^[a-z0-9]{1,8}$ ]] || die "CHORUS_NETNS_PREFIX must be 1-8 lowercase letters or digits"
SW="$PREFIX-sw"
host_ns() { echo "$PREFIX-h$1"; }

need_ip() {
  command -v ip >/dev/null 2>&1 || skip "the 'ip' command (iproute2) is not installed; to run the cluster tests: apt-get install iproute2"
  [ "$(id -u)" -eq 0 ] || skip "network namespaces need root (running as uid $(id -u))"
}

# Namespaces of this prefix's hosts, in host order.
hosts() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-h[0-9]+$" | sed "s/^$PREFIX-h//" | sort -n
}
nhosts() { hosts | wc -l; }

cmd_down() {
  need_ip
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-(h[0-9]+|sw|probe)$"); do
    # Processes left in a namespace (a crashed run) keep its interfaces alive: end them first.
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null || echo "netns-cluster: could not delete namespace $ns" >&2
  done
  return 0
}

cmd_up() {
  local h="" rate="" delay="" rails=1
  while [ $# -gt 0 ]; do
    case $1 in
      --rails) rails=${2:?--rails needs a value}; shift 2 ;;
      --rails=*) rails=${1#--rails=}; shift ;;
      --delay) delay=${2:?--delay needs a value}; shift 2 ;;
      --delay=*) delay=${1#--delay=}; shift ;;
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --rate=*) rate=${1#--rate=}; shift ;;
      *) [ -z "$h" ] || die "up: unexpected argument $1"; h=$1; shift ;;
    esac
  done
  [[ $h =~ ^[0-9]+$ ]] && [ "$h" -ge 1 ] && [ "$h" -le 250 ] || die "up: the host count must be 1..250"
  [[ $rails =~ ^[0-9]+$ ]] && [ "$rails" -ge 1 ] && [ "$rails" -le 4 ] || die "up: --rails must be 1..4"
  need_ip
  # Probe first: in a container without CAP_SYS_ADMIN this is where it fails.
  if ! ip netns add "$PREFIX-probe" 2>/dev/null; then
    skip "network namespaces are not permitted here ('ip netns add' failed)"
  fi
  # Bridges and veth pairs need their kernel modules (a container may lack them).
  if ! ip -n "$PREFIX-probe" link add br0 type bridge 2>/dev/null ||
     ! ip -n "$PREFIX-probe" link add v0 type veth peer name v1 2>/dev/null; then
    ip netns del "$PREFIX-probe"
    skip "bridge or veth interfaces cannot be created here (kernel modules bridge and veth)"
  fi
  ip netns del "$PREFIX-probe"
  cmd_down
  set -e
  ip netns add "$SW"
  ip -n "$SW" link set lo up
  local k
  for ((k = 0; k < rails; k++)); do
    ip -n "$SW" link add "br$k" type bridge
    ip -n "$SW" link set "br$k" up
  done
  local i ns
  for ((i = 0; i < h; i++)); do
    ns=$(host_ns $i)
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    for ((k = 0; k < rails; k++)); do
      # Both ends are created inside the switch namespace, then one end moves to the host. Rail 0's
      # switch port keeps its historical name hI; rail K's is hIrK.
      local port="h$i" dev="eth$k"
      [ $k -gt 0 ] && port="h${i}r$k"
      ip -n "$SW" link add "$port" type veth peer name "$dev" netns "$ns"
      ip -n "$SW" link set "$port" master "br$k"
      ip -n "$SW" link set "$port" up
      ip -n "$ns" addr add "$(subnet4 $k).$((i + 1))/24" dev "$dev"
      ip -n "$ns" -6 addr add "$(subnet6 $k):$(printf '%x' $((i + 1)))/64" dev "$dev" nodad
      ip -n "$ns" link set "$dev" up
      if [ -n "$delay" ]; then
        local q="netem delay $delay ${rate:+rate $rate} limit 100000"
        ip netns exec "$ns" tc qdisc add dev "$dev" root $q ||
          { set +e; cmd_down; die "tc netem failed (is the sch_netem module available?)"; }
        ip netns exec "$SW" tc qdisc add dev "$port" root $q
      elif [ -n "$rate" ]; then
        # burst: enough for the rate at a 1 ms timer tick, at least 64 KiB.
        ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 50ms ||
          { set +e; cmd_down; die "tc tbf failed (is the sch_tbf module available?)"; }
        ip netns exec "$SW" tc qdisc add dev "$port" root tbf rate "$rate" burst 256kb latency 50ms
      fi
    done
  done
  set +e
  # The bridges forward only once their ports are up; wait until host 0 reaches the last host on
  # every rail.
  local last=$((h - 1)) t
  for ((k = 0; k < rails; k++)); do
    for ((t = 0; t < 50; t++)); do
      ip netns exec "$(host_ns 0)" ping -c1 -W1 "$(subnet4 $k).$((last + 1))" >/dev/null 2>&1 && break
      command -v ping >/dev/null 2>&1 || { sleep 0.2; break; }
      sleep 0.1
    done
  done
  local r=""
  [ "$rails" -gt 1 ] && r=", $rails rails"
  echo "netns-cluster: $h host(s) up (prefix $PREFIX$r${rate:+, links shaped to $rate}${delay:+, $delay delay each way})"
}

cmd_status() {
  need_ip
  local i
  for i in $(hosts); do
    # eth0 first, then the other rails in order (the first field of -br is the interface name)
    printf '%s: %s\n' "$(host_ns $i)" \
      "$(ip -n "$(host_ns $i)" -br addr show 2>/dev/null | grep -E '^eth[0-9]+(@|[[:space:]])' | sort | tr -s ' ' | sed 's/ *$//' |
         paste -sd '|' - | sed 's/|/; /g')"
  done
}

cmd_exec() {
  need_ip
  local i=${1:?exec needs a host number}
  shift
  [ $# -gt 0 ] || die "exec: no command"
  ip netns list | awk '{print $1}' | grep -qx "$(host_ns "$i")" || die "exec: no host $i (is the cluster up?)"
  exec ip netns exec "$(host_ns "$i")" "$@"
}

cmd_link() {
  need_ip
  local i=${1:?link needs a host number} dev=eth0 state=${2:?link needs up or down}
  if [ $# -ge 3 ]; then dev=$2 state=$3; fi
  [ "$state" = up ] || [ "$state" = down ] || die "link: say up or down"
  [[ $dev =~ ^eth[0-9]+$ ]] || die "link: the interface must be ethK (eth0, eth1, ...)"
  ip -n "$(host_ns "$i")" link set "$dev" "$state"
}

cmd_run() {
  need_ip
  local n=${1:?run needs a rank count}
  shift
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "run: the rank count must be a positive number"
  local blocked=0 port="" v6=0 timeout=0 tag=0
  while [ $# -gt 0 ]; do
    case $1 in
      --blocked) blocked=1; shift ;;
      --port) port=${2:?}; shift 2 ;;
      --ipv6) v6=1; shift ;;
      --timeout) timeout=${2:?}; shift 2 ;;
      --tag) tag=1; shift ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || die "run: no command"
  local h
  h=$(nhosts)
  [ "$h" -ge 1 ] || die "run: no hosts (run 'up H' first)"
  [ -n "$port" ] || port=$((20000 + RANDOM % 20000))
  local root="$SUBNET4.1:$port"
  [ $v6 -eq 1 ] && root="[${SUBNET6}:1]:$port"
  local secret
  secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  local per=$(((n + h - 1) / h)) i host lr lws pids=() hostof=()
  for ((i = 0; i < n; i++)); do
    if [ $blocked -eq 1 ]; then host=$((i / per)); else host=$((i % h)); fi
    hostof[i]=$host
  done
  trap 'kill -TERM "${pids[@]}" 2>/dev/null; exit 130' INT TERM
  local count=() seen=() # ranks per host, and ranks placed so far per host: O(N), for 1,024 ranks
  for ((i = 0; i < n; i++)); do count[hostof[i]]=$((${count[hostof[i]]:-0} + 1)); done
  for ((i = 0; i < n; i++)); do
    host=${hostof[i]}
    lr=${seen[host]:-0} lws=${count[host]}
    seen[host]=$((lr + 1))
    local envs=(NCCL_COMM_ID="$root" RANK=$i WORLD_SIZE=$n LOCAL_RANK=$lr LOCAL_WORLD_SIZE=$lws
      NCCL_HOSTID="$PREFIX-host$host" CHORUS_SECRET="$secret" CHORUS_NETNS_HOST=$host)
    local pre=()
    [ "$timeout" != 0 ] && pre=(timeout -s KILL "$timeout")
    if [ $tag -eq 1 ]; then
      ( ip netns exec "$(host_ns "$host")" env "${envs[@]}" "${pre[@]}" "$@" 2>&1 | sed -u "s/^/[rank $i] /"
        exit "${PIPESTATUS[0]}" ) &
    else
      ip netns exec "$(host_ns "$host")" env "${envs[@]}" "${pre[@]}" "$@" &
    fi
    pids+=($!)
  done
  local rc=0 st
  for ((i = 0; i < n; i++)); do
    wait "${pids[i]}"
    st=$?
    if [ $st -ne 0 ]; then
      echo "netns-cluster: rank $i (host ${hostof[i]}) exited with status $st" >&2
      [ $rc -eq 0 ] && rc=$st
      [ $st -eq 137 ] && [ "$timeout" != 0 ] && rc=124
    fi
  done
  trap - INT TERM
  return $rc
}

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down ;;
  status) shift; cmd_status ;;
  run) shift; cmd_run "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  link) shift; cmd_link "$@" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
