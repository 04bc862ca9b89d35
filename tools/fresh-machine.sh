#!/usr/bin/env bash
# Build and test a clean clone on a fresh Debian 12 that has only the compilers and CMake, as a new
# user's machine would: no libfabric, torch, python3, clang, nvcc or iproute2. Run as root (debootstrap,
# chroot); needs Debian's package mirror. The first run makes the root file system (~2 minutes).
#
#   sudo tools/fresh-machine.sh [ROOTFS]          # default /var/tmp/chorus-deb12; then make run, make test
#   sudo tools/fresh-machine.sh ROOTFS --shell    # a shell in it, the clone in /root/chorus
#
# The clone is of this repository's HEAD (commit first). Its logs: ROOTFS/root/run.log, test.log.
set -euo pipefail
root=${1:-/var/tmp/chorus-deb12}
repo=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "fresh-machine.sh: run as root (debootstrap, chroot)" >&2; exit 2; }
if [ ! -x "$root/usr/bin/cmake" ]; then
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
  debootstrap --variant=minbase bookworm "$root"
  cp /etc/resolv.conf "$root/etc/"
  chroot "$root" bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends build-essential cmake git ca-certificates'
fi
# An installed system (and a container) has /etc/hosts; debootstrap's minimal root does not.
[ -e "$root/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
for m in proc sys dev dev/shm; do
  mountpoint -q "$root/$m" || case $m in
    proc) mount -t proc proc "$root/proc" ;;
    sys) mount -t sysfs sys "$root/sys" ;;
    *) mount --bind "/$m" "$root/$m" ;;
  esac
done
trap 'for m in dev/shm dev sys proc; do umount "$root/$m" 2>/dev/null || true; done' EXIT
rm -rf "$root/root/chorus"
git clone -q "$repo" "$root/root/chorus"
env_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ "${2:-}" = --shell ]; then
  chroot "$root" env -i HOME=/root PATH=$env_path TERM="${TERM:-xterm}" bash -c 'cd /root/chorus && exec bash'
  exit
fi
chroot "$root" env -i HOME=/root PATH=$env_path bash -c \
  'cd /root/chorus && make run >/root/run.log 2>&1 && tail -n 4 /root/run.log && make test 2>&1 | tee /root/test.log | tail -n 30'
