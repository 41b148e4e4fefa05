#!/usr/bin/env bash
# The scale sweep (docs/scale.md): for each job size, MPICH alone and then
# MailRail over each substrate, one after the other, with mailrail_scale.
# Records per rank what init, the sparse exchange and finalize cost (time,
# resident memory, descriptors, peers connected, bootstrap collectives and
# bytes) and the wall clock of each mpiexec, fits the growth of each measure
# in P (least squares on log-log), extrapolates it to 16,384 ranks and draws
# one gnuplot chart per measure.
#
#   tools/scale_sweep.sh [-b BUILD] [-o OUT] [-n 16,64,256,512,1024] [-S tcp,ucx,mpi]
#       [-p POLICY] [-d PEERS] [-m MESSAGES] [-T SECONDS] [-r]
#
#   -b  build directory (build)            -o  output directory (BUILD/scale)
#   -n  job sizes                          -S  substrates (MPICH alone always runs first)
#   -p  flow-control policy (none)         -d  peers each rank sends to (4)
#   -m  messages per peer (16)             -T  time limit per run, seconds (1800)
#   -r  only redo the fit, the table and the plots from OUT/scale.csv
#
# Every run is bounded by -T (timeout, then SIGKILL). Outputs: OUT/scale.csv
# (mailrail_scale's rows), OUT/wall.csv, OUT/fit.md and OUT/scale_*.png.
# Only complete series are fitted and plotted: a series with a failed run, or
# without a row at some size of the sweep, is left out and named. The sweep
# exits 1 when any run failed or any series was left out (the table and the
# plots of the others are still written).
set -euo pipefail

usage() { sed -n '2,20p' "$0" >&2; exit 2; }
build=build out='' sizes=16,64,256,512,1024 substrates=tcp,ucx,mpi policy=none peers=4
messages=16 limit=1800 replot=0
while getopts "b:o:n:S:p:d:m:T:r" c; do
    case $c in
        b) build=$OPTARG ;; o) out=$OPTARG ;; n) sizes=$OPTARG ;; S) substrates=$OPTARG ;;
        p) policy=$OPTARG ;; d) peers=$OPTARG ;; m) messages=$OPTARG ;; T) limit=$OPTARG ;;
        r) replot=1 ;; *) usage ;;
    esac
done
out=${out:-$build/scale}
tool=$build/tools/mailrail_scale
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"

if [ "$replot" -eq 0 ]; then
    [ -x "$tool" ] || { echo "scale_sweep: $tool is missing; build first (ninja -C $build)" >&2; exit 1; }
    command -v mpiexec >/dev/null || { echo "scale_sweep: mpiexec is missing (Debian: mpich)" >&2; exit 1; }
    # mpiexec keeps two pipes per rank, and TCP ranks one socket per peer they talk to.
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    rm -f "$out/scale.csv"
    echo "series,ranks,wall_s,status" >"$out/wall.csv"
    run() { # series ranks command...
        local series=$1 n=$2 start wall rc=0
        shift 2
        start=$(date +%s.%N)
        timeout -k 10 "$limit" "$@" >>"$out/runs.log" 2>&1 || rc=$?
        wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
        echo "$series,$n,$wall,$rc" >>"$out/wall.csv"
        printf '  %-6s %5s ranks: %7s s%s\n' "$series" "$n" "$wall" \
            "$([ "$rc" -eq 0 ] || echo " (failed: exit $rc, see $out/runs.log)")"
    }
    : >"$out/runs.log"
    IFS=, read -r -a nlist <<<"$sizes"
    IFS=, read -r -a slist <<<"$substrates"
    for n in "${nlist[@]}"; do
        echo "$n ranks:"
        run mpich "$n" mpiexec -n "$n" "$tool" -b -c "$out/scale.csv"
        for sub in "${slist[@]}"; do
            run "$sub" "$n" env MAILRAIL_SUBSTRATE="$sub" MAILRAIL_FLOWCTL="$policy" \
                MAILRAIL_TIMEOUT=600 mpiexec -n "$n" "$tool" -d "$peers" -m "$messages" -x \
                -c "$out/scale.csv"
        done
    done
fi
[ -s "$out/scale.csv" ] || { echo "scale_sweep: no rows in $out/scale.csv" >&2; exit 1; }

# The runs that failed, as "series,ranks", and every size of the sweep (from
# wall.csv; with -r and no wall.csv, the sizes scale.csv has).
incomplete=0
if [ -s "$out/wall.csv" ]; then
    awk -F, 'NR > 1 && $4 != 0 { print $1 "," $2 }' "$out/wall.csv" >"$out/failed.txt"
    awk -F, 'NR > 1 { print $2 }' "$out/wall.csv" | sort -un >"$out/sizes.txt"
else
    : >"$out/failed.txt"
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "ranks") r = i; next } { print $r }' \
        "$out/scale.csv" | sort -un >"$out/sizes.txt"
fi
while IFS=, read -r series n; do
    echo "scale_sweep: the $series run at $n ranks failed (see $out/runs.log)" >&2
    incomplete=1
done <"$out/failed.txt"

# One long table: series, ranks, measure, value, for the runs that succeeded.
# MailRail's own memory and descriptors are what mr_init() added to what
# MPI_Init left.
awk -F, -v OFS=, -v failed="$out/failed.txt" '
BEGIN { while ((getline line < failed) > 0) bad[line] = 1 }
NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; print "series,ranks,measure,value"; next }
($c["substrate"] "," $c["ranks"]) in bad { next }
$c["substrate"] == "mpich" {
    print "mpich", $c["ranks"], "init_s", $c["mpi_init_s_max"]
    if ("mpi_init_cpu_s_mean" in c) print "mpich", $c["ranks"], "init_cpu_s", $c["mpi_init_cpu_s_mean"]
    print "mpich", $c["ranks"], "rss_mb", $c["rss_mpi_mb_mean"]
    print "mpich", $c["ranks"], "fds", $c["fds_mpi_mean"]
    next
}
{
    s = $c["substrate"]
    print s, $c["ranks"], "init_s", $c["mr_init_s_max"]
    if ("mr_init_cpu_s_mean" in c) print s, $c["ranks"], "init_cpu_s", $c["mr_init_cpu_s_mean"]
    print s, $c["ranks"], "finalize_s", $c["mr_finalize_s_max"]
    print s, $c["ranks"], "rss_mb", $c["rss_init_mb_mean"] - $c["rss_mpi_mb_mean"]
    print s, $c["ranks"], "rss_end_mb", $c["rss_end_mb_mean"] - $c["rss_mpi_mb_mean"]
    print s, $c["ranks"], "fds", $c["fds_init_mean"] - $c["fds_mpi_mean"]
    print s, $c["ranks"], "fds_end", $c["fds_end_mean"] - $c["fds_mpi_mean"]
    print s, $c["ranks"], "peers_end", $c["peers_end_max"]
    print s, $c["ranks"], "init_kb", $c["init_kb_mean"]
    print s, $c["ranks"], "init_collectives", $c["init_collectives_max"]
}' "$out/scale.csv" >"$out/long_all.csv"

# Complete series only: a row at every size of the sweep.
nsizes=$(wc -l <"$out/sizes.txt")
awk -F, 'NR > 1 && !seen[$1 "," $2]++ { count[$1]++ } END { for (s in count) print s "," count[s] }' \
    "$out/long_all.csv" | sort >"$out/series.txt"
: >"$out/partial.txt"
while IFS=, read -r series count; do
    if [ "$count" -ne "$nsizes" ]; then
        echo "scale_sweep: series $series has rows at $count of $nsizes sizes; left out of the fit and the plots" >&2
        echo "$series" >>"$out/partial.txt"
        incomplete=1
    fi
done <"$out/series.txt"
awk -F, -v partial="$out/partial.txt" '
BEGIN { while ((getline line < partial) > 0) bad[line] = 1 }
NR == 1 || !($1 in bad)' "$out/long_all.csv" >"$out/long.csv"

# The fit: y = a P^b by least squares on log-log over the sizes measured, per
# series and measure, and what it gives at 16,384 ranks.
awk -F, '
NR == 1 { next }
$4 > 0 {
    k = $1 SUBSEP $3
    if (!(k in n)) order[++nk] = k
    x = log($2); y = log($4)
    n[k]++; sx[k] += x; sy[k] += y; sxx[k] += x * x; sxy[k] += x * y
    if ($2 + 0 > last[k]) { last[k] = $2 + 0; lasty[k] = $4 }
}
END {
    print "| series | measure | at the largest P | growth (b in a P^b) | at 16,384 ranks |"
    print "| --- | --- | ---: | ---: | ---: |"
    for (i = 1; i <= nk; i++) {
        k = order[i]; split(k, p, SUBSEP)
        b = n[k] > 1 && n[k] * sxx[k] - sx[k] ^ 2 > 0 ? (n[k] * sxy[k] - sx[k] * sy[k]) / (n[k] * sxx[k] - sx[k] ^ 2) : 0
        printf "| %s | %s | %.4g (P = %d) | %.2f | %.4g |\n", p[1], p[2], lasty[k], last[k], b, lasty[k] * (16384 / last[k]) ^ b
    }
}' "$out/long.csv" >"$out/fit.md"
cat "$out/fit.md"

# One chart per measure, every series on it, log-log.
plot() { # measure title ylabel
    awk -F, -v m="$1" 'NR == 1 { print "series,ranks,value"; next } $3 == m && $4 > 0 { print $1 "," $2 "," $4 }' \
        "$out/long.csv" >"$out/plot_$1.csv"
    if [ "$(wc -l <"$out/plot_$1.csv")" -gt 1 ]; then
        "$here/plot/plot_lines.sh" -i "$out/plot_$1.csv" -o "$out/scale_$1.png" -x ranks -y value \
            -g series -t "$2" -X "ranks" -Y "$3" -L -G
    fi
}
plot init_s "Init per rank: mr_init() after MPI_Init, and MPICH's MPI_Init" "seconds (slowest rank)"
plot init_cpu_s "CPU time of one rank in mr_init() (MPICH: in MPI_Init)" "CPU seconds (mean)"
plot finalize_s "mr_finalize()" "seconds (slowest rank)"
plot rss_mb "Resident memory mr_init() adds per rank (MPICH: after MPI_Init)" "MiB (mean)"
plot fds "Descriptors mr_init() adds per rank (MPICH: after MPI_Init)" "descriptors (mean)"
plot init_kb "Bytes each rank puts into the bootstrap's collectives in mr_init()" "KiB (mean)"
plot peers_end "Peers connected after the sparse exchange" "peers (most on one rank)"
echo "tables: $out/scale.csv $out/wall.csv $out/fit.md   plots: $out/scale_*.png"
if [ "$incomplete" -ne 0 ]; then
    echo "scale_sweep: some runs failed or some series are incomplete (above)" >&2
    exit 1
fi
