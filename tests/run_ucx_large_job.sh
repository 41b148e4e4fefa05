#!/bin/sh
# The UCX substrate's large-job path (jobs above MAILRAIL_UCX_BARE_MAX_RANKS,
# by default 11439 ranks: every message carries MailRail's header and no
# header-less AM id is registered), forced on 4 ranks by setting it to 3.
# mailrail_scale -x checks every message exactly once, and each rank's
# closing debug line must count 0 messages without a header; the same job
# with the default must count some, or the check could not tell the paths
# apart.
#
#   tests/run_ucx_large_job.sh MPIEXEC MAILRAIL_SCALE
set -u
mpiexec=$1
scale=$2
export MAILRAIL_SUBSTRATE=ucx MAILRAIL_TIMEOUT=60 MPIEXEC_TIMEOUT=90
status=0

# run MAX_RANKS POLICY: prints how many ranks counted header-less arrivals, and which counts.
run() {
    out=$(env MAILRAIL_UCX_BARE_MAX_RANKS="$1" MAILRAIL_FLOWCTL="$2" MAILRAIL_LOG_LEVEL=debug \
          timeout -k 5 100 "$mpiexec" -n 4 "$scale" -d 2 -m 16 -x 2>&1)
    rc=$?
    counts=$(printf '%s\n' "$out" | sed -n 's/.*UCX substrate: \([0-9]*\) messages arrived without a header.*/\1/p' | sort -n | tr '\n' ' ')
    lines=$(printf '%s\n' "$out" | grep -c "messages arrived without a header")
}

for policy in none rank node; do
    run 3 "$policy"
    if [ "$rc" -ne 0 ] || [ "$lines" -ne 4 ] || [ "$counts" != "0 0 0 0 " ]; then
        printf '%s\n' "$out" | grep -v "debug" | tail -20
        echo "FAIL: large-job path ($policy, MAILRAIL_UCX_BARE_MAX_RANKS=3 on 4 ranks): exit $rc, $lines of 4 ranks counted header-less arrivals: $counts"
        status=1
    else
        echo "ok: large-job path ($policy, MAILRAIL_UCX_BARE_MAX_RANKS=3 on 4 ranks): every message once, none without a header"
    fi
done
# The control: the default path sends header-less messages in the same job.
run 11439 none
if [ "$rc" -ne 0 ] || [ "$lines" -ne 4 ] || [ "$counts" = "0 0 0 0 " ]; then
    printf '%s\n' "$out" | grep -v "debug" | tail -20
    echo "FAIL: default path on 4 ranks: exit $rc, $lines of 4 ranks counted, header-less arrivals: $counts"
    status=1
else
    echo "ok: default path on 4 ranks: header-less arrivals per rank: $counts"
fi
exit $status
