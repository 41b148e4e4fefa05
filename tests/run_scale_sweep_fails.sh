#!/bin/sh
# tools/scale_sweep.sh fails when a run fails, and fits only complete series:
# a tiny sweep (2 and 4 ranks, MPICH alone and TCP) whose TCP run at 4 ranks
# cannot start (2 rank credits per pair need 8 receive slots there, and
# MAILRAIL_RECV_SLOTS=6 allows only 6) must exit 1, name that run, and fit
# MPICH but not TCP; the same sweep without the limit exits 0 and fits TCP.
#
#   tests/run_scale_sweep_fails.sh SOURCE_ROOT BUILD_ROOT
set -u
src=$1
build=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT INT TERM
export MAILRAIL_LOG_LEVEL=error MPIEXEC_TIMEOUT=60
status=0

sweep() { # DIR [VAR=VALUE...]: runs the sweep into OUT/DIR; sets rc and err.
    dir=$out/$1
    shift
    env "$@" "$src/tools/scale_sweep.sh" -b "$build" -o "$dir" -n 2,4 -S tcp -p rank -d 1 -m 2 \
        -T 60 >"$dir.out" 2>"$dir.err"
    rc=$?
    err=$(cat "$dir.err")
}

sweep failing MAILRAIL_RANK_CREDITS=2 MAILRAIL_RECV_SLOTS=6
if [ "$rc" -ne 1 ]; then
    echo "FAIL: a sweep with a failed run exited $rc, not 1"; status=1
elif ! printf '%s\n' "$err" | grep -qx "scale_sweep: the tcp run at 4 ranks failed (see $out/failing/runs.log)"; then
    echo "FAIL: the failed run is not named: $err"; status=1
elif ! printf '%s\n' "$err" | grep -qx "scale_sweep: series tcp has rows at 1 of 2 sizes; left out of the fit and the plots"; then
    echo "FAIL: the incomplete series is not named: $err"; status=1
elif grep -q '^| tcp |' "$out/failing/fit.md" || ! grep -q '^| mpich | init_s |' "$out/failing/fit.md"; then
    cat "$out/failing/fit.md"
    echo "FAIL: the fit should hold MPICH's complete series and not TCP's partial one"; status=1
else
    echo "ok: a failed run: exit 1, the run and the partial series named, only MPICH fitted"
fi

sweep passing MAILRAIL_RANK_CREDITS=2
if [ "$rc" -ne 0 ] || ! grep -q '^| tcp | init_s |' "$out/passing/fit.md"; then
    cat "$out/passing.err" "$out/passing/fit.md"
    echo "FAIL: the same sweep without the limit exited $rc or did not fit TCP"; status=1
else
    echo "ok: every run passed: exit 0, TCP fitted"
fi
exit $status
