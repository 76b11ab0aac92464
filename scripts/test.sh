#!/usr/bin/env bash
# scripts/test.sh [--fast|--quick]: installs what is missing, builds gpt2d
# and runs every test. This is the README's test command and what CI runs.
#   --fast: only the `fast` suite, the README's test-while-you-work
#      command: installs what it needs (scripts/setup.sh --fast), configures
#      build/ if it is not there, and runs `meson test -C build --suite
#      fast`, which compiles only what those tests need. A test whose tool is
#      missing may skip here.
#   1. release-like build (-O2 -g, warnings are errors), all meson tests,
#      then `meson install` into a scratch DESTDIR (tests/test_install.sh),
#      then a --buildtype=release (-O3) compile. Every build here passes
#      -Dwerror=true; meson.build does not force it, so that a packager's
#      build with another compiler's new warnings still builds.
#   2. the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#   3. the engine and scheduler tests and the server's threads under
#      ThreadSanitizer
#   4. every libFuzzer target for FUZZ_SECONDS (default 60) each
# --quick runs step 1 only.
# Step 1 includes the README's own first two commands in a fresh clone
# (tests/test_readme.sh, suite readme), which the sanitized build skips.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --fast ]; then
    scripts/setup.sh --fast
    [ -f build/build.ninja ] || meson setup build --buildtype=debugoptimized -Dwerror=true > /dev/null
    exec meson test -C build --suite fast --print-errorlogs --num-processes 2
fi
# Every test must run here: a test that would skip (exit 77: a missing npm
# package, chromium or promtool) fails the run instead (no_skips below), and
# the tests that check for their tools themselves read this.
export GPT2D_REQUIRE_ALL=1
quick=0
[ "${1:-}" = "--quick" ] && quick=1

# meson counts exit 77 as SKIP and passes; here a skipped test is a failure.
no_skips() { # build dir
    python3 - "$1/meson-logs/testlog.json" <<'PY'
import json, sys
skipped = [t["name"] for t in map(json.loads, open(sys.argv[1])) if t["result"] == "SKIP"]
if skipped:
    sys.exit("skipped, which CI does not allow: " + ", ".join(skipped))
PY
}

scripts/setup.sh --test
# The references the differential tests compare against (npm, pinned by
# package-lock.json). A failure here fails the run: those tests must not be
# skipped in CI.
(cd tests/differential && npm ci --no-audit --no-fund --loglevel=error)

echo "== formatting (.clang-format, Debian 12's clang-format 14)"
git ls-files '*.c' '*.h' ':!tokenizer/unicode_classes.h' | xargs clang-format --dry-run --Werror

echo "== build and test (build/)"
[ -f build/build.ninja ] || meson setup build --buildtype=debugoptimized -Dwerror=true
meson compile -C build
meson test -C build --print-errorlogs --num-processes 2
no_skips build
echo "== meson install into a scratch DESTDIR"
tests/test_install.sh build

echo "== release build (build-release/): a packager's -O3, compile only"
[ -f build-release/build.ninja ] ||
    meson setup build-release --buildtype=release -Dwerror=true -Dtests=false
meson compile -C build-release

[ "$quick" = 1 ] && exit 0

# A sanitized build runs 3-10x slower, and CI's machine is shared: its
# meson timeouts are doubled (the suites' own deadlines scale themselves).
echo "== sanitizers (build-asan/)"
[ -f build-asan/build.ninja ] ||
    meson setup build-asan --buildtype=debug -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false
meson compile -C build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    meson test -C build-asan --print-errorlogs --num-processes 2 --timeout-multiplier 2 --no-suite readme
no_skips build-asan

echo "== ThreadSanitizer (build-tsan/): the worker pool, the scheduler, the server's threads"
[ -f build-tsan/build.ninja ] ||
    CC=clang meson setup build-tsan --buildtype=debugoptimized -Dwerror=true -Db_sanitize=thread -Db_lundef=false
meson compile -C build-tsan
TSAN_OPTIONS=halt_on_error=1 meson test -C build-tsan --print-errorlogs --timeout-multiplier 2 \
    engine engine-portable scheduler \
    server-threads
no_skips build-tsan

echo "== fuzzing (build-fuzz/), ${FUZZ_SECONDS:-60} s per target"
[ -f build-fuzz/build.ninja ] ||
    CC=clang meson setup build-fuzz --buildtype=debugoptimized -Dwerror=true -Dfuzz=true -Dtests=false
meson compile -C build-fuzz
for target in build-fuzz/tests/fuzz/fuzz_*; do
    [ -x "$target" ] && [ -f "$target" ] || continue
    name=$(basename "$target")
    corpus=tests/fuzz/corpus/${name#fuzz_}
    work=$(mktemp -d /tmp/gpt2d-fuzz-XXXXXX)
    dict=()
    [ -f "tests/fuzz/${name#fuzz_}.dict" ] && dict=(-dict="tests/fuzz/${name#fuzz_}.dict")
    echo "-- $name"
    "$target" -max_total_time="${FUZZ_SECONDS:-60}" -max_len=65536 -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" "$work" "$corpus" 2>&1 | tail -n 12
    rm -rf "$work"
done
echo "== all tests passed"
