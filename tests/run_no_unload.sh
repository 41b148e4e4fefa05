#!/bin/sh
# An application that embeds MailRail without initializing MPI (MailRail loads
# MPICH and UCX itself) runs to completion, unloads nothing at mr_finalize,
# and, in a sanitizer build, gives LeakSanitizer nothing it cannot scan.
#
#   tests/run_no_unload.sh MPIEXEC TEST_NO_UNLOAD SANITIZE
#
# SANITIZE is meson's b_sanitize. Under AddressSanitizer the run is verbose
# enough to show the runtime's __tls_get_addr interceptor: GCC 12's guesses a
# dynamic TLS block's bounds from a pre-2.25 glibc header when the block lands
# 16 bytes past a page boundary, records garbage, and LeakSanitizer's tracer
# then dies scanning it if that thread is alive at exit (tests/lsan.supp).
# Whether it dies depends on the machine; whether it guessed does not, so the
# test fails on the guess.
set -u
mpiexec=$1
prog=$2
sanitize=$3
export MPIEXEC_TIMEOUT=60
# An unknown setting makes mr_init list (load) every substrate plugin as well.
export MAILRAIL_NO_SUCH_SETTING_FOR_THIS_TEST=1 MAILRAIL_LOG_LEVEL=error
case "$sanitize" in
    *address*) export ASAN_OPTIONS="${ASAN_OPTIONS:-}:verbosity=2" ;;
esac
status=0
for substrate in ucx tcp mpi; do
    out=$(MAILRAIL_SUBSTRATE=$substrate timeout -k 5 90 "$mpiexec" -n 2 "$prog" 2>&1)
    rc=$?
    printf '%s\n' "$out" | grep -v "^==[0-9]*==" | sed "s/^/$substrate: /"
    if [ "$rc" -ne 0 ]; then
        echo "FAIL: over $substrate the job exited with $rc"; status=1
    fi
    if [ "$(printf '%s\n' "$out" | grep -c "no shared object was unloaded")" -ne 2 ]; then
        echo "FAIL: over $substrate not every rank kept every shared object loaded"; status=1
    fi
    if printf '%s\n' "$out" | grep -E "glibc >=2.19 suspected|LeakSanitizer has encountered a fatal error"; then
        echo "FAIL: over $substrate the sanitizer runtime recorded a dynamic TLS block from a guessed header"
        status=1
    fi
done
exit $status
