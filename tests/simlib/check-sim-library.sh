#!/bin/sh
# The simulated Xen through libxenprobes.so, which loads libxenprobes-sim.so only when asked
# for (docs/simulated-xen.md, "A library of its own"). One case per run:
#
#   check-sim-library.sh sim       <xp-sim-open>               opens; Unicorn mapped only after
#   check-sim-library.sh xen       <xp-sim-open>               the real Xen: Unicorn never mapped
#   check-sim-library.sh missing   <xp-sim-open> <libxenprobes.so>
#                                  libxenprobes.so alone in a folder: a clear error
#   check-sim-library.sh mismatch  <xp-sim-open> <module>      another build's library: refused
#   check-sim-library.sh named     <xp-sim-open>               XENPROBES_SIM_LIBRARY names no file
#   check-sim-library.sh xenprobe  <xenprobe>                  `xenprobe --sim` says why it cannot
#   check-sim-library.sh xenprobesd <xenprobesd>               `xenprobesd --sim` too
#   check-sim-library.sh installed <xp-sim-open> <cmake> <build dir>
#                                  cmake --install into a scratch DESTDIR: the installed pair
#                                  (their exports, Unicorn's place, the .pc and CMake files)
set -u
case_=$1
prog=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
bad() {
  echo "check-sim-library ($case_): $*" >&2
  status=1
}
has() {  # has <file> <fixed string>
  grep -qF -- "$2" "$1" || bad "$(basename "$1") lacks \"$2\""
}
run() {  # run <expected exit status> env...: runs $prog, output in $tmp/out and $tmp/err
  want=$1
  shift
  env -u XENPROBES_SIM_LIBRARY "$@" "$prog" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  echo "-- exit $rc; stdout:"; cat "$tmp/out"; echo "-- stderr:"; cat "$tmp/err"
  [ "$rc" = "$want" ] || bad "exit status $rc, expected $want"
}
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*Shared library: \[\(.*\)\]/\1/p'; }

case $case_ in
  sim)
    run 0 XENPROBES_BACKEND=sim
    has "$tmp/out" "before open: libxenprobes "
    grep -q '^before open: .*unicorn no, libxenprobes-sim no$' "$tmp/out" || bad "something was mapped before the open"
    grep -q '^after open: .*unicorn /.*libunicorn.*, libxenprobes-sim /.*libxenprobes-sim\.so' "$tmp/out" ||
      bad "after the open, Unicorn and libxenprobes-sim should be mapped"
    has "$tmp/err" "XENPROBES_BACKEND=sim: the SIMULATED Xen"
    ;;
  xen)
    # Opens on a Dom0, fails elsewhere: either way nothing of the simulation is loaded.
    env -u XENPROBES_SIM_LIBRARY XENPROBES_BACKEND=xen "$prog" >"$tmp/out" 2>"$tmp/err"
    echo "-- exit $?; stdout:"; cat "$tmp/out"; echo "-- stderr:"; cat "$tmp/err"
    grep -q '^after open: .*unicorn no, libxenprobes-sim no$' "$tmp/out" || bad "the real Xen's open mapped the simulation"
    ;;
  missing)
    lib=$3
    soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
    cp "$lib" "$tmp/$soname"
    run 1 LD_LIBRARY_PATH="$tmp" XENPROBES_BACKEND=sim
    has "$tmp/out" "after open: libxenprobes $tmp/$soname, unicorn no, libxenprobes-sim no"
    has "$tmp/err" "the simulated Xen is not installed: libxenprobes-sim.so."
    has "$tmp/err" "is neither beside libxenprobes ($tmp) nor on the library search path"
    has "$tmp/err" "cmake --install"
    has "$tmp/err" "(errno EOPNOTSUPP)"
    ;;
  mismatch)
    other=$3
    run 1 XENPROBES_BACKEND=sim XENPROBES_SIM_LIBRARY="$other"
    has "$tmp/err" "libxenprobes-sim 0.0.0 (build 0000000000000000, $other) does not match libxenprobes "
    has "$tmp/err" "install the two from one build"
    grep -q '^after open: .*libxenprobes-sim no$' "$tmp/out" || bad "the refused library is still mapped"
    ;;
  named)
    run 1 XENPROBES_BACKEND=sim XENPROBES_SIM_LIBRARY="$tmp/nowhere/libxenprobes-sim.so"
    has "$tmp/err" "XENPROBES_SIM_LIBRARY=$tmp/nowhere/libxenprobes-sim.so: no such file"
    ;;
  xenprobe)
    env XENPROBES_SIM_LIBRARY="$tmp/nowhere.so" "$prog" --sim -e 'kprobe:sys_read { @n = count(); }' \
      >"$tmp/out" 2>"$tmp/err"
    rc=$?
    echo "-- exit $rc; stderr:"; cat "$tmp/err"
    [ "$rc" != 0 ] || bad "xenprobe --sim ran without its simulation"
    has "$tmp/err" "--sim: XENPROBES_SIM_LIBRARY=$tmp/nowhere.so: no such file"
    ;;
  xenprobesd)
    printf '[daemon]\nevent_log = "-"\nmetrics_listen = "127.0.0.1:0"\n\n[[program]]\nname = "n"\n%s\n%s\n' \
      "source = 'kprobe:sys_getppid { @n = count(); }'" 'domains = [{ glob = "sim-*" }]' >"$tmp/c.toml"
    env XENPROBES_SIM_LIBRARY="$tmp/nowhere.so" "$prog" --config "$tmp/c.toml" --sim --sim-guests 1 \
      >"$tmp/out" 2>"$tmp/err"
    rc=$?
    echo "-- exit $rc; stderr:"; cat "$tmp/err"
    [ "$rc" != 0 ] || bad "xenprobesd --sim ran without its simulation"
    has "$tmp/err" "xenprobesd: XENPROBES_SIM_LIBRARY=$tmp/nowhere.so: no such file"
    ;;
  installed)
    cmake=$3
    build=$4
    DESTDIR="$tmp/stage" "$cmake" --install "$build" >"$tmp/install.log" 2>&1 || {
      cat "$tmp/install.log"
      bad "cmake --install failed"
      exit 1
    }
    lib=$(find "$tmp/stage" -name 'libxenprobes.so.*.*.*' | head -n 1)
    [ -n "$lib" ] || { bad "no libxenprobes.so installed"; exit 1; }
    libdir=$(dirname "$lib")
    soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
    sim=$libdir/libxenprobes-sim.so.${soname#libxenprobes.so.}
    echo "installed: $lib ($soname), $sim"
    [ -f "$sim" ] || bad "$sim is not installed beside $lib"
    if needed "$lib" | grep -q unicorn; then bad "the installed $lib needs Unicorn"; fi
    # The installed files export exactly their lists (tests/abi/check-abi.sh), as the built ones.
    src=$(cd "$(dirname "$0")/../.." && pwd)
    sh "$src/tests/abi/check-abi.sh" "$lib" "$src/libxenprobes/xenprobes.abi" || bad "the installed $lib's exports"
    [ ! -f "$sim" ] || sh "$src/tests/abi/check-abi.sh" "$sim" "$src/libxenprobes/xenprobes-sim.abi" ||
      bad "the installed $sim's exports"
    needed "$sim" | grep -q unicorn || bad "the installed $sim does not need Unicorn"
    pc=$(find "$tmp/stage" -name xenprobes.pc | head -n 1)
    has "$pc" "simlibrary=\${libdir}/$(basename "$sim")"
    for f in xenprobesConfig.cmake xenprobesTargets.cmake xenprobes-simTargets.cmake; do
      [ -n "$(find "$tmp/stage" -name "$f")" ] || bad "no $f installed"
    done
    # Every installed program: nothing of Unicorn among what the dynamic linker loads for it.
    for p in $(find "$tmp/stage" -type f -perm -u+x ! -name 'libxenprobes-sim*'); do
      LD_LIBRARY_PATH=$libdir ldd "$p" >"$tmp/ldd" 2>&1 || continue  # not a dynamic ELF
      if grep -q unicorn "$tmp/ldd"; then bad "$p loads Unicorn:"; cat "$tmp/ldd" >&2; fi
      echo "ldd $(basename "$p"): no Unicorn"
    done
    # The installed libxenprobes.so finds the installed simulation beside itself.
    run 0 LD_LIBRARY_PATH="$libdir" XENPROBES_BACKEND=sim
    grep -q "^after open: libxenprobes $libdir/.*, libxenprobes-sim $sim\$" "$tmp/out" ||
      bad "the installed libxenprobes did not load $sim"
    ;;
  *)
    echo "check-sim-library: unknown case $case_" >&2
    exit 2
    ;;
esac
[ "$status" = 0 ] && echo "check-sim-library ($case_): ok"
exit "$status"
