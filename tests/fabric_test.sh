# Sourced (after skip.sh) by the tests that drive the emulated fabric's
# shellcheck shell=bash
# scripts (run_fabric.sh, run_slurm.sh): what a machine must offer, a scratch
# directory, the stop trap that lets the running script tear down, failure
# counting, and waiting for a job to start inside a host.

# Skips unless root with the fabric's tools (and TOOLS...), naming HINT's packages.
fabric_needs() {
    local hint=$1 t
    shift
    [ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, tc)"
    for t in ip tc ethtool unshare timeout "$@"; do
        command -v "$t" >/dev/null 2>&1 || skip "'$t' is missing (Debian packages: $hint)"
    done
    unshare --net true 2>/dev/null || skip "network namespaces cannot be created here"
}

# tmp: a scratch directory, removed on exit; pid: the fabric script running now.
# Stopped (meson's timeout): the running script is stopped, and tears down.
fabric_test_begin() {
    tmp=$(mktemp -d "/tmp/$1.XXXXXX")
    pid=
    failures=0
    trap 'rm -rf "$tmp"' EXIT
    trap fabric_on_stop INT TERM
}
fabric_on_stop() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    exit 1
}
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# What every fabric run must leave behind it, run PID's: no namespace, no run
# directory, no CPU cgroup. WHAT names the case in the failure.
fabric_check_clean() {
    local pid=$1 what=$2 ns cg
    ns=$(ip netns list 2>/dev/null | awk '{print $1}' | grep "^mrf${pid}\(sw\|h[0-9]*\)$")
    [ -z "$ns" ] || fail "$what: namespaces left behind: $ns"
    ls -d /tmp/"mrf${pid}".* >/dev/null 2>&1 && fail "$what: run directory left behind"
    for cg in /sys/fs/cgroup/cpu /sys/fs/cgroup; do
        [ -d "$cg/mrf${pid}" ] && fail "$what: cgroup $cg/mrf${pid} left behind"
    done
}

# Interrupts run $pid (of script NAME) once its host h1 runs PATTERN: it must end
# within 20 s with status 130. The caller then checks what was left.
fabric_interrupt() {
    local name=$1 pattern=$2 rc
    fabric_wait_for h1 "$pattern" || { cat "$tmp/out"; fail "the interrupted job never started"; }
    kill -INT "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        fail "$name still runs 20 s after SIGINT"
        kill -TERM "$pid" 2>/dev/null
    fi
    wait "$pid"
    rc=$?
    [ "$rc" -eq 130 ] || { cat "$tmp/out"; fail "$name exited with status $rc after SIGINT, not 130"; }
}

# Waits up to 40 s until a process of run $pid's host HOST matches PATTERN (its
# command line); returns 1 if the run ended or the time passed first.
fabric_wait_for() {
    local host=$1 pattern=$2 p
    for _ in $(seq 200); do
        for p in $(ip netns pids "mrf${pid}${host}" 2>/dev/null); do ps -o args= -p "$p"; done |
            grep -q "$pattern" && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.2
    done
    return 1
}
