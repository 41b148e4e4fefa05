#!/usr/bin/env bash
# Compares MailRail's message rate (and with -l its one-way latency) on each
# substrate with the raw transport underneath, side by side on this host:
#   ucx: mailrail_perf over MAILRAIL_SUBSTRATE=ucx  vs  ucx_perftest -t ucp_am_bw (ucp_am_lat)
#   mpi: mailrail_perf over MAILRAIL_SUBSTRATE=mpi  vs  mailrail_perf -m (a plain
#        MPI_Isend/MPI_Irecv loop; its latency is a plain MPI ping-pong)
# Every round runs the baseline and then MailRail under each policy, so that a
# noisy neighbour hurts them alike; the ratio of a round is MailRail's rate over
# that round's baseline. Two more contenders can take a policy's place:
#   raw    the raw transport once more: the baseline against itself, the noise
#          floor against which the MailRail ratios of the same run are read;
#   async  (mpi only) `mailrail_perf -a`: plain MPI driven as an asynchronous
#          runtime must drive it, requests kept in flight and tested, never a
#          whole window waited for.
# A policy with +h (none+h, rank+h, node+h) runs MailRail through active-message
# handlers (`mailrail_perf -H`; its datagram has a byte more, for the id); with
# +hc (none+hc, ...) through handlers sent with mr_send_handler_copy() (-H -C).
# Prints, per substrate, policy and size, the median, lowest and highest ratio
# of the rounds; writes every run to OUT/perf.csv, the summary to
# OUT/perf_summary.csv, one Markdown table per substrate with the date and the
# machine to OUT/perf.md, and a plot of the ratios to OUT/perf.png. A run that
# fails, times out or prints no rate is named on stderr and left out of the
# ratios, and the script then exits 1: a failure never reads as a ratio of 0.
#
# Usage: tools/perf_compare.sh [-b BUILD] [-s SIZES] [-n MESSAGES] [-r ROUNDS]
#                              [-p POLICIES] [-S SUBSTRATES] [-o OUT] [-l]
#   defaults: -b build -s 8,64,512,4096,65536 -n 200000 -r 3 -p none,rank,node
#             -S ucx,mpi -o BUILD/perf; -l adds latency (one-way, half a round trip);
#             -p raw,async,none,rank,node adds both references
set -euo pipefail

build=build sizes=8,64,512,4096,65536 count=200000 rounds=3 policies=none,rank,node
substrates=ucx,mpi out='' latency=''
while getopts "b:s:n:r:p:S:o:lh" opt; do
    case $opt in
        b) build=$OPTARG ;; s) sizes=$OPTARG ;; n) count=$OPTARG ;; r) rounds=$OPTARG ;;
        p) policies=$OPTARG ;; S) substrates=$OPTARG ;; o) out=$OPTARG ;; l) latency=1 ;;
        *) sed -n '2,24p' "$0" >&2; exit 2 ;;
    esac
done
out=${out:-$build/perf}
for substrate in ${substrates//,/ }; do
    case $substrate in
        ucx | mpi) ;;
        *) echo "perf_compare: -S $substrate: only ucx and mpi have a raw baseline here" >&2; exit 2 ;;
    esac
done
perf="$build/tools/mailrail_perf"
[ -x "$perf" ] || { echo "perf_compare: no $perf; build first" >&2; exit 1; }
command -v ucx_perftest >/dev/null || { echo "perf_compare: ucx_perftest is missing (ucx-utils)" >&2; exit 1; }
mkdir -p "$out"
port=$((20000 + RANDOM % 20000))
here=$(cd "$(dirname "$0")" && pwd)

failed=()
# Runs one contender ("$@" prints "rate latency_us") and sets rate and lat; on a
# failure, a timeout or no positive rate, names it in failed[] and returns 1.
measure() {
    local what=$1 result status=0; shift
    result=$("$@" 2>"$out/last_error.log") || status=$?
    read -r rate lat <<<"$result"
    if [ "$status" -ne 0 ] || ! awk -v r="${rate:-}" 'BEGIN { exit !(r + 0 > 0) }'; then
        local why="exit status $status"
        [ "$status" -eq 124 ] && why="timed out after 300 s"
        [ "$status" -eq 0 ] && why="printed no rate"
        echo "perf_compare: FAILED: $what: $why" >&2
        tail -5 "$out/last_error.log" >&2 || true
        failed+=("$what: $why")
        return 1
    fi
    lat=${lat:-0}
}

# Prints "rate latency_us" of one mailrail_perf run (2 ranks, one size); latency 0 without -l.
mailrail_run() {
    local substrate=$1 policy=$2 size=$3; shift 3
    local dgram=$((size > 4096 ? size : 4096)) text
    if [[ $policy == *+h || $policy == *+hc ]]; then
        [[ $policy == *+hc ]] && set -- "$@" -C
        policy=${policy%+h*}
        dgram=$((size >= 4096 ? size + 1 : 4096))
        set -- "$@" -H
    fi
    text=$(MAILRAIL_SUBSTRATE=$substrate MAILRAIL_FLOWCTL=$policy MAILRAIL_DATAGRAM_SIZE=$dgram \
        timeout -k 5 300 mpiexec -n 2 "$perf" -s "$size" -n "$count" -r 1 ${latency:+-l} "$@") || return
    awk '$1 ~ /^[0-9]+$/ { print $2, ($4 == "" ? 0 : $4) }' <<<"$text"
}

# Prints the overall result of one ucx_perftest run: TEST in ucp_am_bw (message
# rate) or ucp_am_lat (one-way latency in microseconds).
ucx_run() {
    local test=$1 size=$2 field=$3
    port=$((port + 1))
    timeout -k 5 300 ucx_perftest -t "$test" -s "$size" -n "$count" -p "$port" >/dev/null 2>&1 &
    local server=$! text status=0
    sleep 0.5
    text=$(timeout -k 5 300 ucx_perftest 127.0.0.1 -t "$test" -s "$size" -n "$count" -p "$port") ||
        status=$?
    wait "$server" || true # The client's verdict is the run's.
    [ "$status" -eq 0 ] || return "$status"
    awk -v f="$field" '/^Final:/ { print $f }' <<<"$text"
}

# Prints "rate latency_us" of the raw transport under SUBSTRATE.
baseline_run() {
    local substrate=$1 size=$2 rate lat=0
    if [ "$substrate" = ucx ]; then
        rate=$(ucx_run ucp_am_bw "$size" 9) || return
        if [ -n "$latency" ]; then lat=$(ucx_run ucp_am_lat "$size" 5) || return; fi
        echo "$rate $lat"
    else
        mailrail_run mpi none "$size" -m
    fi
}

echo "substrate,policy,bytes,round,baseline_rate,mailrail_rate,rate_ratio,baseline_latency_us,mailrail_latency_us,latency_ratio" \
    >"$out/perf.csv"
for substrate in ${substrates//,/ }; do
    for size in ${sizes//,/ }; do
        for ((r = 1; r <= rounds; r++)); do
            where="$substrate $size B round $r"
            measure "$where: the raw baseline" baseline_run "$substrate" "$size" || continue
            brate=$rate blat=$lat
            for policy in ${policies//,/ }; do
                if [ "$policy" = raw ]; then
                    measure "$where: raw" baseline_run "$substrate" "$size" || continue
                elif [ "$policy" = async ]; then
                    [ "$substrate" = mpi ] || continue # ucx_perftest is asynchronous already.
                    measure "$where: async" mailrail_run mpi none "$size" -a || continue
                else
                    measure "$where: $policy" mailrail_run "$substrate" "$policy" "$size" || continue
                fi
                mrate=$rate mlat=$lat
                awk -v s="$substrate" -v p="$policy" -v z="$size" -v r="$r" -v br="$brate" \
                    -v mr="$mrate" -v bl="$blat" -v ml="$mlat" 'BEGIN {
                    printf "%s,%s,%s,%d,%.0f,%.0f,%.3f,%.3f,%.3f,%.3f\n", s, p, z, r, br, mr,
                        (br > 0 ? mr / br : 0), bl, ml, (bl > 0 ? ml / bl : 0) }' >>"$out/perf.csv"
            done
        done
    done
done

# Median, lowest and highest ratio per substrate, policy and size.
awk -F, '
    NR == 1 { next }
    { k = $1 "/" $2 SUBSEP $3; if (!(k in n)) order[++nk] = k
      n[k]++; rr[k, n[k]] = $7; lr[k, n[k]] = $10 }
    function sort(a, m,   i, j, t) { for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } }
    function med(a, m) { return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
    END {
        print "contender,bytes,rounds,rate_ratio_median,rate_ratio_min,rate_ratio_max,latency_ratio_median,latency_ratio_min,latency_ratio_max"
        for (i = 1; i <= nk; i++) {
            k = order[i]; m = n[k]; split(k, kk, SUBSEP)
            delete a; for (t = 1; t <= m; t++) a[t] = rr[k, t]; sort(a, m)
            delete b; for (t = 1; t <= m; t++) b[t] = lr[k, t]; sort(b, m)
            printf "%s,%s,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", kk[1], kk[2], m, med(a, m), a[1], a[m], med(b, m), b[1], b[m]
        }
    }' "$out/perf.csv" >"$out/perf_summary.csv"

printf '# %s messages per run, %s interleaved rounds; ratio = MailRail / raw transport in the same round\n' \
    "$count" "$rounds"
awk -F, -v L="$latency" 'NR == 1 {
        printf "%-10s %8s %24s", "contender", "bytes", "rate ratio median (min-max)"
        if (L) printf " %27s", "latency ratio median (min-max)"
        print ""; next }
    { printf "%-10s %8s %12.3f (%.3f-%.3f)", $1, $2, $4, $5, $6
      if (L) printf " %14.3f (%.3f-%.3f)", $7, $8, $9
      print "" }' "$out/perf_summary.csv"
# One Markdown table per substrate, in the form of docs/performance.md's.
{
    printf 'Measured %s on %s (%s cores, Linux %s): `tools/perf_compare.sh -b %s -s %s -n %s -r %s -p %s -S %s%s`.\n' \
        "$(date -u +%Y-%m-%d)" "$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)" \
        "$(nproc)" "$(uname -r)" "$build" "$sizes" "$count" "$rounds" "$policies" "$substrates" \
        "${latency:+ -l}"
    for substrate in ${substrates//,/ }; do
        awk -F, -v S="$substrate" -v L="$latency" 'NR > 1 && index($1, S "/") == 1 {
            if (!head++) {
                printf "\n| %s: policy | bytes | rate ratio, median (min-max)%s |\n", S, L ? " | latency ratio, median (min-max)" : ""
                printf "| --- | ---: | ---: |%s\n", L ? " ---: |" : "" }
            split($1, c, "/")
            printf "| %s | %s | %.2f (%.2f-%.2f) |", c[2], $2, $4, $5, $6
            if (L) printf " %.2f (%.2f-%.2f) |", $7, $8, $9
            print "" }' "$out/perf_summary.csv"
    done
} >"$out/perf.md"
"$here/plot/plot_lines.sh" -i "$out/perf_summary.csv" -o "$out/perf.png" -x bytes \
    -y rate_ratio_median -l rate_ratio_min -u rate_ratio_max -g contender -L -G \
    -t "MailRail's message rate over the raw transport's, 2 ranks on one host: median of $rounds rounds, bars min-max" \
    -X "message size (bytes)" -Y "MailRail / raw transport (log scale)" -r "0.95:0.95 (the target)" >/dev/null
echo "CSV: $out/perf.csv  summary: $out/perf_summary.csv  tables: $out/perf.md  plot: $out/perf.png"
if [ ${#failed[@]} -gt 0 ]; then
    echo "perf_compare: ${#failed[@]} runs failed and are left out of the ratios:" >&2
    printf '  %s\n' "${failed[@]}" >&2
    exit 1
fi
