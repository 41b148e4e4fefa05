#!/usr/bin/env bash
# MailRail under Slurm on the emulated hosts (tools/fabric/slurm.sh): a cluster
# of 3 hosts (munged, slurmctld and 3 slurmd in the fabric's namespaces, every
# node idle), then `srun --mpi=pmi2 -N 3 --ntasks-per-node=2` of mailrail_demo
# over tcp (flow control none and node) and over ucx (node), and an `sbatch
# --wait` job script over tcp (rank): every rank must report exactly-once
# delivery and MailRail must see 6 ranks on 3 nodes, with one node segment per
# host shared by that host's 2 ranks only. `srun --mpi=none` must fail with
# MailRail's message (each task would be a one-rank job). Then a run is
# interrupted with SIGINT while srun runs (exit 130). After each run no
# namespace mrf<PID>*, run directory /tmp/mrf<PID>.* (the cluster's files) or
# daemon of the run may remain; nor after a failing command, nor after a run
# killed with SIGKILL once `slurm.sh --reap` has run.
#
#   run_slurm.sh SLURM_SH MAILRAIL_DEMO
#
# Exits 77 (skipped) when not root, when a tool is missing (Debian packages
# slurmctld slurmd slurm-client munge, and fabric.sh's iproute2 ethtool
# util-linux mpich), or when network namespaces cannot be created here; fails
# instead when MR_TEST_STRICT=1 (-Dstrict_tests). About a minute.
set -u

# shellcheck source=skip.sh
. "$(dirname "$0")/skip.sh"
# shellcheck source=fabric_test.sh
. "$(dirname "$0")/fabric_test.sh"
[ $# -eq 2 ] || { echo "usage: $0 SLURM_SH MAILRAIL_DEMO" >&2; exit 2; }
slurm=$1 demo=$(readlink -f "$2")

fabric_needs "slurmctld slurmd slurm-client munge iproute2 ethtool util-linux mount mpich" \
    slurmctld slurmd srun sbatch sinfo munged munge unmunge mount mpiexec
fabric_test_begin run_slurm

# Nothing of run PID may remain: namespaces, run directory, cgroups, daemons.
check_clean() {
    local pid=$1 what=$2 procs
    fabric_check_clean "$pid" "$what"
    # Every daemon of the run names a file in its run directory.
    procs=$(ps -eo pid=,args= | grep -E "(munged|slurmctld|slurmd|slurmstepd).*/tmp/mrf${pid}\." | grep -v grep)
    [ -z "$procs" ] || fail "$what: processes left behind: $procs"
}

# 1. The cluster and five jobs in it.
cat >"$tmp/jobs.sh" <<EOF
slurm_login sinfo -h -N -o 'SINFO %N %t'
fabric_substrate tcp
slurm_srun tcp-none -N 3 --ntasks-per-node=2 "$demo" 500 512 || echo "JOB tcp-none FAILED"
MAILRAIL_FLOWCTL=node MAILRAIL_LOG_LEVEL=info slurm_srun tcp-node -N 3 --ntasks-per-node=2 -l "$demo" 500 512 ||
    echo "JOB tcp-node FAILED"
fabric_substrate ucx
MAILRAIL_FLOWCTL=node slurm_srun ucx-node -N 3 --ntasks-per-node=2 "$demo" 500 512 || echo "JOB ucx-node FAILED"
fabric_substrate tcp
if slurm_login srun --mpi=none -N 2 --ntasks-per-node=1 "$demo" 10 64; then
    echo "JOB mpi-none SUCCEEDED"
fi
cat >"\$SLURM_DIR/job.sh" <<'JOB'
#!/bin/bash
#SBATCH --job-name=mailrail-demo
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=2
#SBATCH --time=2
export MAILRAIL_SUBSTRATE=tcp MAILRAIL_TCP_ADDR=eth0 MAILRAIL_FLOWCTL=rank
srun --mpi=pmi2 "$demo" 500 512
JOB
slurm_login sbatch --wait -o "\$SLURM_DIR/job.out" -D "\$SLURM_DIR" "\$SLURM_DIR/job.sh" || echo "JOB sbatch FAILED"
cat "\$SLURM_DIR/job.out"
slurm_check && echo "ALL IDLE AFTER"
EOF
"$slurm" -H 3 -C 2 --timeout 50 --total-timeout 150 --script "$tmp/jobs.sh" >"$tmp/out" 2>&1 &
pid=$!
wait "$pid"
rc=$?
grep -v -E '^\[20|^slurmctld:' "$tmp/out"
[ "$rc" -eq 0 ] || fail "slurm.sh exited with status $rc"
n=$(grep -cE "^SINFO mrf-h[0-2] idle$" "$tmp/out")
[ "$n" -eq 3 ] || fail "sinfo showed $n of 3 nodes idle"
grep -q "FAILED\|SUCCEEDED" "$tmp/out" && fail "a job failed (or srun --mpi=none did not)"
n=$(grep -c "all delivered exactly once" "$tmp/out")
[ "$n" -eq 24 ] || fail "$n of 24 rank reports say 'all delivered exactly once'"
grep -q "INCOMPLETE" "$tmp/out" && fail "a rank reports INCOMPLETE delivery"
n=$(grep -c "6 ranks on 3 node(s)" "$tmp/out")
[ "$n" -eq 4 ] || fail "MailRail saw 6 ranks on 3 nodes in $n of 4 jobs"
grep -q "substrate ucx" "$tmp/out" || fail "the ucx job did not run on the ucx substrate"
# The node job (srun -l): ranks 2h and 2h+1 run on host h and share one segment,
# which no other rank opens.
segs=$(sed -n 's/^\([0-9]*\): mailrail\[[0-9]*\] info: Node flow control.*segment \([^ ]*\)\.$/\1 \2/p' "$tmp/out" | sort -n)
[ "$(wc -l <<<"$segs")" -eq 6 ] || fail "$(wc -l <<<"$segs") of 6 ranks named their node segment"
[ "$(awk '{print $2}' <<<"$segs" | sort -u | wc -l)" -eq 3 ] || fail "not 3 distinct node segments: $segs"
for h in 0 1 2; do
    a=$(awk -v r=$((2 * h)) '$1 == r {print $2}' <<<"$segs")
    b=$(awk -v r=$((2 * h + 1)) '$1 == r {print $2}' <<<"$segs")
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "ranks $((2 * h)) and $((2 * h + 1)) (host $h) do not share a segment"
done
grep -q "srun started 2 tasks, but MPI sees one rank" "$tmp/out" ||
    fail "srun --mpi=none did not fail with MailRail's message"
grep -q "ALL IDLE AFTER" "$tmp/out" || fail "not every node idle after the jobs"
check_clean "$pid" "jobs"

# 2. SIGINT while srun runs: exit 130, everything torn down. (A background
# job of a script starts with SIGINT ignored; env restores the default.)
env --default-signal=INT "$slurm" -q -H 2 -C 1 --timeout 60 --total-timeout 120 \
    -- srun -N 2 sleep 50 >"$tmp/out" 2>&1 &
pid=$!
fabric_interrupt slurm.sh "sleep 50$"
check_clean "$pid" "SIGINT"

# 3. A failing command: its status, everything torn down.
"$slurm" -q -H 2 -C 1 --timeout 30 --total-timeout 90 -- false >"$tmp/out" 2>&1 &
pid=$!
wait "$pid"
rc=$?
[ "$rc" -eq 1 ] || { cat "$tmp/out"; fail "a failing command made slurm.sh exit $rc, not 1"; }
check_clean "$pid" "failing command"

# 4. SIGKILL while srun runs leaves the cluster behind; --reap removes it.
"$slurm" -q -H 2 -C 1 --timeout 60 --total-timeout 120 -- srun -N 2 sleep 47 >"$tmp/out" 2>&1 &
pid=$!
fabric_wait_for h1 "sleep 47$" || { cat "$tmp/out"; fail "the killed job never started"; }
kill -KILL "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
"$slurm" --reap >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "slurm.sh --reap failed"; }
grep -q "removed namespace mrf${pid}h1" "$tmp/out" || { cat "$tmp/out"; fail "--reap did not remove mrf${pid}h1"; }
check_clean "$pid" "SIGKILL and --reap"
# fabric.sh's watchdog (a subshell with its arguments) ends once the run is gone.
for _ in $(seq 15); do
    ps -eo args= | grep -v grep | grep -q "fabric.sh.*sleep 47$" || break
    sleep 0.2
done
ps -eo args= | grep -v grep | grep -q "fabric.sh.*sleep 47$" && fail "the killed run's watchdog still runs"

if [ "$failures" -gt 0 ]; then
    echo "slurm: $failures check(s) failed"
    exit 1
fi
echo "slurm: all checks passed"
