#!/bin/sh
# Settings that must agree across ranks, set differently on two ranks with
# mpiexec's MPMD form: every rank fails init quickly, naming the setting and
# both values, on every substrate; the same settings on both ranks still work.
#
#   tests/run_settings_mismatch.sh MPIEXEC MAILRAIL_DEMO
set -u
mpiexec=$1
demo=$2
export MPIEXEC_TIMEOUT=60 MAILRAIL_TIMEOUT=20
status=0

# mismatch SUBSTRATE NAME VALUE0 VALUE1 [VAR=VALUE for both ranks]
mismatch() {
    substrate=$1 name=$2 v0=$3 v1=$4 both=${5:-MAILRAIL_LOG_LEVEL=warn}
    start=$(date +%s)
    out=$(env "MAILRAIL_SUBSTRATE=$substrate" "$both" timeout -k 5 90 "$mpiexec" -disable-auto-cleanup \
          -n 1 -env "$name" "$v0" "$demo" 3 64 : -n 1 -env "$name" "$v1" "$demo" 3 64 2>&1)
    rc=$?
    took=$(($(date +%s) - start))
    says=$(printf '%s\n' "$out" | grep -c "$name must be the same on every rank: it is \"[^\"]*\" on rank 0 but \"[^\"]*\" on rank 1")
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || [ "$says" -ne 2 ] || [ "$took" -gt 30 ]; then
        printf '%s\n' "$out"
        echo "FAIL: $substrate, $name=$v0 against $v1: exit $rc after ${took} s, $says of 2 ranks named it"
        status=1
    else
        echo "ok: $substrate, $name=$v0 against $v1: both ranks failed in ${took} s and named it"
    fi
}

for substrate in tcp ucx mpi; do
    mismatch "$substrate" MAILRAIL_FLOWCTL none rank
    mismatch "$substrate" MAILRAIL_DATAGRAM_SIZE 4K 64K
    mismatch "$substrate" MAILRAIL_RANK_CREDITS 1 512 MAILRAIL_FLOWCTL=rank
    mismatch "$substrate" MAILRAIL_NODE_CREDITS 0 8 MAILRAIL_FLOWCTL=node
    mismatch "$substrate" MAILRAIL_RANKS_PER_NODE 1 2
done
mismatch tcp MAILRAIL_SUBSTRATE tcp ucx
# A substrate's own job-wide setting (mr_substrate_ops_t.job_wide_settings).
mismatch ucx MAILRAIL_UCX_ERROR_MODE none peer
mismatch ucx MAILRAIL_UCX_BARE_MAX_RANKS 1 11439

# The same values on both ranks: the job runs.
out=$(MAILRAIL_SUBSTRATE=tcp MAILRAIL_FLOWCTL=rank timeout -k 5 90 "$mpiexec" -disable-auto-cleanup \
      -n 1 -env MAILRAIL_DATAGRAM_SIZE 4K "$demo" 3 64 : -n 1 -env MAILRAIL_DATAGRAM_SIZE 4096 "$demo" 3 64 2>&1)
if [ $? -ne 0 ] || [ "$(printf '%s\n' "$out" | grep -c "all delivered exactly once")" -ne 2 ]; then
    printf '%s\n' "$out"
    echo "FAIL: 4K and 4096 are the same datagram size, but the job did not run"
    status=1
fi
exit $status
