#!/bin/bash
# End-to-end tests of libxenprobes on a real Xen hypervisor under QEMU (TCG).
#
#   tools/e2e/run.sh [--group[=N]] [scenario...]   default: every scenario of the default list
#   tools/e2e/run.sh --list
#
# Each scenario gets its own boot (Dom0's toolstack is up ~13 s into its uptime on an idle host).
# --group runs up to N (default 6) consecutive scenarios that need the same platform and
# hypervisor in one boot instead (faster, less isolated: the test command's choice). See
# docs/e2e.md.
#
# Builds and caches everything outside the source tree (XENPROBES_E2E_CACHE, default
# /var/cache/xenprobes-e2e), keyed by the inputs: the Dom0 root file system (debootstrap of
# bookworm main; trixie_* scenarios: trixie's, with a payload built in a trixie build root),
# Debian's stock hypervisor, libxenprobes + tools + the e2e program (their own
# CMake build dir, installed with DESTDIR), the guest module (built against the DomU kernel's
# headers) and the DomU initramfs. Then boots QEMU once per scenario (bounded by a timeout),
# runs the scenario inside Dom0 against DomUs, and reads the results from the serial log.
# No QEMU process outlives this script. Needs root. See docs/e2e.md.
# The whole script is one block, parsed before it runs: editing it during a run is safe.
{
set -u
set -o pipefail
E2E_T0=$(date +%s)
. "$(dirname "$0")/lib.sh"
. "$E2E_TOOLS/images.sh"

# scenario -> hypervisor ("stock", "gdbsx", or "stock-qemu10": the stock one under QEMU 10).
# Every scenario of the default list runs under QEMU 10: it runs ICEBP (the vm_event and debugger
# channels' trap), and a PV guest whose text changes while it runs (our probes, jump probes, its
# own tracepoints) stalls for a minute or more under the host's QEMU 7.2, with or without the
# module (docs/e2e.md "The environment", diag_tracepoint_toggle). "stock" (QEMU 7.2) is kept for
# the diagnostics that compare the two and for the benchmark (its published ratios were measured
# there). The default list (SCEN_ORDER) leaves out the diagnostics (diag_*), the benchmark
# (bench_*), stock_pvh_baseline and the kill -9 rounds. The real-kernel sweep stock_pv_sweep is in
# it: 2-3 min under QEMU 10 on an idle host, up to 6 at a load of 10 (docs/e2e.md "The real-kernel
# sweep").
declare -A SCEN_XEN=([stock_pv_baseline]=stock-qemu10 [stock_pv_module_idle]=stock-qemu10 [stock_pv_guest]=stock-qemu10
  [stock_pv_guest_churn]=stock-qemu10 [stock_pv_guest_cr3]=stock-qemu10 [stock_debugger_refusal]=stock-qemu10 [stock_kill9]=stock-qemu10 [stock_pv_two_guests]=stock-qemu10 [diag_xl_churn]=stock [diag_env_procs]=stock [diag_env_procs_q10]=stock-qemu10
  [diag_tracepoint_toggle]=stock [diag_tracepoint_toggle_q10]=stock-qemu10
  [gdbsx_pv_debugger]=gdbsx [gdbsx_kill9]=gdbsx [stock_pvh_vmevent]=stock-qemu10 [stock_pvh_baseline]=stock-qemu10 [stock_pvh_kill9]=stock-qemu10
  [bench_table1_guest]=stock [bench_table1_guest_spin]=stock [bench_table1_debugger]=gdbsx [bench_table1_vmevent]=stock-qemu10
  [stock_pv_safety]=stock-qemu10 [stock_pvh_safety_control]=stock-qemu10 [stock_pv_xenprobe]=stock-qemu10 [stock_pv_xenprobe_async]=stock-qemu10 [stock_pv_xenprobesd]=stock-qemu10
  [stock_pv_xenprobesd_service]=stock-qemu10 [stock_pv_jump]=stock-qemu10 [stock_pv_async]=stock-qemu10 [stock_pv_spin]=stock-qemu10 [stock_kill9_jump]=stock-qemu10 [stock_pv_sweep]=stock-qemu10 [stock_pv_module_gone]=stock-qemu10 [stock_pv_budget]=stock-qemu10 [stock_kill9_rounds]=stock-qemu10 [stock_pvh_kill9_rounds]=stock-qemu10 [gdbsx_kill9_rounds]=gdbsx)
# The unload handshake (protocol.h "Letting go").
SCEN_XEN[stock_pv_module_release]=stock-qemu10
# A short jump to an island (issue 14, protocol.h "Short jumps to islands"): putname's point
# served only by one on 6.1 (run 20261128-090437-13667: ~2 min a boot).
SCEN_XEN[stock_pv_jump_island]=stock-qemu10
# The module's slots at unload (issue 12): a read asleep in a fault taken in a fixup slot keeps
# the module loaded until it has left the slot; passed, not in the default list (CI's time).
SCEN_XEN[stock_pv_slot_unload]=stock-qemu10
# A loaded module's BTF read by xenprobe from a real guest (issue 15), through the kernel's
# btf_modules list (6.1 clears a module's btf_data after its init; docs/xenprobe.md); not in
# the default list.
SCEN_XEN[stock_pv_xenprobe_module_btf]=stock-qemu10
# xenprobe on vm_event against a PVH guest without the module (issue 15), and whether the
# platform hands a PVH guest's int3s to Dom0 at all (xpe2e-probe int3-intercept, nothing written
# into the guest), which agentless probing rests on. Under QEMU's TCG it does not (docs/e2e.md
# "QEMU's TCG does not take a guest's int3 to Xen"): both fail there (the first is recorded in SCEN_XFAIL below; the
# second stops before its first probe, saying why); not in the default list.
SCEN_XEN[stock_pvh_xenprobe_agentless]=stock-qemu10
SCEN_XEN[stock_pvh_int3_intercept]=stock-qemu10
# stock_pvh_vmevent with page-table isolation on in the guest (issue 12).
SCEN_XEN[stock_pvh_vmevent_pti]=stock-qemu10
# The tail-call proof from the guest's own kernel image (issue 14): a point refused as a jump
# without it is one with it (the image's first reading under TCG: its limit); and kill -9 with
# a short jump to an island armed (the module restores region and island). Not in the default
# list yet.
SCEN_XEN[stock_pv_jump_image]=stock-qemu10
SCEN_XEN[stock_kill9_island]=stock-qemu10
# Jump probes (and an async one) in a loaded module's text, loop.ko's lo_ioctl, and `rmmod loop`
# with a jump written there (xpe2e-probe jump-module); not in the default list yet.
SCEN_XEN[stock_pv_jump_module]=stock-qemu10
# Scenarios whose Dom0 gets the DomUs' vmlinux (build_payload).
declare -A SCEN_VMLINUX=([stock_pv_jump_image]=1)
# kill -9 inside the handler of a probe on an indirect call (the guest module's fallback emulates
# `call *%reg`), and every instruction of the user-access routines probed while the guest's user
# accesses fault (issue 12).
SCEN_XEN[stock_kill9_icall]=stock-qemu10
SCEN_XEN[stock_pv_safety_extable_all]=stock-qemu10
# Scenarios whose Dom0 boots systemd (dom0-init DOM0_SYSTEMD: the toolstack by hand, then exec
# systemd, which runs the scenarios as a service).
declare -A SCEN_SYSTEMD=([stock_pv_xenprobesd_service]=1)
# Scenarios that get a boot of their own under --group too: a Dom0 that boots systemd is
# another Dom0 (it would boot every scenario of its group that way).
declare -A SCEN_ALONE=([stock_pv_xenprobesd_service]=1)
# The benchmark (tools/bench/table1.sh runs it; never in the default list) and its time limit
# per boot, in seconds (a scenario's default is 420 s).
BENCH_SCENARIOS="bench_table1_guest bench_table1_guest_spin bench_table1_debugger bench_table1_vmevent"
# The safety scenarios run four guest phases (or five activities on PVH) in one boot: up to 500 s
# per boot at a host load of 6-10 (2026-11-25), ~60 s on a quiet host under QEMU 10 (docs/e2e.md
# "Probe safety", "Timings").
declare -A SCEN_LIMIT=([diag_env_procs]=${XPE2E_DIAG_LIMIT:-1500} [diag_env_procs_q10]=${XPE2E_DIAG_LIMIT:-1500}
  [diag_tracepoint_toggle]=${XPE2E_DIAG_LIMIT:-1500} [diag_tracepoint_toggle_q10]=${XPE2E_DIAG_LIMIT:-1500} [bench_table1_guest]=1800 [bench_table1_guest_spin]=1800 [bench_table1_debugger]=1800 [bench_table1_vmevent]=1800
  [stock_pv_safety]=600 [stock_pvh_safety_control]=600 [stock_pvh_vmevent_pti]=1500 [stock_pv_sweep]=900 [stock_kill9_rounds]=2400 [stock_pvh_kill9_rounds]=2400 [gdbsx_kill9_rounds]=2400)
# Two runs of the guest's extable-all phase, the second with some 600 probes armed.
SCEN_LIMIT[stock_pv_safety_extable_all]=900
# stock_pv_jump_image reads the whole kernel twice (the index without and with the image).
SCEN_LIMIT[stock_pv_jump_image]=1200
# stock_pv_jump_module: three probes' quiescences and the kernel's index (36 s under TCG) in one boot.
SCEN_LIMIT[stock_pv_jump_module]=900
# Debian 13 last (its payload is built in the trixie build root): every trixie_* twin but the
# benchmark's and trixie_kill9_jump (docs/e2e.md "Debian 13", "Timings").
SCEN_ORDER="stock_pv_baseline stock_pv_module_idle stock_pv_guest stock_pv_guest_churn stock_pv_guest_cr3 stock_debugger_refusal stock_kill9
  stock_pv_two_guests stock_pv_safety stock_pv_xenprobe stock_pv_xenprobe_async stock_pv_xenprobesd stock_pv_xenprobesd_service stock_pv_jump stock_pv_jump_island stock_pv_async stock_pv_spin stock_pv_sweep stock_pv_module_gone stock_pv_jump_module stock_pv_jump_image stock_pv_budget stock_pv_module_release stock_kill9_icall stock_kill9_island stock_pv_safety_extable_all gdbsx_pv_debugger gdbsx_kill9 stock_pvh_vmevent stock_pvh_kill9 stock_pvh_safety_control stock_pvh_vmevent_pti
  trixie_pv_guest trixie_debugger_refusal trixie_kill9 trixie_pv_safety trixie_pv_xenprobe trixie_pv_xenprobe_async trixie_pv_jump trixie_pv_jump_island trixie_pv_async trixie_pv_spin trixie_pv_module_gone trixie_kill9_icall trixie_pv_safety_extable_all trixie_pvh_vmevent trixie_pvh_kill9"
# Debian 13 (issue 17): trixie_* repeats a Debian 12 scenario (SCEN_BODY, the same script) on
# trixie's Dom0, DomUs and stock Xen 4.20 (no CONFIG_GDBSX there, so no gdbsx_* twin).
declare -A SCEN_PLATFORM=() SCEN_BODY=()
# kill -9 at random points, 20 rounds per channel in one boot (docs/reliability.md; not in the
# default list: ~10 min each).
for s in stock_kill9_rounds stock_pvh_kill9_rounds gdbsx_kill9_rounds; do SCEN_BODY[$s]=kill9_rounds; done
# trixie_bench_table1_guest: the benchmark's guest channel there (a diagnostic, never in a list).
for s in stock_pv_guest:stock-qemu10 stock_pvh_vmevent:stock-qemu10 stock_debugger_refusal:stock-qemu10 stock_kill9:stock-qemu10 \
  stock_pvh_kill9:stock-qemu10 stock_pv_safety:stock-qemu10 stock_pv_xenprobe:stock-qemu10 stock_pv_xenprobe_async:stock-qemu10 stock_pv_jump:stock-qemu10 stock_pv_async:stock-qemu10 stock_pv_spin:stock-qemu10 stock_kill9_jump:stock-qemu10 stock_pv_module_gone:stock-qemu10 stock_pv_sweep:stock-qemu10 bench_table1_guest:stock \
  stock_kill9_icall:stock-qemu10 stock_pv_safety_extable_all:stock-qemu10 stock_pv_jump_island:stock-qemu10 \
  stock_pv_jump_module:stock-qemu10; do
  t=trixie_${s%%:*}
  t=${t/trixie_stock_/trixie_}
  SCEN_PLATFORM[$t]=trixie
  SCEN_BODY[$t]=${s%%:*}
  SCEN_XEN[$t]=${s#*:}
  [ -z "${SCEN_LIMIT[${s%%:*}]:-}" ] || SCEN_LIMIT[$t]=${SCEN_LIMIT[${s%%:*}]}
done
# A short jump whose island is in the previous function's padding, past the probed function's
# __pfx_ symbol (6.2+ call padding): Debian 13 only, a script of its own; not in the default
# list yet.
SCEN_PLATFORM[trixie_pv_jump_island_prev]=trixie
SCEN_XEN[trixie_pv_jump_island_prev]=stock-qemu10
# Scenarios known to fail for a recorded reason (docs/e2e.md): reported as XFAIL, not failures.
declare -A SCEN_XFAIL=([stock_pvh_int3_intercept]="QEMU's TCG does not take a guest's int3 through the #BP intercept Xen sets")

usage() {
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
  echo "scenarios: $SCEN_ORDER"
  echo "Debian 13 (trixie_*; those in the default list are named above): ${!SCEN_PLATFORM[*]}"
}

SCENARIOS=""
ISOLATE=1
GROUP_MAX=6
for a in "$@"; do
  case "$a" in
    --list) echo "$SCEN_ORDER"; exit 0 ;;
    --list-bench) echo "$BENCH_SCENARIOS"; exit 0 ;;
    --group) ISOLATE=0 ;;
    --group=*)
      GROUP_MAX=${a#--group=}
      case "$GROUP_MAX" in ''|*[!0-9]*|0) echo "run.sh: --group=N needs a number N >= 1, not '$GROUP_MAX'" >&2; exit 2 ;; esac
      ISOLATE=0 ;;
    --isolate) ISOLATE=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) usage >&2; exit 2 ;;
    *)
      [ -n "${SCEN_XEN[$a]:-}" ] || { echo "run.sh: unknown scenario '$a' (known: $SCEN_ORDER)" >&2; exit 2; }
      # Results are kept per name: a scenario runs once per invocation.
      case " $SCENARIOS " in *" $a "*) echo "run.sh: '$a' given twice: running it once" >&2 ;; *) SCENARIOS="$SCENARIOS $a" ;; esac
      ;;
  esac
done
[ -n "$SCENARIOS" ] || SCENARIOS=$SCEN_ORDER
[ "$(id -u)" = 0 ] || { echo "run.sh: needs root (debootstrap, chroot, mkfs)" >&2; exit 2; }

mkdir -p "$E2E_CACHE/runs"
RUN_ID=$(date +%Y%m%d-%H%M%S)-$$
RUN_DIR=$E2E_CACHE/runs/$RUN_ID
mkdir -p "$RUN_DIR"
ln -sfn "$RUN_ID" "$E2E_CACHE/runs/latest"
# Keep the last 20 runs.
ls -1d "$E2E_CACHE"/runs/2* 2>/dev/null | head -n -20 | xargs -r rm -rf

# ---- cleanup: never leave a QEMU behind -------------------------------------------------
QEMU_PID=""
kill_qemu() {
  if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
    kill -TERM "$QEMU_PID" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      kill -0 "$QEMU_PID" 2>/dev/null || break
      sleep 0.5
    done
    kill -KILL "$QEMU_PID" 2>/dev/null
    wait "$QEMU_PID" 2>/dev/null
  fi
  QEMU_PID=""
}
on_exit() {
  kill_qemu
}
trap on_exit EXIT
trap 'e2e_log "interrupted"; exit 130' INT TERM HUP

# ---- stage: host packages ---------------------------------------------------------------
e2e_stage "host packages"
e2e_host_deps
e2e_stage_done

# ---- stage: images (cached) -------------------------------------------------------------
# The platforms the scenarios need (SCEN_PLATFORM; bookworm unless listed).
need_gdbsx=0 need_qemu_new=0 PLATFORMS=""
for s in $SCENARIOS; do
  [ "${SCEN_XEN[$s]}" = gdbsx ] && need_gdbsx=1 && need_qemu_new=1
  [ "${SCEN_XEN[$s]}" = stock-qemu10 ] && need_qemu_new=1
  p=${SCEN_PLATFORM[$s]:-bookworm}
  case " $PLATFORMS " in *" $p "*) ;; *) PLATFORMS="$PLATFORMS $p" ;; esac
done
# The GDBSX hypervisor and QEMU 10 are Debian 12's (bookworm pins), whatever the platform.
e2e_platform bookworm
[ $need_gdbsx = 1 ] && e2e_xen_gdbsx
[ $need_qemu_new = 1 ] && e2e_qemu_backports

# Per platform: its root file system and boot initrd, stock hypervisor and payload.
declare -A ROOTFS_OF=() INITRD_OF=() XEN_OF=() PAYLOAD_OF=()
# One build tree per source checkout (CMake refuses a build tree made for another source
# directory; CI builds a fresh clone every time, engineers their own checkouts).
SRC_KEY=$(printf '%s' "$E2E_SRC" | sha256sum | cut -c1-12)

# ---- stage: libxenprobes, tools and the e2e program (incremental CMake build) ------------
# build_payload_libs: sets STAGE (the staged /usr tree) for E2E_PLATFORM. Debian 12 builds on
# this host; Debian 13 in its build root (images.sh e2e_buildroot), against its own
# libxen-dev 4.20 and Capstone 5: libxenctrl users must be built for the Xen they run on.
build_payload_libs() {
  e2e_stage "build libxenprobes + tools + xpe2e-probe for $E2E_PLATFORM (CMake, prefix /usr)"
  # Through ccache when the host has it (tools/build-cache.sh; the Debian 13 build root
  # installs it and keeps its cache in $E2E_CACHE/ccache/trixie).
  CCACHE_BASEDIR=$E2E_CACHE/mnt
  . "$E2E_SRC/tools/build-cache.sh"
  local log=$RUN_DIR/build-$E2E_PLATFORM.log
  [ "$E2E_PLATFORM" = bookworm ] && log=$RUN_DIR/build.log
  if [ "$E2E_PLATFORM" = bookworm ]; then
    BUILD=$E2E_CACHE/build/$SRC_KEY
    STAGE=$BUILD/stage
    # Built with the source and build tree bound at fixed paths (in a mount namespace of its
    # own, as the build root does): ccache's hits need the same paths in every compilation,
    # and CI's clone is new at every run.
    local m=$E2E_CACHE/mnt
    mkdir -p "$BUILD" "$m/src" "$m/build"
    # A tree configured before these paths (CMake refuses another source directory): anew.
    if [ -e "$BUILD/lib/CMakeCache.txt" ] &&
      ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$m/src" "$BUILD/lib/CMakeCache.txt"; then
      rm -rf "$BUILD/lib" "$BUILD/prog"
    fi
    unshare --mount --propagation private sh -c 'mount --bind "$1" "$3/src" && mount -o remount,bind,ro "$3/src" &&
      mount --bind "$2" "$3/build" && exec env M="$3" L="$4" sh -c "$5"' sh "$E2E_SRC" "$BUILD" "$m" "$XP_CMAKE_LAUNCHER" '
      cmake -S $M/src -B $M/build/lib -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr $L \
        -DXENPROBES_BUILD_TESTS=OFF -DXENPROBES_BUILD_BENCHMARKS=OFF -DXENPROBES_BUILD_EXAMPLES=ON &&
        nice cmake --build $M/build/lib -j2 &&
        rm -rf $M/build/stage &&
        DESTDIR=$M/build/stage cmake --install $M/build/lib --strip &&
        cmake -S $M/src/tests/e2e -B $M/build/prog -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr $L \
          -DCMAKE_PREFIX_PATH=$M/build/stage/usr &&
        nice cmake --build $M/build/prog -j2 &&
        DESTDIR=$M/build/stage cmake --install $M/build/prog --strip' >"$log" 2>&1 || {
      tail -n 30 "$log" >&2
      e2e_die "build failed (log: $log)"
    }
  else
    BUILD=$E2E_CACHE/build/$SRC_KEY-$E2E_PLATFORM
    STAGE=$BUILD/stage
    # The same commands inside the build root: the source at /src, this tree at /build.
    e2e_in_buildroot "$E2E_SRC" "$BUILD" env -u CCACHE_STATSLOG CCACHE_DIR=/ccache CCACHE_BASEDIR=/src CCACHE_NOHASHDIR=true \
      CCACHE_MAXSIZE=2G L="$XP_CMAKE_LAUNCHER" sh -c '
      cmake -S /src -B /build/lib -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr $L \
        -DXENPROBES_BUILD_TESTS=OFF -DXENPROBES_BUILD_BENCHMARKS=OFF -DXENPROBES_BUILD_EXAMPLES=ON &&
        nice cmake --build /build/lib -j2 &&
        rm -rf /build/stage &&
        DESTDIR=/build/stage cmake --install /build/lib --strip &&
        cmake -S /src/tests/e2e -B /build/prog -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr $L \
          -DCMAKE_PREFIX_PATH=/build/stage/usr &&
        nice cmake --build /build/prog -j2 &&
        DESTDIR=/build/stage cmake --install /build/prog --strip' >"$log" 2>&1 || {
      tail -n 30 "$log" >&2
      e2e_die "build in the $E2E_PLATFORM build root failed (log: $log)"
    }
  fi
  e2e_stage_done "$(du -sh "$STAGE" | cut -f1) installed into $STAGE"
}

# ---- stage: the guest module, against the DomU kernel's headers (cached) ----------------
# build_module: sets MOD_DIR (holding src/xenprobes.ko) for E2E_PLATFORM's kernel (KVER).
build_module() {
  e2e_stage "guest module (xenprobes.ko for $KVER)"
  local hv
  if [ "$E2E_PLATFORM" = bookworm ]; then
    KDIR=/usr/src/linux-headers-$KVER
    [ -d "$KDIR" ] || e2e_die "no $KDIR (apt-get install linux-headers-$KVER)"
    hv=$(dpkg-query -W -f='${Version}' "linux-headers-$KVER")
  else
    KDIR=/usr/src/linux-headers-$KVER  # inside the build root
    hv=$(chroot "$BUILDROOT" dpkg-query -W -f='${Version}' "linux-headers-$KVER") ||
      e2e_die "the $E2E_PLATFORM build root has no linux-headers-$KVER"
  fi
  MOD_KEY=$(e2e_hash -s "$KVER $hv" "$E2E_SRC/guest-module" "$E2E_SRC/include/xenprobes/protocol.h")
  MOD_DIR=$E2E_CACHE/module/$MOD_KEY
  if [ -e "$MOD_DIR/ok" ]; then
    e2e_stage_done "cached: $MOD_DIR"
    return 0
  fi
  rm -rf "$MOD_DIR"
  mkdir -p "$MOD_DIR/src"
  cp "$E2E_SRC"/guest-module/* "$MOD_DIR/src/"
  local ok=1
  if [ "$E2E_PLATFORM" = bookworm ]; then
    nice make -C "$KDIR" M="$MOD_DIR/src" XENPROBES_INCLUDE="$E2E_SRC/include" modules >"$MOD_DIR/build.log" 2>&1 || ok=0
  else
    e2e_in_buildroot "$E2E_SRC" "$MOD_DIR" nice make -C "$KDIR" M=/build/src XENPROBES_INCLUDE=/src/include modules \
      >"$MOD_DIR/build.log" 2>&1 || ok=0
  fi
  if [ $ok = 0 ]; then
    tail -n 30 "$MOD_DIR/build.log" >&2
    e2e_die "module build failed (log: $MOD_DIR/build.log)"
  fi
  touch "$MOD_DIR/ok"
  e2e_stage_done "built: $MOD_DIR/src/xenprobes.ko"
}

# ---- stage: DomU initramfs and the run's payload ----------------------------------------
# The static DomU programs and busybox run on either platform's kernel: built once, from
# source every run (no cache). xpe2e-workload is workload.c and its workload_*.c (workload.h
# says which file holds what).
e2e_stage "DomU programs (static)"
DOMU_BIN=$RUN_DIR/domu-bin
mkdir -p "$DOMU_BIN"
gcc -static -O2 -Wall -Wextra -Werror -o "$DOMU_BIN/xpe2e-workload" "$E2E_TOOLS"/domu/workload*.c \
  >"$RUN_DIR/workload-build.log" 2>&1 || e2e_die "workload build failed (log: $RUN_DIR/workload-build.log)"
gcc -static -O2 -mgeneral-regs-only -Wall -Wextra -Werror -o "$DOMU_BIN/fpucheck" "$E2E_TOOLS/domu/fpucheck.c" \
  >>"$RUN_DIR/workload-build.log" 2>&1 || e2e_die "fpucheck build failed (log: $RUN_DIR/workload-build.log)"
e2e_stage_done

# build_payload: sets P (the payload directory: DomU initramfs and Dom0 overlay) from STAGE
# and MOD_DIR.
build_payload() {
  e2e_stage "DomU initramfs + Dom0 payload ($E2E_PLATFORM)"
  P=$RUN_DIR/payload
  [ "$E2E_PLATFORM" = bookworm ] || P=$RUN_DIR/payload-$E2E_PLATFORM
  rm -rf "$P"
  mkdir -p "$P/domu/bin" "$P/xpe2e/root/usr/lib/xenprobes-e2e/scenarios"
  cp "$DOMU_BIN/xpe2e-workload" "$DOMU_BIN/fpucheck" "$P/domu/bin/"
  cp /bin/busybox "$P/domu/bin/busybox"
  local app
  for app in $(busybox --list); do
    [ -e "$P/domu/bin/$app" ] || ln -s busybox "$P/domu/bin/$app"
  done
  mkdir -p "$P/domu/"{dev,proc,sys,tmp,sbin}
  cp "$E2E_TOOLS/domu/init" "$P/domu/init"
  chmod 755 "$P/domu/init"
  cp "$MOD_DIR/src/xenprobes.ko" "$P/domu/xenprobes.ko"
  # A module of the guest kernel's own for Dom0 to probe and the guest to unload
  # (stock_pv_module_gone): loop, which depends on no other module.
  local loop
  loop=$(find "$ROOTFS_DIR/tree/lib/modules/$KVER/kernel/drivers/block" -name 'loop.ko*' | head -n 1)
  case "$loop" in
    *.ko.xz) busybox unxz -c <"$loop" >"$P/domu/loop.ko" || e2e_die "cannot unpack $loop" ;;
    *.ko) cp "$loop" "$P/domu/loop.ko" ;;
    *) e2e_die "no loop.ko for $KVER in the Dom0 root file system" ;;
  esac
  R=$P/xpe2e/root
  cp -a "$STAGE/." "$R/"
  # The simulated Xen stays out of Dom0: libxenprobes.so loads libxenprobes-sim.so only for
  # XENPROBES_BACKEND=sim (docs/simulated-xen.md), which no scenario asks for, and the root file
  # system has no Unicorn for it. Its CMake targets file is optional (xenprobesConfig.cmake).
  find "$R" \( -name 'libxenprobes-sim.so*' -o -name 'xenprobes-simTargets*.cmake' \) -exec rm -f {} +
  (cd "$P/domu" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$R/usr/lib/xenprobes-e2e/domu-initramfs.cpio.gz"
  install -m 755 "$E2E_TOOLS/dom0/dom0-init" "$R/usr/lib/xenprobes-e2e/dom0-init"
  install -m 755 "$P/domu/bin/fpucheck" "$R/usr/lib/xenprobes-e2e/fpucheck"
  install -m 644 "$E2E_TOOLS"/scenarios/*.sh "$R/usr/lib/xenprobes-e2e/scenarios/"
  install -m 755 "$E2E_TOOLS/guardian-account.sh" "$R/usr/lib/xenprobes-e2e/guardian-account.sh"
  # The DomUs' kernel image for the scenarios that give it to a session (SCEN_VMLINUX): the ELF
  # inside /boot/vmlinuz-$KVER of the Dom0 root file system (the kernel every DomU boots), taken
  # out here, where xz-utils is (Debian's is xz with the x86 BCJ filter, which the Dom0's busybox
  # unxz does not decode), gzip'd for the Dom0 initrd (the scenario unpacks it with gzip); only
  # when such a scenario runs (65 MB unpacked).
  local s
  for s in $SCENARIOS; do
    [ -n "${SCEN_VMLINUX[$s]:-}" ] && [ "${SCEN_PLATFORM[$s]:-bookworm}" = "$E2E_PLATFORM" ] || continue
    sh "$E2E_SRC/tools/vmlinuz-payload.sh" "$ROOTFS_DIR/tree/boot/vmlinuz-$KVER" "$P/vmlinux-$KVER" ||
      e2e_die "cannot take the ELF out of $ROOTFS_DIR/tree/boot/vmlinuz-$KVER"
    gzip -1 -c "$P/vmlinux-$KVER" >"$R/usr/lib/xenprobes-e2e/vmlinux-$KVER.gz"
    rm -f "$P/vmlinux-$KVER"
    break
  done
  # Every shared library a staged program or library needs (libxenprobes.so, the tools,
  # xenprobes-guardian, the test programs) is in the Dom0 root file system or staged with it: a
  # missing one fails here, not as "cannot open shared object file" inside a boot.
  local have=$RUN_DIR/libs-$E2E_PLATFORM.txt f lib miss=""
  find "$ROOTFS_DIR/tree/usr/lib" "$R/usr/lib" -name '*.so*' -printf '%f\n' 2>/dev/null | sort -u >"$have"
  for f in $(find "$R" -type f | LC_ALL=C sort); do
    [ "$(head -c 4 "$f" | tr -d '\177')" = ELF ] || continue
    for lib in $(readelf -d "$f" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
      grep -qxF "$lib" "$have" || miss="$miss ${f#"$R"}:$lib"
    done
  done
  [ -z "$miss" ] || e2e_die "the Dom0 root file system lacks what the payload needs:$miss (add the packages to E2E_ROOTFS_PKGS, tools/e2e/lib.sh)"
  e2e_stage_done
}

for plat in $PLATFORMS; do
  e2e_platform "$plat"
  [ "$plat" = bookworm ] || e2e_buildroot
  e2e_rootfs
  KVER=$(cat "$ROOTFS_DIR/kver")
  e2e_xen_stock
  build_payload_libs
  build_module
  build_payload
  ROOTFS_OF[$plat]=$ROOTFS_DIR INITRD_OF[$plat]=$DOM0_INITRD XEN_OF[$plat]=$XEN_STOCK PAYLOAD_OF[$plat]=$P
done
e2e_platform bookworm

# ---- boot QEMU: one boot per group of scenarios on the same hypervisor -----------------
# boot <group name> <scenario...>: runs the scenarios in one boot; sets RESULT[s] and
# REASON[s] for each.
declare -A RESULT=() REASON=() LOGOF=()
boot() {
  local g=$1
  shift
  local scen="$*" s0=$1 xen serial initrd t_start status lines=0 limit qemu_bin=qemu-system-x86_64 qemu_extra=()
  # The platform's own Dom0 (root file system, kernel, boot initrd), stock hypervisor and payload.
  local plat=${SCEN_PLATFORM[$s0]:-bookworm}
  local ROOTFS_DIR=${ROOTFS_OF[$plat]} DOM0_INITRD=${INITRD_OF[$plat]} XEN_STOCK=${XEN_OF[$plat]} P=${PAYLOAD_OF[$plat]}
  case "${SCEN_XEN[$s0]}" in
    stock) xen=$XEN_STOCK ;;
    gdbsx)
      # The debugger channel's ICEBP needs QEMU >= 9.1 under TCG (docs/e2e.md).
      xen=$XEN_GDBSX
      qemu_bin=$QEMU_NEW
      qemu_extra=(-L "$QEMU_NEW_SHARE")
      ;;
    stock-qemu10)
      # The stock hypervisor, under a QEMU that runs ICEBP (the vm_event channel's trap).
      xen=$XEN_STOCK
      qemu_bin=$QEMU_NEW
      qemu_extra=(-L "$QEMU_NEW_SHARE")
      ;;
    *) for s in $scen; do RESULT[$s]=FAIL; REASON[$s]="no hypervisor '${SCEN_XEN[$s0]}'"; done; return ;;
  esac
  local d=$RUN_DIR/$g
  mkdir -p "$d/payload-conf/xpe2e/root/usr/lib/xenprobes-e2e"
  # XPE2E_PROBE_EXTRA: extra xpe2e-probe options for debugging, e.g. "--skip xrp".
  # Boot and toolstack take ~1-2 min under TCG on a loaded host; each scenario up to ~6 min
  # (SCEN_LIMIT: longer).
  local per=0 sum=0
  for s in $scen; do
    per=${SCEN_LIMIT[$s]:-420}
    sum=$((sum + per))
  done
  limit=${XENPROBES_E2E_BOOT_TIMEOUT:-$((240 + sum))}
  # XPE2E_PROBE_EXTRA: extra xpe2e-probe options for debugging, e.g. "--skip xrp".
  # XPE2E_BENCH_*: the benchmark's configs and sizes (tools/bench/table1.sh).
  # BOOT_LIMIT: dom0-init ends a scenario still running near it, after dumping diagnostics
  # of its DomUs (scenarios/lib.sh domu_diag), so that the serial log says where they stood.
  printf 'SCENARIOS="%s"\nSCENARIO_TIMEOUT=%s\nBOOT_LIMIT=%s\nPROBE_EXTRA="%s"\nXL_CREATE_FLAGS="%s"\n' "$scen" $((sum > 900 ? sum : 900)) \
    "$limit" "${XPE2E_PROBE_EXTRA:-}" "${XPE2E_XL_CREATE_FLAGS:-}" \
    >"$d/payload-conf/xpe2e/root/usr/lib/xenprobes-e2e/run.conf"
  printf 'BENCH_CONFIGS="%s"\nBENCH_SPIN_CONFIGS="%s"\nBENCH_ROUND="%s"\nBENCH_ROUNDS="%s"\nBENCH_UNTAR="%s"\n' \
    "${XPE2E_BENCH_CONFIGS:-native,kprobe,kretprobe,xp,xrp}" "${XPE2E_BENCH_SPIN_CONFIGS:-native,xp,jump}" \
    "${XPE2E_BENCH_ROUND:-1}" "${XPE2E_BENCH_ROUNDS:-3}" \
    "${XPE2E_BENCH_UNTAR:-3}" >>"$d/payload-conf/xpe2e/root/usr/lib/xenprobes-e2e/run.conf"
  # XPE2E_DIAG_*: diag_env_procs (docs/e2e.md "The environment").
  # XPE2E_DIAG_MODULE, XPE2E_DIAG_TOGGLES: diag_tracepoint_toggle (docs/e2e.md "The environment").
  printf 'DIAG_TYPE="%s"\nDIAG_N="%s"\nDIAG_ROUNDS="%s"\nDIAG_FPU="%s"\nDIAG_MODULE="%s"\nDIAG_TOGGLES="%s"\n' "${XPE2E_DIAG_TYPE:-pv}" "${XPE2E_DIAG_N:-6}" \
    "${XPE2E_DIAG_ROUNDS:-10}" "${XPE2E_DIAG_FPU:-}" "${XPE2E_DIAG_MODULE:-0}" "${XPE2E_DIAG_TOGGLES:-200}" \
    >>"$d/payload-conf/xpe2e/root/usr/lib/xenprobes-e2e/run.conf"
  # XPE2E_KILL_ROUNDS, XPE2E_KILL_SEED, XPE2E_KILL_AT: the *_kill9_rounds scenarios
  # (scenarios/kill9_rounds.sh).
  printf 'KILL_ROUNDS="%s"\nKILL_SEED="%s"\nKILL_AT="%s"\n' "${XPE2E_KILL_ROUNDS:-20}" "${XPE2E_KILL_SEED:-}" "${XPE2E_KILL_AT:-}" \
    >>"$d/payload-conf/xpe2e/root/usr/lib/xenprobes-e2e/run.conf"
  # A platform's scenario (trixie_*) runs the body of the Debian 12 one it repeats
  # (SCEN_BODY): dom0-init reads BODY_<scenario>.
  for s in $scen; do
    [ -z "${SCEN_BODY[$s]:-}" ] || printf 'BODY_%s=%s\n' "$s" "${SCEN_BODY[$s]}"
  done >>"$d/payload-conf/xpe2e/root/usr/lib/xenprobes-e2e/run.conf"
  # Each scenario's own limit (dom0-init ends one still running 100 s past it): a scenario that
  # hangs costs its own limit, not the boot's.
  for s in $scen; do
    printf 'LIMIT_%s=%s\n' "$s" "${SCEN_LIMIT[$s]:-420}"
  done >>"$d/payload-conf/xpe2e/root/usr/lib/xenprobes-e2e/run.conf"
  for s in $scen; do
    [ -z "${SCEN_SYSTEMD[$s]:-}" ] || { echo "DOM0_SYSTEMD=1"; break; }
  done >>"$d/payload-conf/xpe2e/root/usr/lib/xenprobes-e2e/run.conf"
  (cd "$P" && find xpe2e | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$d/payload.cpio.gz"
  (cd "$d/payload-conf" && find xpe2e | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$d/conf.cpio.gz"
  initrd=$d/dom0-initrd.cpio.gz
  cat "$DOM0_INITRD" "$d/payload.cpio.gz" "$d/conf.cpio.gz" >"$initrd"
  serial=$d/serial.log
  : >"$serial"
  # spec-ctrl=eager-fpu: Xen 4.17 switches FPU state lazily on AMD (QEMU's TCG "max" CPU is
  # AMD): it sets CR0.TS and restores a vCPU's registers on its first #NM. QEMU's TCG raises
  # no #NM for XSAVE/XSAVEOPT/XRSTOR with CR0.TS set, so a guest kernel saving a task's state
  # right after its vCPU was scheduled back saves another vCPU's registers: user processes
  # (DomU and Dom0: busybox at ip 4a4d02/433f4b, xl's heap) then run with someone else's
  # SSE/AVX registers. Eager switching never sets CR0.TS (docs/e2e.md "The environment").
  # XENPROBES_E2E_XEN_EXTRA is appended (later options win: spec-ctrl=eager-fpu=0 brings
  # the fault back, for a reproduction).
  local xen_args="console=com1 com1=115200,8n1 dom0_mem=1024M,max:1024M dom0_max_vcpus=2 smap=0 smep=0 loglvl=all guest_loglvl=all spec-ctrl=eager-fpu${XENPROBES_E2E_XEN_EXTRA:+ $XENPROBES_E2E_XEN_EXTRA}"
  local dom0_args="console=hvc0 earlyprintk=xen loglevel=5"
  local qemu=("$qemu_bin" "${qemu_extra[@]}" -accel "$E2E_QEMU_ACCEL" -cpu "$E2E_QEMU_CPU" -machine pc -nodefaults -m "$E2E_QEMU_MEM" -smp 2
    -display none -no-reboot -monitor none -serial "file:$serial"
    -kernel "$xen" -append "$xen_args"
    -initrd "$ROOTFS_DIR/vmlinuz $dom0_args,$initrd"
    -drive "file=$ROOTFS_DIR/rootfs.ext4,if=virtio,format=raw,cache=unsafe,snapshot=on")
  printf '%q ' "${qemu[@]}" >"$d/qemu.cmd"
  echo >>"$d/qemu.cmd"
  e2e_log "boot: [$scen] on $plat's ${SCEN_XEN[$s0]} hypervisor (serial log: $serial; limit ${limit}s)"
  t_start=$(date +%s)
  "${qemu[@]}" >"$d/qemu.out" 2>&1 </dev/null &
  QEMU_PID=$!
  status=""
  # Dom0's liveness: dom0-init prints a line starting XPE2E- at least once a minute while
  # scenarios run (its XPE2E-ALIVE heartbeat). A boot whose serial log has had none for
  # XENPROBES_E2E_SILENCE seconds (default 300) has a hung Dom0 or Xen: QEMU is killed then,
  # not at the boot's limit (which, for a group, can be most of an hour).
  local last_alive silence=${XENPROBES_E2E_SILENCE:-300}
  last_alive=$(date +%s)
  while :; do
    # Progress: the XPE2E-STAGE markers and the check lines, as they appear.
    local total
    total=$(wc -l <"$serial")
    if [ "$total" -gt "$lines" ]; then
      local new
      new=$(sed -n "$((lines + 1)),${total}p" "$serial" | tr -d '\r' | grep -a '^XPE2E-')
      if [ -n "$new" ]; then
        last_alive=$(date +%s)
        printf '%s\n' "$new" | grep -aE '^XPE2E-(STAGE|CHECK|RESULT|PROG|KILL|BENCH|DIAG|FPU)' |
          while IFS= read -r line; do e2e_log "  ${line#XPE2E-}"; done
      fi
      lines=$total
    fi
    if [ $(($(date +%s) - last_alive)) -ge "$silence" ]; then
      status="Dom0 silent for ${silence}s (no XPE2E- line, not even its heartbeat): QEMU killed"
      kill_qemu
      break
    fi
    if ! kill -0 "$QEMU_PID" 2>/dev/null; then
      wait "$QEMU_PID"
      status="qemu exited ($?)"
      QEMU_PID=""
      break
    fi
    if [ $(($(date +%s) - t_start)) -ge "$limit" ]; then
      status="timeout after ${limit}s: QEMU killed"
      kill_qemu
      break
    fi
    sleep 1
  done
  e2e_log "boot: finished in $(($(date +%s) - t_start))s ($status)"
  local boot_fail res panic=""
  boot_fail=$(tr -d '\r' <"$serial" | grep -a "^XPE2E-RESULT \(boot\|dom0\) " | head -n 1)
  if grep -aq "Panic on CPU\|Kernel panic" "$serial"; then
    panic="; panic: $(grep -a -m1 -A2 'Panic on CPU\|Kernel panic' "$serial" | tr -d '\r' | tr '\n' ' ')"
  fi
  for s in $scen; do
    LOGOF[$s]=$serial
    res=$(tr -d '\r' <"$serial" | grep -a "^XPE2E-RESULT $s " | tail -n 1)
    if [ -n "$res" ]; then
      RESULT[$s]=$(echo "$res" | awk '{print $3}')
      REASON[$s]=$(echo "$res" | cut -d' ' -f4-)
    elif [ -n "$boot_fail" ]; then
      RESULT[$s]=FAIL
      REASON[$s]="${boot_fail#XPE2E-RESULT }"
    else
      RESULT[$s]=FAIL
      REASON[$s]="no result in the serial log ($status)$panic"
    fi
  done
}

e2e_stage "scenarios:$SCENARIOS"
# Groups (--group): up to GROUP_MAX consecutive scenarios on the same platform and hypervisor
# share a boot; otherwise a boot each. The cap bounds what one Dom0-level fault can take down.
groups=()
cur="" curxen="" curn=0
for s in $SCENARIOS; do
  if [ "$ISOLATE" = 1 ] || [ "${SCEN_PLATFORM[$s]:-bookworm}-${SCEN_XEN[$s]}" != "$curxen" ] ||
    [ "$curn" -ge "$GROUP_MAX" ] ||
    [ -n "${SCEN_ALONE[$s]:-}" ] || { [ -n "$cur" ] && [ -n "${SCEN_ALONE[${cur##* }]:-}" ]; }; then
    [ -n "$cur" ] && groups+=("$cur")
    cur=$s
    curn=1
    curxen=${SCEN_PLATFORM[$s]:-bookworm}-${SCEN_XEN[$s]}
  else
    cur="$cur $s"
    curn=$((curn + 1))
  fi
done
[ -n "$cur" ] && groups+=("$cur")
n=0
for grp in "${groups[@]}"; do
  n=$((n + 1))
  # shellcheck disable=SC2086
  boot "boot$n-${SCEN_PLATFORM[${grp%% *}]:-bookworm}-${SCEN_XEN[${grp%% *}]}" $grp
done

failed=0
summary=""
for s in $SCENARIOS; do
  r=${RESULT[$s]}
  if [ "$r" = FAIL ] && [ -n "${SCEN_XFAIL[$s]:-}" ]; then
    r=XFAIL
    REASON[$s]="${REASON[$s]} (expected: ${SCEN_XFAIL[$s]})"
  fi
  # Only PASS (and a failure recorded in SCEN_XFAIL) passes: a SKIP asserted nothing.
  case "$r" in
    PASS|XFAIL) ;;
    *) failed=$((failed + 1)) ;;
  esac
  summary="$summary$(printf '  %-24s %-5s %s' "$s" "$r" "${REASON[$s]}")"$'\n'
  if [ "$r" != PASS ]; then
    e2e_log "$s: $r: ${REASON[$s]}"
    e2e_log "  log: ${LOGOF[$s]} (its lines: grep -a XPE2E- ${LOGOF[$s]})"
  fi
done
e2e_stage_done
printf '%s' "$summary" >"$RUN_DIR/summary.txt"
e2e_log "results (run directory $RUN_DIR):"
printf '%s' "$summary" >&2
if [ $failed -gt 0 ]; then
  e2e_log "FAILED: $failed scenario(s); logs in $RUN_DIR"
  exit 1
fi
e2e_log "all scenarios passed in $(e2e_elapsed)s"
exit 0
}
