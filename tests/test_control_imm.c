/*
 * Every substrate carries a control message's 32-bit immediate whole: the
 * plugin, loaded and driven directly (no core), on 2 ranks under mpiexec.
 * Rank 0 sends control messages whose immediates fill the bits that flow
 * control and the core use (a node's totals up to 2^30, MR_CREDIT_ASK at
 * bit 30, failure notices at bit 31), and rank 1 checks that each arrives
 * once, in order, equal to what was sent. MPI carries immediates in tags of
 * at most MPI_TAG_UB and splits larger ones (mpi_ctrl_tag.h); when its parts
 * added up instead, a total above the bound arrived as two smaller ones.
 *
 *   mpiexec -n 2 test_control_imm tcp|ucx|mpi
 */
#include "mr_config.h"
#include "mr_plugin.h"
#include "mr_substrate.h"
#include "upcalls_idle.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const uint32_t imms[] = {1,           32767,       32768,       0x07ffffffu,
                                0x0fffffffu, 0x10000000u, 0x3fffffffu, 0x40000000u,
                                0x80000003u, 0xdeadbeefu, 0xffffffffu, 2};
#define NIMMS (sizeof(imms) / sizeof(imms[0]))

typedef struct got {
    uint32_t imm[64];
    int source[64];
    int n;
    int failed;
} got_t;

static void up_send_complete(void *core, void *cookie)
{
    (void)core, (void)cookie;
}
static void up_control(void *core, int source, uint32_t imm)
{
    got_t *g = core;

    if (g->n < 64) {
        g->imm[g->n] = imm;
        g->source[g->n] = source;
    }
    g->n++;
}
static void up_peer_failed(void *core, int rank, mr_status_t why)
{
    got_t *g = core;

    fprintf(stderr, "peer %d failed: %d\n", rank, (int)why);
    g->failed = 1;
}

static const mr_substrate_upcalls_t upcalls = {
    .recv_slot_acquire = idle_slot_acquire,
    .recv_slot_abandon = idle_slot_abandon,
    .deliver = idle_deliver,
    .deliver_copy = idle_deliver_copy,
    .deliver_handler_now = idle_handler_now,
    .deliver_now_frames = idle_now_frames,
    .send_complete = up_send_complete,
    .control = up_control,
    .peer_failed = up_peer_failed,
};

static void test_log(mr_log_level_t level, const char *fmt, ...)
{
    va_list ap;

    (void)level;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "rank %d: FAIL: ", rank);                         \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
            MPI_Abort(MPI_COMM_WORLD, 1);                                     \
        }                                                                     \
    } while (0)

int main(int argc, char **argv)
{
    int rank, size;
    mr_log_level_t threshold = MR_LOG_WARN;
    mr_plugin_dirs_t dirs;
    const mr_substrate_ops_t *ops = NULL;
    void *handle = NULL, *config = NULL;
    char why[512];
    MPI_Comm comm;
    uint8_t key[MR_JOB_KEY_LEN], addr[MR_SUBSTRATE_ADDR_MAX] = {0};
    uint64_t addr_len = sizeof(addr), max_len = 0;
    int node_of[2] = {0, 1};
    got_t got = {0};
    mr_substrate_t *s = NULL;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CHECK(argc == 2 && size == 2, "usage: mpiexec -n 2 %s tcp|ucx|mpi", argv[0]);
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    const char *path = getenv("MAILRAIL_PLUGIN_PATH");
    mr__plugin_dirs_init(&dirs, path != NULL ? path : "");
    CHECK(mr__plugin_load_substrate(&dirs, argv[1], &handle, &ops, why, sizeof(why)) == MR_OK,
          "cannot load substrate %s: %s", argv[1], why);
    config = calloc(1, ops->config_size ? ops->config_size : 1);
    CHECK(config != NULL, "out of memory");
    if (ops->config_table != NULL) {
        CHECK(mr__config_parse(ops->config_table, config) == MR_OK, "settings of %s", argv[1]);
    }
    /* A job key both ranks share: rank 0's bytes. */
    for (size_t i = 0; i < sizeof(key); i++) key[i] = (uint8_t)(i * 37 + (unsigned)time(NULL));
    MPI_Bcast(key, sizeof(key), MPI_BYTE, 0, MPI_COMM_WORLD);
    mr_substrate_params_t params = {
        .rank = rank, .size = 2, .node_of_rank = node_of, .datagram_size = 4096,
        .max_sends = 64, .recv_slots = 16, .job_key = key, .job_id = "test-control-imm",
        .bootstrap_comm = &comm, .timeout_s = 30, .config = config, .core = &got,
        .upcalls = &upcalls, .log = test_log, .log_threshold = &threshold,
    };
    CHECK(ops->open(&params, &s) == MR_OK, "open %s", argv[1]);
    size_t len = sizeof(addr);
    CHECK(ops->get_address(s, addr, &len) == MR_OK, "get_address");
    addr_len = len;
    MPI_Allreduce(&addr_len, &max_len, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    uint8_t *addrs = calloc(2, max_len);
    CHECK(addrs != NULL, "out of memory");
    MPI_Allgather(addr, (int)max_len, MPI_BYTE, addrs, (int)max_len, MPI_BYTE, MPI_COMM_WORLD);
    CHECK(ops->connect(s, addrs, max_len) == MR_OK, "connect");

    double deadline = now_s() + 30;
    if (rank == 0) {
        for (size_t i = 0; i < NIMMS; i++) {
            mr_status_t st;
            while ((st = ops->send_control(s, 1, imms[i])) == MR_AGAIN) {
                CHECK(now_s() < deadline, "send_control of 0x%x never accepted", imms[i]);
                ops->progress(s, 0);
            }
            CHECK(st == MR_OK, "send_control of 0x%x: %d", imms[i], (int)st);
        }
    } else {
        while (got.n < (int)NIMMS && !got.failed) {
            CHECK(now_s() < deadline, "%d of %zu control messages in 30 s", got.n, NIMMS);
            CHECK(ops->progress(s, 10) >= 0, "progress");
        }
        CHECK(got.n == (int)NIMMS, "%d control messages, not %zu", got.n, NIMMS);
        for (size_t i = 0; i < NIMMS; i++) {
            CHECK(got.source[i] == 0 && got.imm[i] == imms[i],
                  "control %zu from rank %d: 0x%x, sent 0x%x", i, got.source[i], got.imm[i],
                  imms[i]);
        }
    }
    /*
     * Both ranks are done sending when both reach the first barrier; after
     * closing() an end of stream is no failure, and the second lets every
     * rank call it before any closes its connections.
     */
    for (int phase = 0; phase < 2; phase++) {
        MPI_Request req;
        int done = 0;

        if (phase == 1 && ops->closing != NULL) ops->closing(s);
        MPI_Ibarrier(MPI_COMM_WORLD, &req);
        while (!done) {
            ops->progress(s, 1);
            MPI_Test(&req, &done, MPI_STATUS_IGNORE);
            CHECK(now_s() < deadline + 30, "the closing barriers");
        }
    }
    CHECK(!got.failed, "a peer failed");
    CHECK(rank == 0 ? got.n == 0 : got.n == (int)NIMMS, "%d control messages at the end", got.n);
    ops->close(s);
    mr__plugin_unload(handle);
    free(addrs);
    free(config);
    if (rank == 1) {
        printf("control immediates over %s: %zu of %zu arrived whole, in order\n", argv[1], NIMMS,
               NIMMS);
    }
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return 0;
}
