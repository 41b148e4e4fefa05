/*
 * The `none` policy: unconstrained sends. Every message may go at once; the
 * substrate's own backpressure is the only limit.
 */
#include "mr_flowctl.h"

struct mr_flowctl {
    int unused;
};

static mr_flowctl_t none_state;

static mr_status_t none_init(const mr_flowctl_params_t *params, mr_flowctl_t **out)
{
    (void)params;
    *out = &none_state;
    return MR_OK;
}

static bool none_acquire(mr_flowctl_t *fc, int dest, uint32_t *imm)
{
    (void)fc;
    (void)dest;
    *imm = 0;
    return true;
}

static void none_unacquire(mr_flowctl_t *fc, int dest, uint32_t imm)
{
    (void)fc;
    (void)dest;
    (void)imm;
}

static void none_on_arrival(mr_flowctl_t *fc, int source, uint32_t imm)
{
    (void)fc;
    (void)source;
    (void)imm;
}

static void none_on_release(mr_flowctl_t *fc, int source)
{
    (void)fc;
    (void)source;
}

static void none_on_control(mr_flowctl_t *fc, int source, uint32_t imm)
{
    (void)fc;
    (void)source;
    (void)imm;
}

static int none_progress(mr_flowctl_t *fc)
{
    (void)fc;
    return 0;
}

static void none_stats(mr_flowctl_t *fc, mr_stats_t *stats)
{
    (void)fc;
    (void)stats;
}

static void none_finalize(mr_flowctl_t *fc)
{
    (void)fc;
}

const mr_flowctl_ops_t mr__flowctl_none_ops = {
    .abi_version = MR_FLOWCTL_ABI_VERSION,
    .ops_size = sizeof(mr_flowctl_ops_t),
    .name = "none",
    .description = "Unconstrained: every message is sent at once.",
    .init = none_init,
    .acquire = none_acquire,
    .unacquire = none_unacquire,
    .on_arrival = none_on_arrival,
    .on_release = none_on_release,
    .on_control = none_on_control,
    .progress = none_progress,
    .stats = none_stats,
    .finalize = none_finalize,
    .unconstrained = true,
};
