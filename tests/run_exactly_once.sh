#!/bin/sh
# Exactly once, shown to fail: runs a tool that claims exactly-once delivery
# (mailrail_demo, mailrail_incast or mailrail_chaos) on 2 ranks over the test double
# tests/doubles/substrate_faulty.c, under every flow-control policy:
#   none        the double itself breaks nothing: the run passes;
#   duplicate   every 3rd data message a rank receives arrives twice: the
#               tool must fail, naming "message 2 from rank S arrived twice";
#   drop        every 3rd is lost: it must fail, naming "message 2 from rank S
#               is missing: message 3 arrived before it";
#   drop-tail   the last of 10 is lost, so nothing comes after it: it must
#               fail within MAILRAIL_TIMEOUT (2 s), naming "message 9 from
#               rank S never arrived".
# mailrail_chaos (rank 0 the victim) names a loss once its time limit (-T 4)
# is up: "message 2 from rank S never arrived (N lost in all)".
# S is the other rank (the only one whose messages pass the substrate: a
# rank's messages to itself do not). A run that hangs (timeout), passes
# silently or names anything else fails the test.
#
#   run_exactly_once.sh MPIEXEC TOOL PLUGIN_PATH FAULT...
# MR_TEST_POLICIES (default "none rank node") narrows the policies.
set -u
mpiexec=$1 tool=$2 plugin_path=$3
shift 3
name=$(basename "$tool")
failures=0
control=no

fail()
{
    echo "FAIL: $*"
    failures=$((failures + 1))
}

# run POLICY FAULT EVERY ARGS...: the tool's output in $out, its status in $rc.
run()
{
    local run_policy=$1 run_fault=$2 run_every=$3
    shift 3
    run_started=$(date +%s)
    out=$(MAILRAIL_PLUGIN_PATH=$plugin_path MAILRAIL_SUBSTRATE=faulty MAILRAIL_FLOWCTL=$run_policy \
          MAILRAIL_FAULTY_FAULT=$run_fault MAILRAIL_FAULTY_EVERY=$run_every MAILRAIL_TIMEOUT=2 \
          MAILRAIL_LOG_LEVEL=error MPIEXEC_TIMEOUT=50 \
          timeout -k 5 60 "$mpiexec" -n 2 "$tool" "$@" 2>&1)
    rc=$?
    elapsed=$(($(date +%s) - run_started))
    # Under the sanitizers a failing run must still be clean: a report fails the test.
    if printf '%s\n' "$out" | grep -qE "(Address|Leak|UndefinedBehavior)Sanitizer|runtime error:"; then
        fail "$name ($run_policy, $run_fault): a sanitizer report"
        printf '%s\n' "$out" | grep -E -A 12 "Sanitizer|runtime error:" | head -n 30
    fi
}

# The arguments of a run in which each rank receives `messages` messages from the other.
args()
{
    case $name in
        mailrail_demo) echo "$1 64" ;;
        mailrail_incast) echo "-m $1 -t 1 -q" ;;
        mailrail_chaos) echo "-v 0 -m $1 -T 4" ;;
    esac
}

# expect_failure CASE POLICY REGEX: the run failed in time, and the first line
# that names a message is REGEX, where S is the other rank than the reporter's.
expect_failure()
{
    local case_name=$1 case_policy=$2 regex=$3
    local label line reporter other suffix want
    label="$name, $case_name, $case_policy"
    # timeout(1) kills with 124 or 137; MPIEXEC_TIMEOUT ends mpiexec with 255.
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || [ "$elapsed" -ge 45 ]; then
        fail "$label: the run hung until it was killed after $elapsed s (exit $rc)"
        printf '%s\n' "$out" | tail -n 5
        return
    fi
    [ "$rc" -ne 0 ] || fail "$label: the run passed (exit 0)"
    line=$(printf '%s\n' "$out" | grep -E "^$name: rank [01]: .*message [0-9]+ from rank" | head -n 1)
    reporter=$(printf '%s\n' "$line" | sed -n "s/^$name: rank \([01]\):.*/\1/p")
    other=$((1 - ${reporter:-0}))
    suffix=
    [ "$name" = mailrail_incast ] &&
        suffix=" \\($case_policy, trial 0, seed [0-9]+: rerun with -s [0-9]+\\)"
    want="^$name: rank ${reporter:-?}: $(printf '%s' "$regex" | sed "s/S/$other/g")$suffix\$"
    if ! printf '%s\n' "$line" | grep -Eq "$want"; then
        fail "$label: expected a line like '$want', got '${line:-nothing}' (exit $rc)"
        printf '%s\n' "$out" | grep -v "Connection refused" | tail -n 8
        return
    fi
    # A duplicate is named at once, a loss after MAILRAIL_TIMEOUT (2 s).
    if [ "$elapsed" -gt 20 ]; then
        fail "$label: named after $elapsed s"
        return
    fi
    echo "ok: $label: exit $rc after $elapsed s, $line"
}

for fault in "$@"; do
    for policy in ${MR_TEST_POLICIES:-none rank node}; do
        case $fault in
            none)
                control=yes
                run "$policy" none 3 $(args 100)
                if [ "$rc" -ne 0 ]; then
                    fail "$name, no fault, $policy: exit $rc"
                    printf '%s\n' "$out" | tail -n 8
                else
                    echo "ok: $name, no fault, $policy: passed"
                fi
                ;;
            duplicate)
                run "$policy" duplicate 3 $(args 100)
                expect_failure duplicate "$policy" "message 2 from rank S arrived twice"
                ;;
            drop)
                run "$policy" drop 3 $(args 100)
                if [ "$name" = mailrail_chaos ]; then
                    expect_failure drop "$policy" "message 2 from rank S never arrived \\([0-9]+ lost in all\\)"
                else
                    expect_failure drop "$policy" "message 2 from rank S is missing: message 3 arrived before it"
                fi
                ;;
            drop-tail)
                run "$policy" drop 10 $(args 10)
                expect_failure "drop of the last" "$policy" \
                    "message 9 from rank S never arrived: nothing came for 2 s \\(MAILRAIL_TIMEOUT\\) while waiting for [a-z ]+, with 1 message\\(s\\) missing"
                ;;
            *) echo "run_exactly_once.sh: unknown fault $fault"; exit 2 ;;
        esac
    done
done

if [ "$name" = mailrail_incast ] && [ "$control" = yes ]; then
    # Fresh seeds: a run without -s prints the seed it drew; -s reproduces the victims.
    run none none 3 -m 10 -t 1 -q -s 4242
    first=$(printf '%s\n' "$out" | grep "^# $name:")
    printf '%s\n' "$first" | grep -q "seed 4242$" || fail "-s 4242 is not the seed printed: $first"
    run none none 3 -m 10 -t 1 -q -s 4242
    [ "$(printf '%s\n' "$out" | grep "^# $name:")" = "$first" ] || fail "-s 4242 drew other victims"
    run none none 3 -m 10 -t 1 -q
    a=$(printf '%s\n' "$out" | sed -n "s/^# $name:.*; seed \([0-9]*\)$/\1/p")
    run none none 3 -m 10 -t 1 -q
    b=$(printf '%s\n' "$out" | sed -n "s/^# $name:.*; seed \([0-9]*\)$/\1/p")
    if [ -z "$a" ] || [ -z "$b" ] || [ "$a" = "$b" ]; then
        fail "two runs without -s printed the seeds '$a' and '$b'"
    else
        echo "ok: $name: fresh seeds $a and $b, -s reproduces"
    fi
fi

[ "$failures" -eq 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "all checks passed"
