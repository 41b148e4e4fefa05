/*
 * Creating, opening and cleaning up the node credit segments.
 */
#include "mr_node_segment.h"
#include "mr_log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static size_t segment_bytes(int ranks, int local_ranks)
{
    return sizeof(mr_node_segment_t) + (size_t)ranks * sizeof(mr_node_credit_t) +
           (size_t)local_ranks * sizeof(mr_node_sleeper_t);
}

/*
 * Says why an existing segment of this name cannot be this job's: another
 * user's, or one a killed run of this user left (its creator is gone).
 */
static void segment_explain_existing(const char *name)
{
    struct stat st;
    int32_t creator = 0;
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);

    if (fd < 0 || fstat(fd, &st) != 0) {
        mr_error("The node credit segment %s exists already and cannot be inspected (%s); it is "
                 "not this job's: refused.", name, strerror(errno));
    } else if (st.st_uid != geteuid()) {
        mr_error("The node credit segment %s exists already and belongs to uid %u, not to this "
                 "job's user (uid %u): refused.", name, (unsigned)st.st_uid, (unsigned)geteuid());
    } else {
        if (pread(fd, &creator, sizeof(creator), offsetof(mr_node_segment_t, creator_pid)) !=
            (ssize_t)sizeof(creator)) {
            creator = 0;
        }
        mr_error("The node credit segment %s exists already: %s; refused (a new run cleans up "
                 "the segments of dead creators itself).", name,
                 creator > 0 && kill(creator, 0) != 0 && errno == ESRCH
                     ? "left by a run whose creator is gone"
                     : "another run of this user holds it");
    }
    if (fd >= 0) close(fd);
}

void mr__node_segment_name(char *buf, size_t len, const char *job_id, int node)
{
    snprintf(buf, len, "/" MR_NODE_SEGMENT_PREFIX "%s-n%d", job_id, node);
}

mr_status_t mr__node_segment_create(const char *name, const char *job_id, int node, int ranks,
                                   int local_ranks, uint32_t per_node, mr_node_segment_t **out)
{
    size_t bytes = segment_bytes(ranks, local_ranks);
    mr_node_segment_t *seg;
    int fd;

    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, S_IRUSR | S_IWUSR);
    if (fd < 0 && errno == EEXIST) {
        segment_explain_existing(name);
        return MR_ERR_SYSTEM;
    }
    if (fd < 0) {
        mr_error("Cannot create the node credit segment %s: %s.", name, strerror(errno));
        return MR_ERR_SYSTEM;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) {
        mr_error("Cannot size the node credit segment %s to %zu bytes: %s.", name, bytes,
                 strerror(errno));
        goto err_unlink;
    }
    seg = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (seg == MAP_FAILED) {
        mr_error("Cannot map the node credit segment %s: %s.", name, strerror(errno));
        goto err_unlink;
    }
    close(fd);
    seg->version = MR_NODE_SEGMENT_VERSION;
    seg->node = node;
    seg->ranks = ranks;
    seg->creator_pid = (int32_t)getpid();
    seg->per_node = per_node;
    seg->local_ranks = local_ranks;
    snprintf(seg->job_id, sizeof(seg->job_id), "%s", job_id);
    for (int r = 0; r < ranks; r++) atomic_init(&seg->credits[r].n, per_node);
    atomic_init(&seg->sleeping, 0);
    for (int r = 0; r < local_ranks; r++) atomic_init(&mr__node_sleepers(seg)[r].waits_for, 0);
    /* The magic goes last: a segment with it is complete. */
    atomic_thread_fence(memory_order_release);
    seg->magic = MR_NODE_SEGMENT_MAGIC;
    *out = seg;
    return MR_OK;

err_unlink:
    close(fd);
    shm_unlink(name);
    return MR_ERR_SYSTEM;
}

mr_status_t mr__node_segment_open(const char *name, const char *job_id, int node, int ranks,
                                 int local_ranks, uint32_t per_node, mr_node_segment_t **out)
{
    size_t bytes = segment_bytes(ranks, local_ranks);
    struct stat st;
    mr_node_segment_t *seg;
    int fd;

    fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        mr_error("Cannot open the node credit segment %s: %s.", name, strerror(errno));
        return MR_ERR_SYSTEM;
    }
    /* Only a segment of this user that nobody else may touch can hold this job's credits. */
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & (S_IRWXG | S_IRWXO))) {
        mr_error("The node credit segment %s belongs to uid %u with mode %03o; this job's "
                 "(uid %u, mode 600) it is not: refused.", name, (unsigned)st.st_uid,
                 (unsigned)(st.st_mode & 0777), (unsigned)geteuid());
        close(fd);
        return MR_ERR_SYSTEM;
    }
    if ((size_t)st.st_size != bytes) {
        mr_error("The node credit segment %s has the wrong size (expected %zu bytes).", name,
                 bytes);
        close(fd);
        return MR_ERR_SYSTEM;
    }
    seg = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (seg == MAP_FAILED) {
        mr_error("Cannot map the node credit segment %s: %s.", name, strerror(errno));
        return MR_ERR_SYSTEM;
    }
    atomic_thread_fence(memory_order_acquire);
    if (seg->magic != MR_NODE_SEGMENT_MAGIC || seg->version != MR_NODE_SEGMENT_VERSION ||
        seg->node != node || seg->ranks != ranks || seg->per_node != per_node ||
        seg->local_ranks != local_ranks ||
        strncmp(seg->job_id, job_id, sizeof(seg->job_id)) != 0) {
        mr_error("The node credit segment %s does not belong to this job (node %d, %d ranks, "
                 "%u credits).", name, node, ranks, per_node);
        munmap(seg, bytes);
        return MR_ERR_SYSTEM;
    }
    *out = seg;
    return MR_OK;
}

void mr__node_segment_unlink(const char *name)
{
    if (shm_unlink(name) != 0 && errno != ENOENT) {
        mr_warn("Cannot remove the node credit segment %s: %s.", name, strerror(errno));
    }
}

void mr__node_segment_unmap(mr_node_segment_t *seg)
{
    if (seg != NULL) munmap(seg, segment_bytes(seg->ranks, seg->local_ranks));
}

/* True when `name` in /dev/shm is a MailRail node segment whose creator is gone. */
static bool segment_is_stale(const char *name)
{
    char path[300];
    mr_node_segment_t head;
    struct stat st;
    bool stale = false;
    int fd;

    snprintf(path, sizeof(path), "/%s", name);
    fd = shm_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return false;
    if (fstat(fd, &st) == 0 && st.st_uid == geteuid() &&
        (size_t)st.st_size >= sizeof(head) &&
        pread(fd, &head, sizeof(head), 0) == (ssize_t)sizeof(head) &&
        head.magic == MR_NODE_SEGMENT_MAGIC && head.creator_pid > 0) {
        stale = kill(head.creator_pid, 0) != 0 && errno == ESRCH;
    }
    close(fd);
    return stale;
}

int mr__node_segment_cleanup_stale(void)
{
    DIR *dir = opendir("/dev/shm");
    struct dirent *e;
    int removed = 0;

    if (dir == NULL) return 0;
    while ((e = readdir(dir)) != NULL) {
        char path[300];
        if (strncmp(e->d_name, MR_NODE_SEGMENT_PREFIX, strlen(MR_NODE_SEGMENT_PREFIX)) != 0 ||
            !segment_is_stale(e->d_name)) {
            continue;
        }
        snprintf(path, sizeof(path), "/%s", e->d_name);
        if (shm_unlink(path) == 0) {
            mr_warn("Removed the stale node credit segment %s left by a dead process.", path);
            removed++;
        }
    }
    closedir(dir);
    return removed;
}
