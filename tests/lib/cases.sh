# tests/lib/cases.sh: named cases for the shell suites (test_server.sh,
# test_api.sh, test_nginx.sh, test_cli.sh), as tests/test_hostile.py has them.
#
# A suite defines one function per case, case_NAME, lists them in run order
# in CASES (an entry NAME:FIXTURE first runs fixture_FIXTURE, once, in the
# suite's own shell: a server that several cases share), and ends with
# `run_cases "$@"`. `SUITE GPT2D CASE...` runs only those cases (in the
# order given), `SUITE GPT2D --list` lists them.
#
# Each case runs in a subshell with `set -e`: a failing command or `fail
# WHY` ends that case, which is recorded, and the suite goes on. Servers a
# case starts (srv_start) are killed when it ends. `skip WHY` ends a case
# whose tool or npm package is missing as skipped, and `skip_part WHY` notes
# a part of a case that could not run; with GPT2D_REQUIRE_ALL=1 (CI) both
# fail instead. The suite prints `ok NAME`, `SKIP NAME` or `FAIL NAME` per
# case, then the failed ones, and exits 1 when any case failed, 77 (meson's
# SKIP) when any was skipped, else 0.

require_all() { [ "${GPT2D_REQUIRE_ALL:-0}" = 1 ] || [ -n "${CI:-}" ]; }

fail() {
    echo "FAIL: $*" >&2
    local f
    for f in "$dir"/*.log; do [ -f "$f" ] && { echo "== $f"; tail -20 "$f"; }; done >&2
    exit 1
}

skip() {
    require_all && fail "$* (GPT2D_REQUIRE_ALL=1: nothing may skip)"
    echo "SKIP: $*" >&2
    echo "${case_name:-${0##*/}}: $*" >> "$dir/.skipped"
    exit 77
}

skip_part() {
    require_all && fail "$* (GPT2D_REQUIRE_ALL=1: nothing may skip)"
    echo "SKIP (part): $*" >&2
    echo "$case_name (in part): $*" >> "$dir/.skipped"
}

# need_node_module NAME: skip the case when tests/differential lacks it.
need_node_module() {
    command -v node > /dev/null || skip "node is not installed (scripts/setup.sh --test installs nodejs)"
    [ -d "$here/differential/node_modules/$1" ] ||
        skip "npm package $1 is missing (cd tests/differential && npm ci; scripts/test.sh does)"
}

run_cases() {
    local entry name fx names=() known=() failed=() skipped=() passed=0 rc t0
    local -A fixture=() fixture_state=()
    for entry in "${CASES[@]}"; do
        name=${entry%%:*}
        known+=("$name")
        [ "$entry" != "$name" ] && fixture[$name]=${entry#*:}
    done
    if [ "${1:-}" = --list ]; then
        printf '%s\n' "${known[@]}"
        exit 0
    fi
    names=("$@")
    [ ${#names[@]} -gt 0 ] || names=("${known[@]}")
    for name in "${names[@]}"; do
        [[ " ${known[*]} " == *" $name "* ]] || { echo "unknown case '$name' (try --list)" >&2; exit 2; }
    done
    for name in "${names[@]}"; do
        t0=${EPOCHREALTIME/./}
        case_name=$name
        fx=${fixture[$name]:-}
        if [ -n "$fx" ] && [ -z "${fixture_state[$fx]:-}" ]; then
            set +e
            "fixture_$fx"
            fixture_state[$fx]=$?
            set -e
        fi
        if [ -n "$fx" ] && [ "${fixture_state[$fx]}" != 0 ]; then
            rc=1
            echo "FAIL: $name: its fixture $fx did not start" >&2
        else
            set +e
            (
                set -e
                srv_pids=()
                trap 'if declare -F srv_stop_all > /dev/null; then srv_stop_all; fi' EXIT
                "case_$name"
            )
            rc=$?
            set -e
        fi
        t0=$(((${EPOCHREALTIME/./} - t0) / 100000)) # tenths of a second
        t0=$((t0 / 10)).$((t0 % 10))
        case $rc in
            0) passed=$((passed + 1)); echo "ok $name ($t0 s)" ;;
            77) skipped+=("$name"); echo "SKIP $name ($t0 s)" ;;
            *) failed+=("$name"); echo "FAIL $name ($t0 s)" ;;
        esac
    done
    echo "${#names[@]} cases: $passed passed, ${#failed[@]} failed, ${#skipped[@]} skipped"
    [ -f "$dir/.skipped" ] && sed 's/^/skipped: /' "$dir/.skipped"
    if [ ${#failed[@]} -gt 0 ]; then
        echo "failed: ${failed[*]}"
        exit 1
    fi
    if [ ${#skipped[@]} -gt 0 ] || [ -f "$dir/.skipped" ]; then
        exit 77
    fi
    exit 0
}
