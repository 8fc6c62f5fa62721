#!/usr/bin/env bash
# Builds the libFuzzer target tests/fuzz/push_fuzzer.cc with clang (-fsanitize=fuzzer,address) in a build directory
# of its own, replays every input that once crashed it (tests/fuzz/crashes/), then fuzzes for a bounded time over the
# committed seed corpus (tests/fuzz/corpus/). Exit status non-zero on a crash, a leak or an invariant violation; the
# input is then written under BUILD_DIR/artifacts/: copy it into tests/fuzz/crashes/ with the fix.
# Registered as the ctest test fuzz_push (label fuzz). Needs clang++ and libFuzzer (Debian: clang, libclang-rt-14-dev).
#
# Usage: tests/fuzz/run_fuzz.sh [--build-dir DIR] [--seconds N] [--jobs N]
#   defaults: build/fuzz, 60 s, 2 build jobs. New inputs found while fuzzing go to BUILD_DIR/corpus (not committed).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build="$src/build/fuzz"
seconds=60
jobs=2
while (($#)); do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "run_fuzz.sh: unknown argument '$1' (use --build-dir DIR, --seconds N, --jobs N)" >&2; exit 2 ;;
  esac
done
command -v clang++ >/dev/null || { echo "run_fuzz.sh: clang++ not found; install clang and libclang-rt-14-dev" >&2; exit 2; }

t0=$(date +%s)
mkdir -p "$build"
# The same clang build also runs the thread-safety analysis (-DDILOCO_THREAD_SAFETY=ON, see
# scripts/check-thread-safety): a guarded field touched without its lock fails this test.
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src" -B "$build" -DDILOCO_FUZZ=ON -DDILOCO_THREAD_SAFETY=ON -DBUILD_TESTING=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" --target push_fuzzer -j "$jobs"
echo "run_fuzz.sh: push_fuzzer built in $(($(date +%s) - t0)) s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_odr_violation=0:abort_on_error=1}
fuzzer="$build/push_fuzzer"

# 1. Regressions: every input that crashed the fuzzer once must pass now.
shopt -s nullglob
crashes=()
for f in "$src"/tests/fuzz/crashes/*; do [[ "$f" == *.md ]] || crashes+=("$f"); done
if ((${#crashes[@]})); then
  echo "run_fuzz.sh: replaying ${#crashes[@]} earlier crash input(s)"
  "$fuzzer" "${crashes[@]}"
fi

# 2. Fuzz for a bounded time, starting from the seed corpus (new inputs go to the scratch corpus, listed first).
mkdir -p "$build/corpus" "$build/artifacts"
"$fuzzer" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix="$build/artifacts/" "$build/corpus" "$src/tests/fuzz/corpus"
echo "run_fuzz.sh: no crash in $seconds s"
