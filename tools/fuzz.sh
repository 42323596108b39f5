#!/bin/sh
# Fuzzes every input a guest or a file controls (tests/fuzz/, docs/reliability.md) with
# libFuzzer under ASan + UBSan:
#
#   tools/fuzz.sh [seconds-per-target] [target...]     (default: 20 s, every target)
#
# Configures a clang build in build-fuzz (-DXENPROBES_FUZZ=ON: every library layer instrumented),
# builds the targets, then runs them one after the other, each for the given time, starting from
# its seeds and regression inputs (tests/fuzz/corpus/<target>, replayed first) plus what earlier
# runs found (build-fuzz/corpus/<target>). Per target it prints the executions, the coverage
# (libFuzzer's final cov/ft) and the crashes. A crash (or leak, timeout, out-of-memory) stops
# that target, keeps the input in build-fuzz/crashes/<target>/ and makes the script exit 1 once
# every target has run; reproduce with build-fuzz/fuzz/fuzz_<target> <file>. The 30 s per-input
# timeout is wall-clock time: a fuzzer stopped from outside (SIGSTOP, a frozen VM) for longer
# reports a timeout whose input then runs in milliseconds; rerun the target to tell.
#
# Needs Debian 12's clang-14 and libclang-rt-14-dev (libFuzzer and the sanitizer runtimes) on
# top of tools/install-deps.sh. XENPROBES_FUZZ_NICE=<n> runs the fuzzers under nice -n <n>;
# XENPROBES_FUZZ_JOBS=<n> sets the build's parallelism (default: nproc).
set -eu
cd "$(dirname "$0")/.."

all="module_info guest_channel vmevent walker x86 journal symbols elf_image kernel_tables kallsyms ring orc xenprobe_btf"
secs=20
case "${1:-}" in
  ''|*[!0-9]*) ;;
  *) secs=$1; shift ;;
esac
targets="${*:-$all}"
for t in $targets; do
  case " $all " in
    *" $t "*) ;;
    *) echo "fuzz: unknown target '$t' (targets: $all)" >&2; exit 2 ;;
  esac
done

for tool in clang-14 clang++-14; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fuzz: $tool not found: apt-get install clang-14 libclang-rt-14-dev" >&2
    exit 2
  fi
done
if ! clang-14 -print-file-name=libclang_rt.fuzzer-x86_64.a | grep -q /; then
  echo "fuzz: clang-14 has no libFuzzer runtime: apt-get install libclang-rt-14-dev" >&2
  exit 2
fi

dir=build-fuzz
jobs="${XENPROBES_FUZZ_JOBS:-$(nproc)}"
. tools/build-cache.sh
echo "== fuzz: configuring $dir (clang-14, -fsanitize=fuzzer,address,undefined)"
mkdir -p "$dir"
# shellcheck disable=SC2086
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo $XP_CMAKE_LAUNCHER -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DXENPROBES_FUZZ=ON -DXENPROBES_BUILD_TESTS=OFF -DXENPROBES_BUILD_EXAMPLES=OFF -DXENPROBES_BUILD_BENCHMARKS=OFF \
  >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log" >&2; exit 1; }
echo "== fuzz: building"
exes=""
for t in $targets; do exes="$exes fuzz_$t"; done
# shellcheck disable=SC2086
cmake --build "$dir" -j"$jobs" --target $exes

# Inputs larger than libFuzzer's default 4096 bytes: journal images, symbol maps, kernel tables, rings,
# kallsyms tables (over 256 symbols needs more than one marker).
max_len() {
  case "$1" in
    journal) echo 12288 ;;
    symbols) echo 16384 ;;
    kernel_tables) echo 16384 ;;
    kallsyms) echo 65536 ;;
    ring) echo 16384 ;;
    *) echo 4096 ;;
  esac
}

failed=""
summary=""
for t in $targets; do
  work="$dir/corpus/$t"
  crashes="$dir/crashes/$t"
  log="$dir/logs/$t.log"
  mkdir -p "$work" "$crashes" "$dir/logs"
  # What libFuzzer writes when it stops on a failure (slow-unit-* reports are not failures).
  before=$(ls "$crashes" | grep -cE '^(crash|leak|timeout|oom)-' || true)
  dict=""
  [ -f "tests/fuzz/dict/$t.dict" ] && dict="-dict=tests/fuzz/dict/$t.dict"
  echo "== fuzz: $t for ${secs}s"
  rc=0
  # shellcheck disable=SC2086
  XENPROBES_LOG=off nice -n "${XENPROBES_FUZZ_NICE:-0}" "$dir/fuzz/fuzz_$t" \
    -max_total_time="$secs" -print_final_stats=1 -timeout=30 -rss_limit_mb=2048 -max_len="$(max_len "$t")" \
    -artifact_prefix="$crashes/" $dict "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  done_line=$(grep -E '^#[0-9]+[[:space:]]+(DONE|INITED|pulse|NEW|REDUCE)' "$log" | tail -n 1)
  [ -n "$execs" ] || execs=$(echo "$done_line" | sed -n 's/^#\([0-9]*\).*/\1/p')
  cov=$(echo "$done_line" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
  ft=$(echo "$done_line" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
  after=$(ls "$crashes" | grep -cE '^(crash|leak|timeout|oom)-' || true)
  found=$((after - before))
  if [ "$rc" != 0 ] && [ "$found" = 0 ]; then found=1; fi  # died without an artifact: still a failure
  line=$(printf '%-14s %10s execs  cov %6s  ft %7s  crashes %s' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$found")
  echo "$line"
  summary="$summary$line
"
  if [ "$found" != 0 ]; then
    failed="$failed $t"
    grep -E 'ERROR|invariant|SUMMARY|Test unit written' "$log" | head -n 8 >&2 || true
    newest=$(ls -t "$crashes" | grep -E '^(crash|leak|timeout|oom)-' | head -n 1 || true)
    [ -n "$newest" ] && echo "   input kept: $crashes/$newest (reproduce: $dir/fuzz/fuzz_$t $crashes/$newest)" >&2
    echo "   log: $log" >&2
  fi
done

echo "== fuzz: ${secs}s per target"
printf '%s' "$summary"
if [ -n "$failed" ]; then
  echo "fuzz: FAILED:$failed" >&2
  exit 1
fi
echo "fuzz: no crash"
