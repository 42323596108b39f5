#!/bin/sh
# clang-tidy (Debian 12's clang-tidy-19; 14 cannot read the library's C++23) over every
# translation unit of the shipped code -- the library, xenprobe, xenprobesd -- with the checks
# .clang-tidy names; any warning fails the run. The test command (tools/run-tests.sh) runs it on
# its -Werror build.
#
#   sh tools/check-tidy.sh [BUILD_DIR]      default: build
#
# BUILD_DIR must be built (the compilers' dependency files say which headers each unit read) and
# configured with CMAKE_EXPORT_COMPILE_COMMANDS (the top CMakeLists.txt turns it on). clang-tidy
# takes seconds per unit, so a unit found clean is remembered: its key is the hash of its source,
# every header it read, its compile flags (paths of the clone and the build left out, so a clean
# clone elsewhere finds them), .clang-tidy and the clang-tidy version, kept in
# $XENPROBES_TIDY_CACHE (default /var/cache/xenprobes-tidy as root, else ~/.cache/xenprobes-tidy).
# Only a unit whose key is new runs again.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
build=${1:-build}
jobs=$(nproc)

command -v clang-tidy-19 >/dev/null || {
  echo "check-tidy: clang-tidy-19 not found: install Debian's clang-tidy-19 (tools/install-deps.sh does)" >&2
  exit 1
}
[ -f "$build/compile_commands.json" ] || {
  echo "check-tidy: $build/compile_commands.json missing: configure and build $build first (cmake -S . -B $build; cmake --build $build)" >&2
  exit 1
}
if [ "$(id -u)" = 0 ]; then cache_default=/var/cache/xenprobes-tidy; else cache_default="$HOME/.cache/xenprobes-tidy"; fi
cache=${XENPROBES_TIDY_CACHE:-$cache_default}
mkdir -p "$cache"

# The build is gcc's, with its -Werror: clang's own compiler warnings are not this check's
# business, and two of them fire on code gcc accepts: gcc's `noipa` attribute is unknown to
# clang, and libstdc++ 12's stable_sort calls get_temporary_buffer, which C++23 deprecates
# (clang warns inside the system header). The checks of .clang-tidy are unaffected.
export XP_TIDY_ARGS="--extra-arg=-Wno-unknown-attributes --extra-arg=-Wno-deprecated-declarations"
# What every key starts with: the checks, the arguments and the tool.
salt=$({ cat .clang-tidy; echo "$XP_TIDY_ARGS"; clang-tidy-19 --version; } | sha256sum | cut -d' ' -f1)

abs_build=$(realpath "$build")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One line per unit: source (absolute) and key. A dependency file lists the object, then the
# source, then every header, with paths relative to the directory the compiler ran in (the
# target's binary directory, two levels above the file).
find "$build" -name '*.o.d' -path '*/CMakeFiles/*' | sort | while IFS= read -r dep; do
  objdir=$(dirname "$dep")              # .../CMakeFiles/<target>.dir[/sub]
  tdir=${objdir%%/CMakeFiles/*}/CMakeFiles/${objdir#*/CMakeFiles/}
  tdir=${tdir%%.dir/*}.dir
  cwd=${tdir%/CMakeFiles/*}
  files=$(sed -e 's/\\$//' -e 's/^[^ ]*:[ ]*//' "$dep" | tr ' ' '\n' | sed '/^$/d')
  src=$(echo "$files" | head -n 1)
  case "$src" in /*) ;; *) src="$cwd/$src" ;; esac
  src=$(realpath -m "$src")
  case "$src" in
    "$root"/libxenprobes/*.cpp | "$root"/xenprobe/*.cpp | "$root"/xenprobesd/*.cpp) ;;
    *) continue ;;
  esac
  # Paths out of the key: a clone elsewhere, or another build directory, finds the same units.
  key=$({ echo "$salt ${src#"$root"/}"; sed -e "s|$abs_build|@BUILD@|g" -e "s|$root|@ROOT@|g" "$tdir/flags.make" 2>/dev/null
          echo "$files" | while IFS= read -r f; do
            case "$f" in /*) ;; *) f="$cwd/$f" ;; esac
            cat "$f"
          done; } | sha256sum | cut -d' ' -f1)
  echo "$src $key"
done | sort -u -k1,1 >"$work/units"

total=$(wc -l <"$work/units")
[ "$total" -gt 0 ] || { echo "check-tidy: no unit of libxenprobes/, xenprobe/ or xenprobesd/ in $build: build it first" >&2; exit 1; }
awk -v c="$cache" '{ if (system("test -e " c "/" $2) != 0) print }' "$work/units" >"$work/todo"
todo=$(wc -l <"$work/todo")
echo "check-tidy: $total units, $((total - todo)) clean before with the same inputs, $todo to check ($jobs at a time)"

# Each unit: clean ones go into the cache; the output of the others stays in $work/out.<n>.
export XP_TIDY_WORK="$work" XP_TIDY_BUILD="$build" XP_TIDY_CACHE="$cache"
awk '{ print NR, $1, $2 }' "$work/todo" | xargs -r -P "$jobs" -L 1 sh -c '
  out="$XP_TIDY_WORK/out.$1"
  if clang-tidy-19 -p "$XP_TIDY_BUILD" --quiet $XP_TIDY_ARGS "$2" >"$out" 2>"$out.err" &&
     ! grep -q "warning:\|error:" "$out"; then
    : >"$XP_TIDY_CACHE/$3"
    rm -f "$out" "$out.err"
  else
    echo "check-tidy: $2: NOT clean" >&2
  fi' check-tidy || true

failed=$(find "$work" -name 'out.*' ! -name '*.err' | sort)
if [ -n "$failed" ]; then
  # Each warning once (a header's warning shows in every unit that reads it).
  for f in $failed; do grep -h "warning:\|error:" "$f" || cat "$f.err"; done | sort -u >&2
  echo "check-tidy: FAILED: $(echo "$failed" | wc -l) of $total units have warnings (above); fix them, or where a check is wrong for one line, say why in a NOLINT(check) comment" >&2
  exit 1
fi
echo "check-tidy: $total units of libxenprobes/, xenprobe/ and xenprobesd/ clean under .clang-tidy"
