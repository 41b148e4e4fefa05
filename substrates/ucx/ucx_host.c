/*
 * The UCX substrate's view of its host: the host's identity (boot id, pid
 * namespace), and the watch over the processes of peers on this host through
 * pidfds in the epoll set (ucx_substrate.h lists the other files).
 */
#include "ucx_substrate.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Host identity, for the error mode and the pidfd watch.                   */

void ucx__host_identity(uint64_t *boot_hash, uint64_t *pidns)
{
    char buf[64];
    struct stat st;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);

    *boot_hash = 0;
    *pidns = 0;
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n > 0) *boot_hash = mr__ucx_wire_fnv1a64(UCX_WIRE_FNV64_INIT, buf, (size_t)n);
        close(fd);
    }
    if (stat("/proc/self/ns/pid", &st) == 0) *pidns = ((uint64_t)st.st_dev << 32) ^ st.st_ino;
}

static int pidfd_open_compat(uint32_t pid)
{
#ifdef SYS_pidfd_open
    static bool unsupported; /* ENOSYS once (old kernel, valgrind): do not ask again. */
    int fd;

    if (unsupported) {
        errno = ENOSYS;
        return -1;
    }
    fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd < 0 && errno == ENOSYS) unsupported = true;
    return fd;
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* ------------------------------------------------------------------------ */
/* Watching the processes of peers on this host.                            */

/* A peer in this pid namespace is watched through a pidfd: its exit is its failure. */
void ucx__peer_watch_process(mr_substrate_t *s, ucx_peer_t *p, uint64_t pidns)
{
    int fd;

    if (!p->same_host || pidns == 0 || pidns != s->pidns || p->pid == 0) return;
    fd = pidfd_open_compat(p->pid);
    if (fd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)p->rank + 1};
        if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) == 0) {
            p->pidfd = fd;
            s->npidfds++;
        } else {
            close(fd);
        }
    } else {
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: cannot watch process %u (rank %d): %s.",
                (unsigned)p->pid, p->rank, strerror(errno));
    }
}

/* Polls the pidfds of peers on this host (and drains the epoll set). */
void ucx__check_events(mr_substrate_t *s, int timeout_ms)
{
    struct epoll_event evs[UCX_MAX_EVENTS];
    int n;

    if (s->epfd < 0) {
        if (timeout_ms != 0) sched_yield();
        return;
    }
    n = epoll_wait(s->epfd, evs, UCX_MAX_EVENTS, timeout_ms);
    for (int i = 0; i < n; i++) {
        uint64_t tag = evs[i].data.u64;
        if (tag == 0) continue; /* The worker's event fd: the caller progresses. */
        if (tag == UCX_TAG_WAKE) {
            s->woken = true; /* Flow control's wake-up: its owner drains it. */
            continue;
        }
        int rank = (int)(tag - 1);
        if (rank >= 0 && rank < s->base.size && s->peers[rank].pidfd >= 0) {
            ucx_peer_t *p = &s->peers[rank];
            epoll_ctl(s->epfd, EPOLL_CTL_DEL, p->pidfd, NULL);
            close(p->pidfd);
            p->pidfd = -1;
            s->npidfds--;
            if (p->state == P_OK && !mr__failq_queued(&s->failq, p->rank)) p->exited = true;
            ucx__peer_fail(s, rank, UCS_ERR_CONNECTION_RESET);
        }
    }
}
