#!/usr/bin/env bash
# A second local user (uid 65534, nobody) against a running 2-rank job over
# TCP under the node policy:
#  - it cannot read the ranks' memory or environment, where the job's TCP key
#    lives (the key never touches a file: rank 0 draws it and MPI passes it on);
#  - no node credit segment is left under a name it could open while the job
#    runs (the names are unlinked once mapped), and /dev/shm holds no MailRail
#    file it may read;
#  - connecting to a rank's TCP port and sending what it likes (no key) gets
#    the connection dropped and counted, and the job still delivers every
#    message exactly once.
# test_unit.c checks the segment itself against that user (owner-only, a
# forgery under the job's name refused).
#
#   run_local_security.sh MPIEXEC MAILRAIL_DEMO
#
# Exits 77 (skipped) without root, setpriv or ss; fails instead when
# MR_TEST_STRICT=1 (-Dstrict_tests, CI).
set -u
. "$(dirname "$0")/skip.sh"
mpiexec=$1 demo=$2
[ "$(id -u)" -eq 0 ] || skip "needs root to act as a second user"
for t in setpriv ss timeout python3; do
    command -v "$t" >/dev/null 2>&1 || skip "'$t' is missing (Debian: util-linux iproute2)"
done
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
tmp=$(mktemp -d /tmp/run_local_security.XXXXXX)
chmod 755 "$tmp"
job=
trap '[ -n "$job" ] && kill "$job" 2>/dev/null; rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# MailRail's own ports, known in advance (rank r listens on base + r): MPICH's are
# left alone.
base=$((40000 + $$ % 20000))
MAILRAIL_SUBSTRATE=tcp MAILRAIL_FLOWCTL=node MAILRAIL_LOG_LEVEL=warn MAILRAIL_TCP_PORT=$base \
    MPIEXEC_TIMEOUT=120 timeout -k 5 150 "$mpiexec" -n 2 "$demo" 500000 64 >"$tmp/out" 2>&1 &
job=$!
ports="$base $((base + 1))"
for ((i = 0; i < 200; i++)); do
    pids=$(pgrep -f "^$demo 500000 64" | tr '\n' ' ')
    [ "$(ss -Hltn "( sport = :$base or sport = :$((base + 1)) )" | wc -l)" -eq 2 ] && break
    sleep 0.05
done
[ -n "$pids" ] || { cat "$tmp/out"; echo "FAIL: the job's ranks never started"; exit 1; }
echo "ranks: $pids; MailRail's TCP ports: $ports"

# The checks below must be able to fail: the second user runs, and the owner can read.
[ "$(nobody id -u)" = 65534 ] || fail "cannot run commands as uid 65534"
for pid in $pids; do
    cat "/proc/$pid/environ" >/dev/null || fail "the owner cannot read rank $pid's environment"
    nobody cat "/proc/$pid/environ" >/dev/null 2>&1 && fail "uid 65534 read rank $pid's environment"
    nobody dd if="/proc/$pid/mem" of=/dev/null bs=1 count=1 skip=4096 2>/dev/null &&
        fail "uid 65534 read rank $pid's memory"
done
for f in /dev/shm/mailrail-*; do
    [ -e "$f" ] || continue
    nobody cat "$f" >/dev/null 2>&1 && fail "uid 65534 read $f"
    nobody sh -c ": >> '$f'" 2>/dev/null && fail "uid 65534 wrote to $f"
done
# Each port: a connection that sends a forged handshake's worth of random bytes.
for port in $ports; do
    nobody /usr/bin/python3 - "$port" <<'PY' || fail "uid 65534's connection to port $port was not dropped"
import os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(os.urandom(256))
s.settimeout(10)
try:
    while s.recv(4096):
        pass  # The rank may send its own hello first; it must then close.
except ConnectionResetError:
    pass
PY
done
wait "$job"
rc=$?
job=
cat "$tmp/out"
[ "$rc" -eq 0 ] || fail "the job failed ($rc)"
test "$(grep -c "all delivered exactly once" "$tmp/out")" -eq 2 || fail "not every message arrived once"
grep -q "TCP substrate: dropped an incoming connection" "$tmp/out" ||
    fail "no rank said it dropped the stranger's connection"
[ "$failures" -eq 0 ] || exit 1
echo "a second local user read nothing of the job and its connections were dropped"
