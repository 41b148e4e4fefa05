#!/usr/bin/env bash
# MailRail across the emulated hosts of tools/fabric/fabric.sh: 2 hosts x 2
# ranks (network namespaces joined by a bridge, the port toward the second host
# shaped to 200mbit with a 32kb buffer). mailrail_demo runs over the tcp
# substrate (flow control none and node) and over the ucx substrate (UCX's TCP
# transport on eth0); every rank must report that every message arrived exactly
# once, MailRail must see 2 nodes but 4 ranks on one machine (for
# MAILRAIL_YIELD), and the shaped port must have carried at least the payload
# sent across it. A fourth job checks from inside the ranks that each runs in
# its host's CPU cgroup (--cpu host, when the kernel has a cpu controller) and
# that $FABRIC_PORT_COUNTERS reads the victim port; a fifth, the MPI_Alltoall of
# a small MPI program compiled here, must leave the shaped port alone (MPICH's
# traffic stays on shared memory). Then with --mpi-net: mailrail_demo again
# (MailRail bootstraps through MPI, whose MPI_Finalize hangs over tcp without
# fabric.sh's shim), the MPI program, whose bytes must now cross the port and
# whose MPI node must be its host, and the ranks' UCX settings. Then a job is
# interrupted with SIGINT and a failing job is run. After each run no namespace
# mrf<PID>*, no cgroup mrf<PID> and no /dev/shm/mailrail-* segment of the run
# may remain.
#
#   run_fabric.sh FABRIC_SH MPIEXEC MAILRAIL_DEMO
#
# Exits 77 (skipped) when not root, when ip, tc, ethtool, unshare, cc or mpicc is
# missing (Debian packages iproute2, ethtool, util-linux, gcc, libmpich-dev), or
# when network namespaces cannot be created here; fails instead when
# MR_TEST_STRICT=1 (-Dstrict_tests).
set -u

# shellcheck source=skip.sh
. "$(dirname "$0")/skip.sh"
# shellcheck source=fabric_test.sh
. "$(dirname "$0")/fabric_test.sh"
[ $# -eq 3 ] || { echo "usage: $0 FABRIC_SH MPIEXEC MAILRAIL_DEMO" >&2; exit 2; }
fabric=$1 mpiexec=$2 demo=$3

fabric_needs "iproute2 ethtool util-linux gcc libmpich-dev" cc mpicc
fabric_test_begin run_fabric

# An MPI-only job: every rank sends BYTES to every other rank with MPI_Alltoall,
# checks what it got, and names the size of its MPI node (shared-memory domain).
cat >"$tmp/mpi_a2a.c" <<'EOF'
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv)
{
    int rank, size, local, bad = 0, all_bad;
    long bytes = argc > 1 ? atol(argv[1]) : 0;
    MPI_Comm node;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    unsigned char *s = malloc(bytes * size + 1), *r = malloc(bytes * size + 1);
    for (long i = 0; i < bytes * size; i++) s[i] = (unsigned char)(rank + i / bytes);
    MPI_Alltoall(s, (int)bytes, MPI_BYTE, r, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    for (long i = 0; i < bytes * size; i++) bad += r[i] != (unsigned char)(i / bytes + rank);
    MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("mpi_a2a: rank %d of %d, MPI node of %d, %s\n", rank, size, local, all_bad ? "BAD" : "ok");
    MPI_Comm_free(&node);
    MPI_Finalize();
    return all_bad != 0;
}
EOF
mpicc -O2 -o "$tmp/mpi_a2a" "$tmp/mpi_a2a.c" || fail "mpicc cannot build a small MPI program"

# The segments that existed before: others' running jobs may own some.
shm_segments() {
    local f
    for f in /dev/shm/mailrail-*; do [ -e "$f" ] && echo "${f#/dev/shm/}"; done | sort
}
shm_before=$(shm_segments)

# Nothing of run PID may remain: no namespace, no new mailrail segment.
check_clean() {
    local pid=$1 what=$2 seg
    fabric_check_clean "$pid" "$what"
    for seg in $(shm_segments | comm -13 <(echo "$shm_before") -); do
        # A segment of another job that is still running is not ours.
        local creator
        creator=$(od -An -t d4 -j 20 -N 4 "/dev/shm/$seg" 2>/dev/null | tr -d ' ')
        if [ -z "$creator" ] || [ "$creator" -eq 0 ] || ! kill -0 "$creator" 2>/dev/null; then
            fail "$what: /dev/shm/$seg left behind"
        fi
    done
}

# 1. Three jobs in one fabric: tcp/none, tcp/node, ucx/node.
count=1000 bytes=512 mpi_bytes=262144
cat >"$tmp/jobs.sh" <<EOF
fabric_substrate tcp
MAILRAIL_LOG_LEVEL=debug fabric_run tcp-none "$demo" $count $bytes || echo "JOB tcp-none FAILED"
MAILRAIL_FLOWCTL=node fabric_run tcp-node "$demo" $count $bytes || echo "JOB tcp-node FAILED"
fabric_substrate ucx
MAILRAIL_FLOWCTL=node fabric_run ucx-node "$demo" $count $bytes || echo "JOB ucx-node FAILED"
fabric_run probe sh -c 'echo "rank \$PMI_RANK cgroup \$(grep -m1 -E "(^|[:,])cpu(,|:)" /proc/self/cgroup)"; echo "rank \$PMI_RANK ports \$(\$FABRIC_PORT_COUNTERS)"' || echo "JOB probe FAILED"
fabric_run mpi-shm "$tmp/mpi_a2a" $mpi_bytes || echo "JOB mpi-shm FAILED"
EOF
# fabric.sh bounds itself (--total-timeout); $! must be its own PID, which names
# its namespaces.
"$fabric" -H 2 -R 2 -V 1 --timeout 50 --total-timeout 160 \
    --mpiexec "$mpiexec" --counters "$tmp/counters.csv" --script "$tmp/jobs.sh" \
    >"$tmp/out" 2>&1 &
pid=$!
wait "$pid"
rc=$?
cat "$tmp/out"
[ "$rc" -eq 0 ] || fail "fabric.sh exited with status $rc"
grep -q "namespaces mrf${pid}\*" "$tmp/out" || fail "the namespaces are not named mrf${pid}*"
grep -q "FAILED" "$tmp/out" && fail "a job failed"
n=$(grep -c "^mpi_a2a: rank [0-3] of 4, MPI node of 4, ok$" "$tmp/out")
[ "$n" -eq 4 ] || fail "$n of 4 ranks of the MPI job report one MPI node of 4 and their data"
n=$(grep -c "all delivered exactly once" "$tmp/out")
[ "$n" -eq 12 ] || fail "$n of 12 rank reports say 'all delivered exactly once'"
grep -q "INCOMPLETE" "$tmp/out" && fail "a rank reports INCOMPLETE delivery"
n=$(grep -c "4 ranks on 2 node(s)" "$tmp/out")
[ "$n" -eq 3 ] || fail "MailRail saw 2 nodes in $n of 3 jobs"
grep -q "substrate ucx" "$tmp/out" || fail "the ucx job did not run on the ucx substrate"
# The emulated hosts have names of their own but share this machine's cores:
# MAILRAIL_YIELD=auto must count all 4 ranks (by boot id), or spinning ranks
# starve each other whenever they outnumber the CPUs.
n=$(grep -c "debug: 4 ranks on this machine" "$tmp/out")
[ "$n" -eq 4 ] || fail "$n of 4 ranks counted the 4 ranks sharing this machine"
# Ranks 0,1 (host 0) send count messages to each of ranks 2,3 (host 1).
across=$((2 * 2 * count * bytes))
if [ -f "$tmp/counters.csv" ]; then
    cat "$tmp/counters.csv"
    for label in tcp-none tcp-node ucx-node; do
        sent=$(awk -F, -v l="$label" '$1 == l && $2 == "h1" { print $3 }' "$tmp/counters.csv")
        if [ -z "$sent" ] || [ "$sent" -lt "$across" ]; then
            fail "$label: the shaped port carried ${sent:-no} bytes, less than the $across sent across it"
        fi
    done
    # MPICH's own traffic stays off the fabric by default (a stray packet at most).
    sent=$(awk -F, '$1 == "mpi-shm" && $2 == "h1" { print $3 }' "$tmp/counters.csv")
    [ -n "$sent" ] && [ "$sent" -lt 65536 ] ||
        fail "mpi-shm: without --mpi-net the shaped port carried ${sent:-no} bytes (want < 65536)"
else
    fail "no counters file"
fi
# From inside each rank: the victim port's counters (cumulative: at least what
# the three jobs sent across it) and, with a cpu controller, the host's cgroup.
n=$(grep -cE "^rank [0-3] ports [0-9]+ [0-9]+ [0-9]+ [0-9]+$" "$tmp/out")
[ "$n" -eq 4 ] || fail "$n of 4 ranks read the port counters with \$FABRIC_PORT_COUNTERS"
sent=$(awk '$3 == "ports" { print $4; exit }' "$tmp/out")
[ "${sent:-0}" -ge $((3 * across)) ] || fail "\$FABRIC_PORT_COUNTERS reads ${sent:-nothing} bytes sent, less than the $((3 * across)) of the three jobs"
if [ -e /sys/fs/cgroup/cpu/cpu.shares ] || grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    for r in 0 1 2 3; do
        grep -qE "^rank $r cgroup .*/mrf${pid}/h$((r / 2))$" "$tmp/out" ||
            fail "rank $r does not run in the cgroup of host $((r / 2))"
    done
fi
check_clean "$pid" "jobs"

# 1b. --mpi-net: MPICH's traffic between the hosts goes over eth0 (UCX's tcp),
# within a host over shared memory; MPI_Finalize must not hang.
cat >"$tmp/jobs-net.sh" <<EOF
fabric_run demo-net "$demo" $count $bytes || echo "JOB demo-net FAILED"
fabric_run mpi-net "$tmp/mpi_a2a" $mpi_bytes || echo "JOB mpi-net FAILED"
fabric_run probe-net sh -c 'echo "rank \$PMI_RANK ucx \$UCX_TLS \$UCX_NET_DEVICES preload \${LD_PRELOAD##*/}"' || echo "JOB probe-net FAILED"
EOF
"$fabric" -H 2 -R 2 -V 1 --mpi-net --timeout 50 --total-timeout 120 \
    --mpiexec "$mpiexec" --counters "$tmp/counters-net.csv" --script "$tmp/jobs-net.sh" \
    >"$tmp/out" 2>&1 &
pid=$!
wait "$pid"
rc=$?
cat "$tmp/out"
[ "$rc" -eq 0 ] || fail "fabric.sh --mpi-net exited with status $rc"
grep -q "FAILED" "$tmp/out" && fail "a --mpi-net job failed"
n=$(grep -c "all delivered exactly once" "$tmp/out")
[ "$n" -eq 4 ] || fail "--mpi-net: $n of 4 rank reports say 'all delivered exactly once'"
# One MPI node per host (hydra got the hosts), and the data.
n=$(grep -c "^mpi_a2a: rank [0-3] of 4, MPI node of 2, ok$" "$tmp/out")
[ "$n" -eq 4 ] || fail "--mpi-net: $n of 4 ranks of the MPI job report an MPI node of 2 and their data"
n=$(grep -c "^rank [0-3] ucx tcp,self eth0 preload mpi_finalize_shim.so$" "$tmp/out")
[ "$n" -eq 4 ] || fail "--mpi-net: $n of 4 ranks run with UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 and the shim"
# Ranks 0,1 (host 0) send mpi_bytes to each of ranks 2,3 (host 1): now across the port.
sent=$(awk -F, '$1 == "mpi-net" && $2 == "h1" { print $3 }' "$tmp/counters-net.csv" 2>/dev/null)
[ -n "$sent" ] && [ "$sent" -ge $((2 * 2 * mpi_bytes)) ] ||
    fail "mpi-net: the shaped port carried ${sent:-no} bytes, less than the $((2 * 2 * mpi_bytes)) MPI sent across it"
check_clean "$pid" "--mpi-net jobs"

# 2. SIGINT while a job runs: exit 130, everything torn down. (A background
# job of a script starts with SIGINT ignored; env restores the default.)
env --default-signal=INT "$fabric" -q -H 2 -R 2 --timeout 60 --total-timeout 90 \
    --mpiexec "$mpiexec" -- sleep 50 >"$tmp/out" 2>&1 &
pid=$!
fabric_interrupt fabric.sh "sleep 50$"
check_clean "$pid" "SIGINT"

# 3. A failing job: non-zero exit, everything torn down.
"$fabric" -q -H 2 -R 1 --timeout 30 --total-timeout 60 --mpiexec "$mpiexec" -- false >"$tmp/out" 2>&1 &
pid=$!
wait "$pid"
rc=$?
[ "$rc" -ne 0 ] || fail "a failing job made fabric.sh exit 0"
check_clean "$pid" "failing job"

if [ "$failures" -gt 0 ]; then
    echo "fabric: $failures check(s) failed"
    exit 1
fi
echo "fabric: all checks passed"
