#!/usr/bin/env bash
# Compares MailRail's message rate on each substrate with the raw transport
# underneath, side by side on this host, as ratios:
#   ucx: mailrail_perf over MAILRAIL_SUBSTRATE=ucx  vs  ucx_perftest -t ucp_am_bw
#   mpi: mailrail_perf over MAILRAIL_SUBSTRATE=mpi  vs  mailrail_perf -m (a plain MPI_Isend/MPI_Irecv loop)
#   tcp: mailrail_perf over MAILRAIL_SUBSTRATE=tcp  (no raw baseline; for reference)
# Every measurement is the best of ROUNDS runs, and the rounds interleave the
# contenders so that a noisy neighbour hurts them alike.
#
# Usage: tools/perf_compare.sh [build-dir] [sizes] [messages] [rounds] [flowctl]
#   defaults: build 8,64,512,4096 200000 3 none
set -euo pipefail

build=${1:-build}
sizes=${2:-8,64,512,4096}
count=${3:-200000}
rounds=${4:-3}
flowctl=${5:-none}
perf="$build/tools/mailrail_perf"
port=$((20000 + RANDOM % 20000))

# Prints the message rate of one mailrail_perf run (2 ranks, one size).
mailrail_rate() {
    local substrate=$1 size=$2; shift 2
    MAILRAIL_SUBSTRATE=$substrate MAILRAIL_FLOWCTL=$flowctl timeout -k 5 300 \
        mpiexec -n 2 "$perf" -s "$size" -n "$count" -r 1 "$@" | awk '$1 ~ /^[0-9]+$/ {print $2}'
}

# Prints the overall message rate of ucx_perftest's active-message bandwidth test.
ucx_rate() {
    local size=$1
    port=$((port + 1))
    timeout -k 5 300 ucx_perftest -t ucp_am_bw -s "$size" -n "$count" -p "$port" >/dev/null 2>&1 &
    local server=$!
    sleep 0.5
    timeout -k 5 300 ucx_perftest 127.0.0.1 -t ucp_am_bw -s "$size" -n "$count" -p "$port" 2>/dev/null |
        awk '/^Final:/ {print $NF}'
    wait "$server" || true
}

best() { printf '%s\n' "$@" | sort -g | tail -n 1; }

printf '# %d messages per run, best of %d interleaved rounds, flow control %s\n' "$count" "$rounds" "$flowctl"
printf '%8s %14s %14s %7s %14s %14s %7s %14s\n' bytes ucx_perftest mailrail_ucx ratio \
    mpi_raw mailrail_mpi ratio mailrail_tcp
IFS=, read -r -a size_list <<< "$sizes"
for size in "${size_list[@]}"; do
    u=() mu=() m=() mm=() t=()
    for ((i = 0; i < rounds; i++)); do
        u+=("$(ucx_rate "$size")")
        mu+=("$(mailrail_rate ucx "$size")")
        m+=("$(mailrail_rate mpi "$size" -m)")
        mm+=("$(mailrail_rate mpi "$size")")
        t+=("$(mailrail_rate tcp "$size")")
    done
    bu=$(best "${u[@]}") bmu=$(best "${mu[@]}") bm=$(best "${m[@]}") bmm=$(best "${mm[@]}") bt=$(best "${t[@]}")
    awk -v s="$size" -v u="$bu" -v mu="$bmu" -v m="$bm" -v mm="$bmm" -v t="$bt" 'BEGIN {
        printf "%8d %14.0f %14.0f %7.2f %14.0f %14.0f %7.2f %14.0f\n", s, u, mu, (u > 0 ? mu / u : 0), m, mm, (m > 0 ? mm / m : 0), t }'
done
