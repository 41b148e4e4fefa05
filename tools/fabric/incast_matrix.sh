#!/usr/bin/env bash
# The regime matrix of the incast on the emulated fabric (tools/fabric/fabric.sh):
# the three flow-control policies in every cell of incast ratio x how idle ranks
# wait x how the CPU is shared x substrate, with the issue's targets checked per
# cell. One MPI job per cell runs every trial of every policy, interleaved
# (mailrail_incast -t TRIALS -p none,rank,node: trial 0 of each policy, then
# trial 1, ...); one fabric per ratio and CPU mode runs its cells one after the
# other. Writes one CSV row per (cell, policy, trial), a summary CSV per cell and
# policy, a verdict CSV per cell, prints both as tables and draws the goodput and
# the CPU cost per policy per cell (gnuplot PNGs). Needs root, like fabric.sh.
#
#   tools/fabric/incast_matrix.sh [options]            the full matrix (the default cells)
#   tools/fabric/incast_matrix.sh --quick [options]    the CI subset
#   tools/fabric/incast_matrix.sh --loss [options]     the loss experiment
#   tools/fabric/incast_matrix.sh --list [--quick|--loss] [options]   prints the cells and
#                                                      their time bounds, runs nothing
#   tools/fabric/incast_matrix.sh --report [options]   tables, verdicts, figures again from OUT/NAME*.csv
#
# A cell is RATIO:WAIT:CPU:SUBSTRATE.
#   RATIO      senders per victim, a multiple of 4 up to 1024: four sender hosts of
#              RATIO/4 ranks and one victim host with one rank (--victim-ranks 1), as
#              in incast_sweep.sh's paper experiment. Every victim receives the same
#              data at every ratio: MESSAGES x 16 / RATIO messages of BYTES per sender
#              (default 1000 x 16 / RATIO of 4 KiB: 62.5 MiB, 2.8 s at the 200 Mbit/s
#              line, 1,000 messages per sender at 16:1, 16 at 1,024:1).
#   WAIT       how idle ranks wait: spin (mailrail_incast without -w: mr_receive() in a
#              loop), wN (mr_wait(N), -W N; w1 is -w)
#   CPU        host: each emulated host's ranks in a CPU cgroup of equal weight
#              (fabric.sh --cpu host); shared: one pool of cores for all (--cpu shared)
#   SUBSTRATE  tcp (MailRail's TCP substrate) or ucx (UCX's TCP transport), fabric.sh
#              --substrate
#
# The full matrix (no --cells, --ratios, --waits, --cpus or --substrates): 29 cells,
# run from the smallest ratio up, bounded by --budget (an hour):
#   16:1 and 64:1   all 12 cells: spin, w1, w100 x host, shared x tcp, ucx
#   256:1           w100 host tcp, w1 host tcp, w100 host ucx, w100 shared tcp
#   1024:1          w100 host tcp
# Measured on the 2-core machine on 2026-12-07 (m18, docs/incast.md): the 28 cells up
# to 256:1 took 2,380 s (a 16:1 cell about 36 s, a 64:1 cell 1.5 minutes, a 256:1
# cell 3), the 1,024:1 cell 1,186 s: MPICH's start and end of 1,025 ranks about 680
# s, each trial of each policy 46 to 67 s. On a machine of the same kind later that
# day (mh1) all 29 cells took 2,613 s in one run, the 1,024:1 cell 571 s. So the
# whole matrix takes up to an hour, and the 1,024:1 cell gets what the other cells
# left of the budget: it is run when that covers MPICH's start and one trial
# (job_start below), and a cell cut short keeps the trials it finished. Alone:
# --cells 1024:w100:host:tcp (10 to 20 minutes).
# Not in it, and why:
#   - spinning from 256:1 on: 257 ranks that never sleep on 2 cores leave each
#     rank, the victim included, a few milliseconds of CPU now and then; a cell
#     would take tens of minutes and measure the scheduler;
#   - mr_wait(1) at 1,024:1: 1,025 ranks waking every millisecond are a million
#     wake-ups a second (at 256:1 they took both cores, docs/incast.md);
#   - --cpu shared at 1,024:1: the victim, one process of 1,025, gets 1/1,025 of
#     the cores (docs/incast.md measured 0.015 of a core at 256:1);
#   - for time only: 1,024:1 over UCX (mr_init over UCX takes 140 s at 1,024 ranks,
#     docs/scale.md: about 30 minutes for one cell), and at 256:1 w1 host ucx, w1
#     shared tcp and ucx, w100 shared ucx (3 to 4 minutes each). Run them with
#       tools/fabric/incast_matrix.sh --name matrix_more \
#           --cells "256:w1:host:ucx 256:w1:shared:tcp 256:w1:shared:ucx 256:w100:shared:ucx"
#       tools/fabric/incast_matrix.sh --name matrix_1024_ucx --cells 1024:w100:host:ucx
#     and, to read them with the rest, append their rows (without the header) to
#     OUT/matrix.csv and OUT/matrix_cells.csv and run --report.
# With --ratios, --waits, --cpus or --substrates (lists; defaults "16 64 256 1024",
# "spin w1 w100", "host shared", "tcp ucx") the cells are their cross product, less
# the first three exclusions above unless --all-cells.
#
# Bounds. Every job is bounded by fabric.sh --timeout: per ratio, 30 + 0.55 x RATIO
# seconds to start and 20 + 0.21 x RATIO + RATIO^2 / 1500 per trial and policy
# (3 trials of 3 policies: 245 s at 16:1, 380 s at 64:1, 1,214 s at 256:1, 8,999 s
# at 1,024:1, where a trial and policy took about 650 s before mr_init() napped),
# or --job-timeout. A job that reaches it is stopped and its cell marked "timed
# out"; the trials it finished count (the incast tool writes each trial's row at
# once). The whole run is bounded by --budget seconds (default 3600): each fabric
# gets what is left as its --total-timeout and each job at most that; a fabric
# that cannot finish the first trial of its ratio in what is left, as expected
# (job_start below), is not built, and its cells are marked "not run: budget". At
# most one fabric at a time, at most as many jobs per fabric as it has cells
# (--max-jobs). All traffic stays inside the namespaces fabric.sh creates and
# removes (on exit, failure, Ctrl-C and its time limit).
#
# The targets, per cell (NAME_verdicts.csv; each "pass", "spread", "FAIL" or "n/a"):
#   node >= none   pass: node's median goodput >= none's median; spread: below it,
#                  but node's best trial >= none's worst (met within the spread of the
#                  trials); FAIL: node's best trial < none's worst. With one trial
#                  (--quick) pass or FAIL.
#   node >= rank   the same against rank.
#   node >= 85%    cells with --cpu host only: pass: node's median >= 85% of the line
#                  rate; spread: node's best trial is; FAIL otherwise. n/a with shared.
# The targets are met where the verdict is pass or spread; --strict counts spread
# as FAIL.
#
# The loss experiment (--loss): chaos.sh's 5% loss (tools/fabric/chaos.sh loss5:
# iptables-legacy -A INPUT -m statistic --mode random --probability 0.05 -j DROP in
# every host's namespace, both ways) and its layout (4 sender hosts x 4 ranks, one
# victim, 300 messages of 4 KiB per sender, idle ranks in mr_wait(10) as
# mailrail_chaos), none and node, TRIALS interleaved trials per substrate (tcp and
# ucx, --substrates) in one fabric with CPU per host. Reports node's median time
# over none's: target at most 1.3 (pass; spread: node's best trial is within 1.3
# times none's worst; FAIL), in matrix_loss.csv and matrix_loss_summary.csv. Needs
# iptables-legacy (Debian: iptables).
#
# The CI subset (--quick): cells 64:w100:host:tcp and 256:w100:host:tcp, one trial of
# none and node, the full data (250 and 63 messages per sender: with half of it a
# 256:1 trial lasted 1.5 s, mostly the adaptive window's start, and node lost to
# none once in CI), --budget 420; exits 1 unless both cells ran and node >= none
# (pass) in both. It takes about 100 to 160 s on the 2-core machine
# (docs/incast.md), most of it the start of the 257-rank job.
#
# Output (OUT/NAME*, NAME matrix, matrix_quick or matrix_loss unless --name):
#   NAME.csv           ratio,wait,cpu,substrate,policy,trial,seconds,goodput_mbps,
#                      line_fraction,cpu_s_per_mib,port_drops,credit_returns,cpu_s,
#                      messages_per_sender,bytes,ranks,victim_peak_recv_slots,
#                      init_s,connect_s,around_s,checks_s,finalize_s,start_skew_s,
#                      span_s
#                      (goodput: bits received by the victim over the trial's time;
#                      line_fraction: goodput over the line rate; cpu_s: CPU seconds
#                      of all ranks in the timed part, getrusage; port_drops: the
#                      victim's switch port during the trial; init_s to finalize_s:
#                      the slowest rank's seconds outside the clock, mailrail_incast's
#                      phases; start_skew_s: how long after the first rank the last
#                      started its clock; span_s: the first start to the last end)
#   NAME_cells.csv     ratio,wait,cpu,substrate,status,trials_done,job_seconds; status
#                      ok, timed out, failed (status N), failed: the fabric ended
#                      with status N, not run: budget, not run: interrupted, stopped:
#                      interrupted; trials_done counts rows (policy x trial)
#   NAME_summary.csv   per cell and policy: median, min and max of goodput, line
#                      fraction, seconds, CPU per MiB; medians of drops and returns
#   NAME_verdicts.csv  per cell: status and the three verdicts, with node/none,
#                      node/rank and node's line fraction (medians)
#   NAME_job_KEY.out   the whole output of a cell's job that did not end ok, or of every
#                      cell's job with --keep-output (KEY is
#                      the cell with _ for :)
#   NAME.png, NAME_cpu.png   goodput and CPU seconds per MiB per policy per cell
#
# Options:
#   -o DIR            output directory (default build/incast)
#   --name NAME       output names (default matrix; matrix_quick, matrix_loss)
#   -t TRIALS         trials per policy per cell (default 3; --quick 1)
#   -m MESSAGES       x 16 / RATIO messages per sender (default 1000);
#                     --loss: messages per sender (default 300)
#   -b BYTES          message size (default 4096)
#   -p POLICIES       comma-separated (default none,rank,node; --quick, --loss none,node)
#   --cells LIST      the cells, RATIO:WAIT:CPU:SUBSTRATE, space- or comma-separated
#   --ratios LIST     --waits LIST  --cpus LIST  --substrates LIST   (see above)
#   --all-cells       do not leave out the hopeless cells (spin from 256:1 on, ...)
#   --build DIR       the meson build directory (default build)
#   --rate RATE       the line rate (default 200mbit); --buffer SIZE the victim port (32kb)
#   --job-timeout S   each job's bound instead of the per-ratio one
#   --budget S        the whole run's bound (default 3600; --quick 420)
#   --strict          a verdict "spread" counts as FAIL
#   --keep-output     keep every job's whole output (NAME_job_KEY.out), not only a failed
#                     one's: the ranks' log lines, e.g. with MAILRAIL_LOG_LEVEL=debug the
#                     victim's credit window per epoch (docs/flowctl.md)
# Exit status: 0 when every job ran (the full matrix reports its verdicts but does
# not fail on them; timed-out and budget-cut cells are reported, not failures);
# 1 when a job failed (a rank's error, a verification), or with --quick when a
# cell did not complete or node < none in one; 2 on a usage error or refusal; 130
# when interrupted (the running fabric is torn down).

# --- Inside fabric.sh (sourced by --script with --jobs): one fabric's cells. ---
# Each cell's job writes its rows to TMP/cell.KEY.csv and its status to
# TMP/status.KEY; the driver reads both, whatever became of the fabric.
matrix_wait_flags() {
    case $1 in
        spin) echo "" ;;
        w1) echo "-w" ;;
        w*) echo "-W ${1#w}" ;;
    esac
}
matrix_jobs() {
    local ratio=$1 cpu=$2 cells=$3 messages=$4 trials=$5 policies=$6 bytes=$7 tmp=$8
    local build=$9 job_timeout=${10} loss=${11:-0} cell sub wait key rc t0 secs h flags
    if [ "$loss" != 0 ]; then
        # chaos.sh's loss5: random drops on INPUT in every host, both ways.
        for ((h = 0; h < FABRIC_HOSTS; h++)); do
            fabric_exec "$h" iptables-legacy -A INPUT -m statistic --mode random \
                --probability "$loss" -j DROP ||
                { echo "incast_matrix: cannot set the loss in host $h" >&2; return 1; }
        done
    fi
    for cell in $cells; do
        IFS=: read -r _ wait _ sub <<<"$cell"
        key=${cell//:/_}
        flags=$(matrix_wait_flags "$wait")
        fabric_substrate "$sub"
        rm -f "$tmp/cell.$key.csv"
        echo "running" >"$tmp/status.$key"
        t0=$SECONDS rc=0
        # shellcheck disable=SC2086
        fabric_run "matrix-$key" "$build/tools/mailrail_incast" -V @VICTIMS@ -m "$messages" \
            -b "$bytes" -t "$trials" -p "$policies" -s 1 $flags -q -c "$tmp/cell.$key.csv" \
            -P "$FABRIC_PORT_COUNTERS" >"$tmp/job.$key.out" 2>&1 || rc=$?
        secs=$((SECONDS - t0))
        grep -E "^mailrail_incast|elsewhere|exited with" "$tmp/job.$key.out" | sed "s/^/  $cell: /"
        if [ "$rc" -eq 0 ]; then
            echo "ok $secs" >"$tmp/status.$key"
        elif [ "$secs" -ge $((job_timeout - 5)) ]; then
            echo "timed out $secs" >"$tmp/status.$key"
        else
            echo "failed (status $rc) $secs" >"$tmp/status.$key"
            tail -20 "$tmp/job.$key.out" | sed "s/^/  $cell: /" >&2
        fi
    done
    return 0
}
if [ "${1:-}" = "--jobs" ]; then
    shift
    matrix_jobs "$@"
    return $?
fi

# --- The driver. ---
set -euo pipefail
usage() { sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "incast_matrix: $*" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=build/incast name='' trials='' messages='' bytes=4096 policies='' build=build
rate=200mbit buffer=32kb cells_opt='' ratios='' waits='' cpus='' substrates='' all_cells=0
job_timeout_opt='' budget='' strict=0 mode=matrix list=0 keep_output=0
while [ $# -gt 0 ]; do
    case $1 in
        -o) out=$2; shift 2 ;;
        --name) name=$2; shift 2 ;;
        -t) trials=$2; shift 2 ;;
        -m) messages=$2; shift 2 ;;
        -b) bytes=$2; shift 2 ;;
        -p) policies=$2; shift 2 ;;
        --cells) cells_opt=$2; shift 2 ;;
        --ratios) ratios=$2; shift 2 ;;
        --waits) waits=$2; shift 2 ;;
        --cpus) cpus=$2; shift 2 ;;
        --substrates) substrates=$2; shift 2 ;;
        --all-cells) all_cells=1; shift ;;
        --build) build=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --buffer) buffer=$2; shift 2 ;;
        --job-timeout) job_timeout_opt=$2; shift 2 ;;
        --budget) budget=$2; shift 2 ;;
        --strict) strict=1; shift ;;
        --keep-output) keep_output=1; shift ;;
        --list) list=1; shift ;;
        --quick|--loss|--report)
            [ "$mode" = matrix ] || { echo "incast_matrix: --$mode and $1 exclude each other" >&2; exit 2; }
            mode=${1#--}; shift ;;
        -h|--help) usage ;;
        *) echo "incast_matrix: unknown option $1" >&2; usage ;;
    esac
done
is_uint() { case $1 in ''|*[!0-9]*) return 1 ;; esac; }
case $mode in
    quick) : "${name:=matrix_quick}" "${trials:=1}" "${budget:=420}" "${messages:=1000}" "${policies:=none,node}"
           [ -n "$cells_opt$ratios$waits$cpus$substrates" ] ||
               cells_opt="64:w100:host:tcp 256:w100:host:tcp" ;;
    loss) : "${name:=matrix_loss}" "${policies:=none,node}" "${messages:=300}" ;;
esac
: "${name:=matrix}" "${trials:=3}" "${messages:=1000}" "${budget:=3600}" "${policies:=none,rank,node}"
for v in trials messages bytes budget; do
    is_uint "${!v}" && [ "${!v}" -ge 1 ] || die "${v}: '${!v}' is not a positive integer"
done
[ -z "$job_timeout_opt" ] || { is_uint "$job_timeout_opt" && [ "$job_timeout_opt" -ge 1 ]; } ||
    die "--job-timeout: '$job_timeout_opt' is not a positive integer"
[ "$trials" -le 64 ] || die "-t: at most 64 trials (mailrail_incast)"
case $name in ''|*[!A-Za-z0-9_.-]*) die "--name: letters, digits, _ . - only" ;; esac
line_mbps=$(awk -v r="$rate" 'BEGIN { v = r + 0; if (r ~ /gbit/) v *= 1000; else if (r ~ /kbit/) v /= 1000; print v }')
awk -v v="$line_mbps" 'BEGIN { exit !(v > 0) }' || die "--rate: '$rate' is not a rate (e.g. 200mbit)"

# The cells.
hopeless() { # RATIO WAIT CPU: the cells no run should spend its hour on
    [ "$all_cells" = 1 ] && return 1
    { [ "$2" = spin ] && [ "$1" -gt 64 ]; } || { [ "$2" = w1 ] && [ "$1" -gt 256 ]; } ||
        { [ "$3" = shared ] && [ "$1" -gt 256 ]; }
}
check_cell() {
    local r w c s
    IFS=: read -r r w c s <<<"$1"
    is_uint "$r" && [ "$r" -ge 4 ] && [ "$r" -le 1024 ] && [ $((r % 4)) -eq 0 ] ||
        die "cell $1: the ratio must be a multiple of 4 from 4 to 1024"
    case $w in spin) ;; w*) is_uint "${w#w}" && [ "${w#w}" -le 60000 ] || die "cell $1: wait spin or wN (N ms)" ;;
        *) die "cell $1: wait spin or wN (N ms)" ;; esac
    case $c in host|shared) ;; *) die "cell $1: cpu host or shared" ;; esac
    case $s in tcp|ucx) ;; *) die "cell $1: substrate tcp or ucx" ;; esac
}
cells=()
if [ "$mode" = loss ]; then
    for s in ${substrates:-tcp ucx}; do s=${s//,/ }; for x in $s; do cells+=("16:w10:host:$x"); done; done
elif [ -n "$cells_opt" ]; then
    for c in ${cells_opt//,/ }; do cells+=("$c"); done
elif [ -n "$ratios$waits$cpus$substrates" ]; then
    for r in ${ratios:-16 64 256 1024}; do r=${r//,/ }; for r1 in $r; do
        for c in ${cpus:-host shared}; do c=${c//,/ }; for c1 in $c; do
            for s in ${substrates:-tcp ucx}; do s=${s//,/ }; for s1 in $s; do
                for w in ${waits:-spin w1 w100}; do w=${w//,/ }; for w1 in $w; do
                    is_uint "$r1" || die "--ratios: '$r1' is not a number"
                    hopeless "$r1" "$w1" "$c1" || cells+=("$r1:$w1:$c1:$s1")
                done; done
            done; done
        done; done
    done; done
else
    for r in 16 64; do for c in host shared; do for s in tcp ucx; do for w in spin w1 w100; do
        cells+=("$r:$w:$c:$s")
    done; done; done; done
    cells+=(256:w100:host:tcp 256:w1:host:tcp 256:w100:host:ucx 256:w100:shared:tcp 1024:w100:host:tcp)
fi
[ "$mode" = report ] || [ ${#cells[@]} -gt 0 ] || die "no cells to run"
[ ${#cells[@]} -le 96 ] || die "at most 96 cells in one run (here ${#cells[@]})"
for c in "${cells[@]}"; do check_cell "$c"; done
# Sorted into fabrics: the smallest ratio first (a 1,024:1 cell alone can take the
# whole budget), then host before shared, keeping the given order within.
mapfile -t cells < <(for i in "${!cells[@]}"; do
    IFS=: read -r r _ c _ <<<"${cells[$i]}"
    printf '%05d %d %05d %s\n' "$r" "$([ "$c" = host ] && echo 0 || echo 1)" "$i" "${cells[$i]}"
done | sort -k1,1n -k2,2n -k3,3n | awk '!seen[$4]++ { print $4 }')

# Each job's bound (seconds) for RATIO and the trials of every policy.
npolicies=$(awk -F, '{ print NF }' <<<"$policies")
job_bound() {
    if [ -n "$job_timeout_opt" ]; then echo "$job_timeout_opt"; return; fi
    echo $((30 + $1 * 55 / 100 + trials * npolicies * $(trial_bound "$1")))
}
# One trial of one policy at RATIO: mr_init(), connecting, the run, mr_finalize().
trial_bound() { echo $((20 + $1 * 21 / 100 + $1 * $1 / 1500)); }
# What a fabric of RATIO needs before its first trial ends, as expected rather than
# bounded: the start plus a quarter of the trial's bound (at 1,024:1, 826 s; measured
# 680 s and 46-67 s, while the bound is 934 s per trial).
job_start() { echo $((30 + $1 * 55 / 100 + $(trial_bound "$1") / 4)); }

if [ "$list" = 1 ]; then
    echo "incast_matrix: ${#cells[@]} cell(s), $trials trial(s) of $policies each, budget $budget s:"
    total=0
    for c in "${cells[@]}"; do
        b=$(job_bound "${c%%:*}"); total=$((total + b))
        printf '  %-22s job bound %5d s\n' "$c" "$b"
    done
    echo "  sum of the job bounds $total s (the run stops at the budget, $budget s)"
    exit 0
fi

# Refusals, before anything is created.
if [ "$mode" != report ]; then
    [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, tc; tools/fabric/fabric.sh)"
    for t in ip tc ethtool unshare timeout mpiexec; do
        command -v "$t" >/dev/null 2>&1 ||
            die "'$t' is missing (Debian packages: iproute2 ethtool util-linux coreutils mpich)"
    done
    if [ "$mode" = loss ]; then
        command -v iptables-legacy >/dev/null 2>&1 || die "'iptables-legacy' is missing (Debian package: iptables)"
    fi
    [ -d "$build" ] || die "no build directory $build"
    build=$(cd "$build" && pwd)
    [ -x "$build/tools/mailrail_incast" ] || die "no $build/tools/mailrail_incast; build first (ninja -C $build)"
fi
command -v gnuplot >/dev/null 2>&1 || [ "$mode" = loss ] || die "'gnuplot' is missing (Debian package: gnuplot-nox)"
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d /tmp/incast_matrix.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

rows_header="ratio,wait,cpu,substrate,policy,trial,seconds,goodput_mbps,line_fraction,cpu_s_per_mib,port_drops,credit_returns,cpu_s,messages_per_sender,bytes,ranks,victim_peak_recv_slots,init_s,connect_s,around_s,checks_s,finalize_s,start_skew_s,span_s"
cells_header="ratio,wait,cpu,substrate,status,trials_done,job_seconds"

# One cell's rows from the incast tool's CSV (read by column name).
cell_rows() {
    local cell=$1 csv=$2 r w c s
    IFS=: read -r r w c s <<<"$cell"
    [ -s "$csv" ] || return 0
    awk -F, -v r="$r" -v w="$w" -v c="$c" -v s="$s" -v line="$line_mbps" '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        {
            g = $col["goodput_gbps"] * 1000
            phases = ""
            split("init_s connect_s around_s checks_s finalize_s start_skew_s span_s", ph, " ")
            for (i = 1; i <= 7; i++) phases = phases "," ((ph[i] in col) ? $col[ph[i]] : "")
            printf "%d,%s,%s,%s,%s,%d,%.6f,%.2f,%.4f,%s,%d,%d,%s,%d,%d,%d,%d%s\n", r, w, c, s,
                $col["policy"], $col["trial"] + 1, $col["seconds"], g, g / line,
                ("cpu_s_per_mib" in col) ? $col["cpu_s_per_mib"] : "", $col["port_drops"],
                $col["credit_returns"], ("cpu_s" in col) ? $col["cpu_s"] : "",
                $col["messages_per_rank"], $col["bytes"], $col["ranks"], $col["victim_peak_recv_slots"],
                phases
        }' "$csv"
}

# Runs the cells of one fabric (one ratio, one CPU mode); appends rows and statuses.
deadline=$((SECONDS + budget)) stop=0 fabric_pid=
on_stop() {
    stop=1
    echo "incast_matrix: interrupted; stopping the fabric" >&2
    if [ -n "$fabric_pid" ]; then kill -TERM "$fabric_pid" 2>/dev/null || true; fi
}
trap on_stop INT TERM
run_fabric() {
    local ratio=$1 cpu=$2 loss=$3 msgs key st secs left bound total rc=0 c n t0
    shift 3
    local fcells=("$@")
    left=$((deadline - SECONDS))
    msgs=$messages
    [ "$loss" != 0 ] || { msgs=$(((messages * 16 + ratio / 2) / ratio)); [ "$msgs" -ge 1 ] || msgs=1; }
    if [ "$stop" = 1 ] || [ "$left" -lt "$(job_start "$ratio")" ]; then
        st="not run: budget"
        [ "$stop" = 1 ] && st="not run: interrupted"
        for c in "${fcells[@]}"; do echo "${c//:/,},$st,0,0" >>"$out/${name}_cells.csv"; done
        echo "== $ratio:1, cpu $cpu: $st ($left s left of the budget)"
        return 0
    fi
    bound=$(job_bound "$ratio")
    [ "$bound" -le "$left" ] || bound=$left
    total=$((${#fcells[@]} * (bound + 30) + 120))
    [ "$total" -le "$left" ] || total=$left
    echo "== $ratio:1 ($((ratio + 1)) ranks: 4 hosts x $((ratio / 4)), victim host x 1), cpu $cpu," \
        "$msgs x $bytes B per sender, $trials trial(s) of $policies per cell: ${fcells[*]}"
    # Hundreds of ranks per core finish their collectives slowly (docs/scale.md).
    if [ "$ratio" -ge 256 ]; then export MAILRAIL_TIMEOUT=${MAILRAIL_TIMEOUT:-600}; fi
    # In the background, so that a signal reaches this script at once and is passed on
    # (fabric.sh tears down on SIGTERM).
    t0=$SECONDS
    "$here/fabric.sh" -q -H 5 -R $((ratio / 4)) -V 1 --victim-ranks 1 --rate "$rate" \
        --buffer "$buffer" --cpu "$cpu" --timeout "$bound" --total-timeout "$total" \
        --max-jobs "${#fcells[@]}" --script "$0" --jobs "$ratio" "$cpu" "${fcells[*]}" "$msgs" \
        "$trials" "$policies" "$bytes" "$tmp" "$build" "$bound" "$loss" &
    fabric_pid=$!
    wait "$fabric_pid" || rc=$?
    while kill -0 "$fabric_pid" 2>/dev/null; do rc=0; wait "$fabric_pid" || rc=$?; done
    fabric_pid=
    # What ended the fabric early, for the cells it did not finish.
    local why="failed: the fabric ended with status $rc" why_job=''
    if [ "$stop" = 1 ]; then why="not run: interrupted" why_job="stopped: interrupted"
    elif [ $((SECONDS - t0)) -ge $((total - 5)) ]; then why="not run: budget" why_job="timed out"
    fi
    [ "$rc" -eq 0 ] || echo "incast_matrix: the fabric of $ratio:1, cpu $cpu ended with status $rc" >&2
    for c in "${fcells[@]}"; do
        key=${c//:/_}
        n=0
        if [ -s "$tmp/cell.$key.csv" ]; then n=$(($(wc -l <"$tmp/cell.$key.csv") - 1)); fi
        cell_rows "$c" "$tmp/cell.$key.csv" >>"$out/$name.csv"
        if [ -r "$tmp/status.$key" ]; then
            read -r st <"$tmp/status.$key"
            case $st in
                running) st=${why_job:-$why} secs=0 ;;
                *) secs=${st##* }; st=${st% *} ;;
            esac
        else
            st=$why secs=0
        fi
        echo "${c//:/,},$st,$n,$secs" >>"$out/${name}_cells.csv"
        # A job that did not end well keeps its whole output, for a post-mortem.
        if [ -s "$tmp/job.$key.out" ] && { [ "$st" != ok ] || [ "$keep_output" = 1 ]; }; then
            cp "$tmp/job.$key.out" "$out/${name}_job_$key.out"
            [ "$st" = ok ] ||
                echo "incast_matrix: $c: $st; its output is in $out/${name}_job_$key.out" >&2
        fi
    done
}

# Median, min, max per cell and policy; then the verdicts per cell. Cells by ratio.
summarize() {
    { head -1 "$out/${name}_cells.csv"; tail -n +2 "$out/${name}_cells.csv" | sort -t, -k1,1n -s; } \
        >"$tmp/cells_sorted.csv"
    awk -F, -v strict="$strict" -v line="$line_mbps" -v sum="$out/${name}_summary.csv" \
        -v ver="$out/${name}_verdicts.csv" '
    function sort(a, m,   i, j, t) { for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } }
    function med(a, m) { return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
    function stats(v, k, m,   t, a) {
        delete a; for (t = 1; t <= m; t++) a[t] = v[k, t]; sort(a, m)
        LO = a[1]; HI = a[m]; return med(a, m)
    }
    # node against OTHER in cell C: pass, spread or FAIL (n/a without both).
    function versus(C, other,   kn, ko) {
        kn = C SUBSEP "node"; ko = C SUBSEP other
        if (!(kn in gm) || !(ko in gm)) return "n/a"
        if (gm[kn] >= gm[ko]) return "pass"
        if (ghi[kn] >= glo[ko]) return strict ? "FAIL" : "spread"
        return "FAIL"
    }
    FNR == 1 { file++; for (i = 1; i <= NF; i++) col[file, $i] = i; next }
    file == 1 {   # NAME_cells.csv
        C = $1 "," $2 "," $3 "," $4
        if (!(C in status)) cells[++nc] = C
        status[C] = $5
        next
    }
    {             # NAME.csv
        C = $col[2, "ratio"] "," $col[2, "wait"] "," $col[2, "cpu"] "," $col[2, "substrate"]
        p = $col[2, "policy"]; k = C SUBSEP p
        if (!(C in status)) { cells[++nc] = C; status[C] = "?" }
        if (!(C SUBSEP p in np)) { pol[C, ++npc[C]] = p; np[C, p] = 1 }
        n[k]++
        g[k, n[k]] = $col[2, "goodput_mbps"]; s[k, n[k]] = $col[2, "seconds"]
        f[k, n[k]] = $col[2, "line_fraction"]; d[k, n[k]] = $col[2, "port_drops"]
        r[k, n[k]] = $col[2, "credit_returns"]
        if ($col[2, "cpu_s_per_mib"] != "") { ncpu[k]++; cpu[k, ncpu[k]] = $col[2, "cpu_s_per_mib"] }
    }
    END {
        print "ratio,wait,cpu,substrate,cell,policy,trials,goodput_median_mbps,goodput_min_mbps,goodput_max_mbps,line_fraction_median,seconds_median,seconds_min,seconds_max,cpu_s_per_mib_median,cpu_s_per_mib_min,cpu_s_per_mib_max,port_drops_median,credit_returns_median,status" > sum
        print "ratio,wait,cpu,substrate,status,node_over_none,node_vs_none,node_over_rank,node_vs_rank,node_line_fraction,node_vs_85pct_line" > ver
        for (i = 1; i <= nc; i++) {
            C = cells[i]; split(C, cc, ",")
            label = cc[1] ":1 " cc[2] " " cc[3] " " cc[4]
            for (j = 1; j <= npc[C]; j++) {
                p = pol[C, j]; k = C SUBSEP p; m = n[k]
                gm[k] = stats(g, k, m); glo[k] = LO; ghi[k] = HI
                fm = stats(f, k, m)
                sm = stats(s, k, m); slo = LO; shi = HI
                dm = stats(d, k, m); rm = stats(r, k, m)
                cm = clo = chi = ""
                if (ncpu[k]) { cm = sprintf("%.4f", stats(cpu, k, ncpu[k])); clo = sprintf("%.4f", LO); chi = sprintf("%.4f", HI) }
                printf "%s,%s,%s,%d,%.1f,%.1f,%.1f,%.3f,%.3f,%.3f,%.3f,%s,%s,%s,%d,%d,%s\n", C, label, p, m,
                    gm[k], glo[k], ghi[k], fm, sm, slo, shi, cm, clo, chi, dm, rm, status[C] > sum
            }
            kn = C SUBSEP "node"
            on = (kn in gm && (C SUBSEP "none") in gm && gm[C SUBSEP "none"] > 0) ? sprintf("%.2f", gm[kn] / gm[C SUBSEP "none"]) : ""
            orr = (kn in gm && (C SUBSEP "rank") in gm && gm[C SUBSEP "rank"] > 0) ? sprintf("%.2f", gm[kn] / gm[C SUBSEP "rank"]) : ""
            lf = (kn in gm) ? sprintf("%.3f", gm[kn] / line) : ""
            lv = "n/a"
            if (cc[3] == "host" && (kn in gm)) lv = gm[kn] >= 0.85 * line ? "pass" : (ghi[kn] >= 0.85 * line ? (strict ? "FAIL" : "spread") : "FAIL")
            printf "%s,%s,%s,%s,%s,%s,%s,%s\n", C, status[C], on, versus(C, "none"), orr, versus(C, "rank"), lf, lv > ver
        }
    }' "$tmp/cells_sorted.csv" "$out/$name.csv"
}

# Prints a CSV as a table, columns aligned (awk: `column` is not on every Debian machine).
table() {
    awk -F, -v skip="${2:-}" '
        NR == 1 { n = split(skip, sk, " "); for (i = 1; i <= NF; i++) for (j = 1; j <= n; j++) if ($i == sk[j]) drop[i] = 1 }
        { for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (!(i in drop) && length($i) > w[i]) w[i] = length($i) }
          if (NF > nf) nf = NF }
        END { for (r = 1; r <= NR; r++) { for (i = 1; i <= nf; i++) if (!(i in drop)) printf "%-*s ", w[i], c[r, i]; print "" } }' "$1"
}

report() {
    [ -r "$out/$name.csv" ] && [ -r "$out/${name}_cells.csv" ] ||
        die "no $out/$name.csv and $out/${name}_cells.csv to report on"
    summarize
    echo
    echo "Per cell and policy ($out/${name}_summary.csv; goodput Mbit/s, line $line_mbps Mbit/s):"
    table "$out/${name}_summary.csv" "cell seconds_min seconds_max cpu_s_per_mib_min cpu_s_per_mib_max"
    echo
    echo "Verdicts per cell ($out/${name}_verdicts.csv; met: pass or spread$([ "$strict" = 1 ] && echo ", --strict: pass only")):"
    table "$out/${name}_verdicts.csv"
    if [ "$(awk 'END { print NR }' "$out/${name}_summary.csv")" -gt 1 ]; then
        "$root/tools/plot/plot_bars.sh" -i "$out/${name}_summary.csv" -o "$out/$name.png" -c cell \
            -g policy -y goodput_median_mbps -l goodput_min_mbps -u goodput_max_mbps \
            -t "Incast regime matrix ($rate port, $buffer buffer): goodput, median of the trials, bars min-max" \
            -Y "goodput at the victim (Mbit/s)" -r "$line_mbps:line rate $rate" \
            -r "$(awk -v l="$line_mbps" 'BEGIN { print 0.85 * l }'):85% of the line rate"
        if awk -F, 'NR > 1 && $15 != "" { f = 1 } END { exit !f }' "$out/${name}_summary.csv"; then
            "$root/tools/plot/plot_bars.sh" -i "$out/${name}_summary.csv" -o "$out/${name}_cpu.png" -c cell \
                -g policy -y cpu_s_per_mib_median -l cpu_s_per_mib_min -u cpu_s_per_mib_max \
                -t "Incast regime matrix: CPU seconds of all ranks per MiB delivered, median, bars min-max" \
                -Y "CPU s per MiB (all ranks)"
        fi
    fi
}

# The loss experiment's summary: node's time over none's per substrate.
loss_report() {
    awk -F, -v sum="$out/${name}_summary.csv" -v strict="$strict" '
    function sort(a, m,   i, j, t) { for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } }
    function med(a, m) { return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
        sb = $col["substrate"]; p = $col["policy"]; k = sb SUBSEP p
        if (!(sb in seen)) { subs[++ns] = sb; seen[sb] = 1 }
        n[k]++; t[k, n[k]] = $col["seconds"]
    }
    END {
        print "substrate,none_trials,none_seconds_median,none_seconds_min,none_seconds_max,node_trials,node_seconds_median,node_seconds_min,node_seconds_max,node_over_none,target,verdict" > sum
        for (i = 1; i <= ns; i++) {
            sb = subs[i]
            for (q = 1; q <= 2; q++) {
                p = q == 1 ? "none" : "node"; k = sb SUBSEP p; m = n[k]
                delete a; for (j = 1; j <= m; j++) a[j] = t[k, j]; sort(a, m)
                md[p] = m ? med(a, m) : 0; lo[p] = a[1]; hi[p] = a[m]; cnt[p] = m
            }
            if (!cnt["none"] || !cnt["node"]) { v = "n/a"; r = "" }
            else {
                r = sprintf("%.2f", md["node"] / md["none"])
                v = md["node"] <= 1.3 * md["none"] ? "pass" : (lo["node"] <= 1.3 * hi["none"] ? (strict ? "FAIL" : "spread") : "FAIL")
            }
            printf "%s,%d,%.3f,%.3f,%.3f,%d,%.3f,%.3f,%.3f,%s,1.3,%s\n", sb, cnt["none"], md["none"], lo["none"], hi["none"],
                cnt["node"], md["node"], lo["node"], hi["node"], r, v > sum
        }
    }' "$out/$name.csv"
    echo
    echo "Under 5% loss ($out/${name}_summary.csv; seconds; target node / none <= 1.3):"
    table "$out/${name}_summary.csv"
}

if [ "$mode" = report ]; then
    report
    exit 0
fi

echo "$rows_header" >"$out/$name.csv"
echo "$cells_header" >"$out/${name}_cells.csv"
t_start=$SECONDS
if [ "$mode" = loss ]; then
    echo "== loss 5% (chaos.sh loss5), 16:1, $messages x $bytes B per sender, $trials trial(s) of $policies"
    run_fabric 16 host 0.05 "${cells[@]}"
    loss_report
else
    # One fabric per ratio and CPU mode, in the order of the sorted cells.
    i=0
    while [ "$i" -lt ${#cells[@]} ]; do
        IFS=: read -r r _ c _ <<<"${cells[$i]}"
        group=()
        while [ "$i" -lt ${#cells[@]} ]; do
            IFS=: read -r r2 _ c2 _ <<<"${cells[$i]}"
            [ "$r2" = "$r" ] && [ "$c2" = "$c" ] || break
            group+=("${cells[$i]}")
            i=$((i + 1))
        done
        run_fabric "$r" "$c" 0 "${group[@]}"
    done
    report
fi
echo
echo "wall time $((SECONDS - t_start)) s; CSV: $out/$name.csv"

# Exit status: failed jobs; --quick also a cell that did not complete or node < none.
status=0
[ "$stop" = 0 ] || exit 130
if awk -F, 'NR > 1 && $5 ~ /^failed/ { f = 1 } END { exit !f }' "$out/${name}_cells.csv"; then
    echo "incast_matrix: a job failed (see above)" >&2
    status=1
fi
if [ "$mode" = quick ]; then
    if awk -F, 'NR > 1 && $5 != "ok" { f = 1 } END { exit !f }' "$out/${name}_cells.csv"; then
        echo "incast_matrix: --quick: a cell did not complete" >&2
        status=1
    fi
    if awk -F, 'NR > 1 && $7 != "pass" { f = 1 } END { exit !f }' "$out/${name}_verdicts.csv"; then
        echo "incast_matrix: --quick: node < none in a cell" >&2
        status=1
    fi
fi
exit $status
