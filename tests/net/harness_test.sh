#!/usr/bin/env bash
# ctest net_plugin_harness: build/bin/chorus-net-harness drives build/lib/libnccl-net-chorus.so (Chorus's
# libfabric network as an NCCL net plugin) through its v12, v11 and v10 tables over libfabric's tcp
# provider on the loopback interface. Also checks that a plugin name that does not exist is refused with
# a clear message, and runs the harness on libnccl-net-chorus-socket.so (Chorus's socket network, which
# has grouped receives) on lo. The libfabric part is skipped (not failed) where libfabric.so.1 is not installed.
# usage: harness_test.sh BUILD_DIR [FABRIC_BUILT: 1, or 0 where the plugin has no libfabric headers]
set -u
build=${1:?usage: harness_test.sh BUILD_DIR}
harness=$build/bin/chorus-net-harness
plugin=$build/lib/libnccl-net-chorus.so
fail=0

# 1. A name no library has: exit 2 and a message naming both names tried.
out=$("$harness" chorus-no-such-plugin 2>&1)
rc=$?
if [ $rc -ne 2 ] || ! grep -q "cannot load plugin 'chorus-no-such-plugin'" <<<"$out" ||
   ! grep -q "libnccl-net-chorus-no-such-plugin.so" <<<"$out"; then
  echo "FAIL: a nonexistent plugin: exit $rc, output:"
  echo "$out"
  fail=1
else
  echo "ok: a nonexistent plugin is refused: $(grep 'cannot load' <<<"$out")"
fi

# run_plugin LABEL LIB [ENV...]: the harness on LIB with each table version; grouped receives required.
run_plugin() {
  local label=$1 lib=$2
  shift 2
  for v in 12 11 10; do
    local log
    log=$(mktemp)
    env "$@" timeout 120 "$harness" --version $v "$lib" >"$log" 2>&1
    local rc=$?
    if [ $rc -ne 0 ] || ! grep -q 'PASS grouped' "$log"; then
      echo "FAIL: chorus-net-harness --version $v $lib: exit $rc (or no grouped receives)"
      cat "$log"
      fail=1
    else
      echo "ok: ${label}v$v: $(grep 'RESULT' "$log")"
      grep -E '^\[[a-z]+\] (WARN|SKIP)' "$log" | sed 's/^/    /'
    fi
    rm -f "$log"
  done
}

# 2. The socket network's plugin (no libfabric needed).
run_plugin "socket " "$build/lib/libnccl-net-chorus-socket.so" NCCL_SOCKET_IFNAME=lo

# 3. The libfabric plugin: built as absent without libfabric's headers (then it has no listen).
# (A SKIP line marks the whole ctest entry skipped: print it only when the socket part passed.)
if [ "${2:-1}" = 0 ]; then
  [ $fail -ne 0 ] && exit $fail
  echo "SKIP: the OFI plugin was built without libfabric's headers; to run it: apt-get install libfabric-dev libfabric-bin, then make test"
  exit $fail
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libfabric\.so\.1'; then
  [ $fail -ne 0 ] && exit $fail
  echo "SKIP: libfabric.so.1 is not installed; to run the plugin's test: apt-get install libfabric1"
  exit $fail
fi
run_plugin "" "$plugin" FI_PROVIDER='tcp;ofi_rxm' FI_TCP_IFACE=lo
exit $fail
