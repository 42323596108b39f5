# shellcheck shell=bash
# Shared settings and helpers of the end-to-end harness (sourced by run.sh).
#
# Everything is pinned to Debian 12 "bookworm" main (Debian 13 "trixie": e2e_platform below): the Xen tools and hypervisor
# (4.17.5+72) and the kernel (6.1.0-50, 6.1.176-1) must come from one suite (the tools must match the
# hypervisor, the guest module its kernel). Changing a pin changes the cache keys below, so the next run
# rebuilds what depends on it.

E2E_MIRROR=${E2E_MIRROR:-http://deb.debian.org/debian}

# e2e_platform bookworm|trixie: the pins of one platform (issue 17). Debian 12 is the
# default; Debian 13 "trixie" (Xen 4.20 without CONFIG_GDBSX, Linux 6.12) runs the scenarios
# named trixie_* (run.sh), with a payload built in a trixie build root (images.sh
# e2e_buildroot) against its own libxen-dev, Capstone 5 and kernel headers.
# Dom0 root file system: the Xen toolstack, the kernel (also the DomU kernel), and the
# runtime libraries libxenprobes.so needs (ldd: libcapstone, libxen*, libbpf, libstdc++).
# No Unicorn: it is libxenprobes-sim.so's alone, which libxenprobes.so loads only for
# XENPROBES_BACKEND=sim (docs/simulated-xen.md) and which run.sh leaves out of the payload.
# run.sh's build_payload fails when a staged program or library needs a library not here.
e2e_platform() {
  E2E_PLATFORM=$1
  case "$1" in
    bookworm)
      E2E_SUITE=bookworm
      E2E_XEN_SERIES=4.17
      E2E_XEN_VERSION=4.17.5+72-g01140da4e8-1
      E2E_KERNEL_ABI=6.1.0-50-amd64
      E2E_KERNEL_VERSION=6.1.176-1
      # libbpf1: libxenprobes checks the guest's BTF with it (libxenprobes/kernel/btf.cpp); it
      # brings libelf1, with which libxenprobes reads kernel images (common/elf_image.cpp);
      # libtomlplusplus3, libcpp-httplib0.11, libsystemd0: xenprobesd's (its scenario runs it).
      # systemd: stock_pv_xenprobesd_service boots Dom0 with systemd as PID 1 to run the unit.
      E2E_ROOTFS_PKGS="xen-utils-4.17,xenstore-utils,linux-image-$E2E_KERNEL_ABI,kmod,busybox,procps,libcapstone4,libbpf1,libstdc++6,libtomlplusplus3,libcpp-httplib0.11,libsystemd0,systemd"
      ;;
    trixie)
      # trixie main as the mirror serves it (Debian 13.8): its point releases moved Xen and
      # the kernel; bumping these pins rebuilds the trixie images.
      E2E_SUITE=trixie
      E2E_XEN_SERIES=4.20
      E2E_XEN_VERSION=4.20.4+63-g7abfd2bce2-0+deb13u1
      E2E_KERNEL_ABI=6.12.117+deb13-amd64
      E2E_KERNEL_VERSION=6.12.117-1
      # libbpf1: libxenprobes reads the guest's BTF with it (libxenprobes/kernel/btf.cpp); it
      # brings libelf1t64, with which libxenprobes reads kernel images (common/elf_image.cpp);
      # libtomlplusplus3t64, libcpp-httplib0.18, libsystemd0: xenprobesd's.
      E2E_ROOTFS_PKGS="xen-utils-4.20,xenstore-utils,linux-image-$E2E_KERNEL_ABI,kmod,busybox,procps,libcapstone5,libbpf1,libstdc++6,libtomlplusplus3t64,libcpp-httplib0.18,libsystemd0"
      ;;
    *) echo "e2e_platform: unknown platform '$1' (bookworm, trixie)" >&2; return 1 ;;
  esac
}
e2e_platform bookworm
# Host tools the harness uses (Debian package names). xz-utils and zstd: run.sh takes the
# DomUs' kernel ELF out of its vmlinuz (tools/vmlinuz-payload.sh). The -dev packages after
# libunicorn-dev: what the payload's build (the library, its examples, xenprobe and
# xenprobesd: build_payload_libs in run.sh) finds with CMake, so that run.sh alone builds on a
# fresh machine (tools/install-deps.sh installs them too, with the test suite's own).
E2E_HOST_PKGS="qemu-system-x86 debootstrap kmod cpio busybox-static e2fsprogs gzip xz-utils zstd binutils cmake pkg-config gcc g++ make libxen-dev libcapstone-dev libunicorn-dev libbpf-dev libelf-dev libssl-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libcpp-httplib-dev libsystemd-dev linux-headers-$E2E_KERNEL_ABI"

E2E_CACHE=${XENPROBES_E2E_CACHE:-/var/cache/xenprobes-e2e}
E2E_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
E2E_TOOLS=$E2E_SRC/tools/e2e

# Bounds (seconds). Every wait in the harness has one.

E2E_QEMU_MEM=${XENPROBES_E2E_QEMU_MEM:-3G}
E2E_QEMU_ACCEL=${XENPROBES_E2E_QEMU_ACCEL:-tcg,thread=multi}
# QEMU's CPU model: `max` (`-cpu host` needs KVM: docs/e2e.md). The environment's random
# process deaths were not the CPU model's
# doing (fsgsbase=off, avx=off, thread=single changed nothing): Xen's lazy FPU switching under
# TCG, which run.sh turns off (spec-ctrl=eager-fpu); docs/e2e.md "The environment".
E2E_QEMU_CPU=${XENPROBES_E2E_QEMU_CPU:-max}

E2E_T0=${E2E_T0:-$(date +%s)}
E2E_STAGE=""

e2e_elapsed() { echo $(($(date +%s) - E2E_T0)); }
e2e_log() { printf '[e2e %4ss] %s\n' "$(e2e_elapsed)" "$*" >&2; }
e2e_stage() {
  E2E_STAGE=$1
  E2E_STAGE_T0=$(date +%s)
  e2e_log "stage: $1"
}
e2e_stage_done() { e2e_log "stage: $E2E_STAGE done in $(($(date +%s) - E2E_STAGE_T0))s${1:+ ($1)}"; }
e2e_die() {
  e2e_log "FAILED in stage '$E2E_STAGE': $*"
  exit 1
}

# sha256 of its arguments' contents (files, or directories walked in sorted order) and of
# the strings given with -s; prints the first 16 hex digits.
e2e_hash() {
  {
    while [ $# -gt 0 ]; do
      if [ "$1" = -s ]; then
        printf 'S:%s\n' "$2"
        shift 2
        continue
      fi
      if [ -d "$1" ]; then
        (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum)
      elif [ -e "$1" ]; then
        printf 'F:%s ' "$1"
        sha256sum <"$1"
      else
        printf 'missing:%s\n' "$1"
      fi
      shift
    done
  } | sha256sum | cut -c1-16
}

# Installs missing host packages (an ordinary apt-get install; no upgrade).
e2e_host_deps() {
  local missing="" p
  for p in $E2E_HOST_PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  e2e_log "installing host packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || e2e_die "apt-get update failed"
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null || e2e_die "apt-get install$missing failed"
}
