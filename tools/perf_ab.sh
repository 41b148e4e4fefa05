#!/usr/bin/env bash
# Compares two builds of MailRail (before and after a change) on the hot path:
# mailrail_perf's message rate, 2 ranks on this host, for each substrate,
# policy and size, the two builds interleaved in every round so that a noisy
# neighbour hurts them alike. Prints the best and the worst of the rounds of
# each build and the ratio of the bests (after / before).
#
# Usage: tools/perf_ab.sh BEFORE-BUILD AFTER-BUILD [sizes] [messages] [rounds]
#                         [substrates] [policies]
#   defaults: 8,4096 200000 3 ucx,mpi none,rank
# Build each with `meson setup DIR --buildtype=release` (a `git worktree` of
# the old commit for BEFORE).
set -euo pipefail

[ $# -ge 2 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
before=$1 after=$2
sizes=${3:-8,4096}
count=${4:-200000}
rounds=${5:-3}
substrates=${6:-ucx,mpi}
policies=${7:-none,rank}
for b in "$before" "$after"; do
    [ -x "$b/tools/mailrail_perf" ] || { echo "perf_ab: no $b/tools/mailrail_perf" >&2; exit 1; }
done

# Prints the message rate of one run of BUILD's mailrail_perf.
rate() {
    local build=$1 substrate=$2 policy=$3 size=$4
    MAILRAIL_SUBSTRATE=$substrate MAILRAIL_FLOWCTL=$policy timeout -k 5 300 \
        mpiexec -n 2 "$build/tools/mailrail_perf" -s "$size" -n "$count" -r 1 |
        awk '$1 ~ /^[0-9]+$/ {print $2}'
}

printf '%-6s %-5s %6s  %-23s %-23s %s\n' substrate policy bytes \
    "before msg/s best-worst" "after msg/s best-worst" "after/before (best)"
for substrate in ${substrates//,/ }; do
    for policy in ${policies//,/ }; do
        for size in ${sizes//,/ }; do
            a=() b=()
            for ((r = 0; r < rounds; r++)); do
                a+=("$(rate "$before" "$substrate" "$policy" "$size")")
                b+=("$(rate "$after" "$substrate" "$policy" "$size")")
            done
            # One line per run: the build (1 before, 2 after), then the rate.
            { printf '1 %s\n' "${a[@]}"; printf '2 %s\n' "${b[@]}"; } |
                awk -v s="$substrate" -v p="$policy" -v z="$size" '
                { f = $1; v = $2 + 0
                  if (!(f in hi) || v > hi[f]) hi[f] = v; if (!(f in lo) || v < lo[f]) lo[f] = v }
                END { printf "%-6s %-5s %6s  %10.0f-%-12.0f %10.0f-%-12.0f %.3f\n",
                      s, p, z, hi[1], lo[1], hi[2], lo[2], hi[2] / hi[1] }'
        done
    done
done
