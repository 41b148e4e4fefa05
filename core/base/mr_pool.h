/*
 * Fixed pools of equal buffers and the per-destination deferred send queue.
 * Internal. Both are allocated once at init; nothing here allocates
 * afterwards.
 */
#ifndef MR_POOL_H
#define MR_POOL_H

#include "mailrail.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MR_NIL UINT32_MAX

/* A pool of `count` slots of `stride` bytes in one allocation, with a free stack. */
typedef struct mr_pool {
    char *base;
    size_t stride;        /* Slot size rounded up to a cache line. */
    unsigned stride_log2; /* log2(stride) when stride is a power of two, else 0. */
    size_t count;
    size_t mapped_bytes;
    bool numa_local;      /* Allocated with libnuma. */
    uint32_t *free_stack;
    size_t free_top;      /* Number of free slots. */
} mr_pool_t;

/* Allocates the pool, NUMA-local when `numa` and libnuma allow. */
mr_status_t mr__pool_init(mr_pool_t *pool, size_t count, size_t slot_size, bool numa);
void mr__pool_fini(mr_pool_t *pool);

/*
 * The hot-path operations are inline: every message takes and frees slots,
 * and maps buffers the application passes back to their slots.
 */

/* Takes a free slot's index, or MR_NIL when none is free. */
static inline uint32_t mr__pool_get(mr_pool_t *pool)
{
    if (pool->free_top == 0) return MR_NIL;
    return pool->free_stack[--pool->free_top];
}

static inline void mr__pool_put(mr_pool_t *pool, uint32_t index)
{
    pool->free_stack[pool->free_top++] = index;
}

static inline void *mr__pool_slot(const mr_pool_t *pool, uint32_t index)
{
    return pool->base + (size_t)index * pool->stride;
}

/* True when `ptr` lies anywhere inside the pool's slots. */
static inline bool mr__pool_contains(const mr_pool_t *pool, const void *ptr)
{
    /* One unsigned comparison: addresses below the base wrap around to large offsets. */
    return (uintptr_t)ptr - (uintptr_t)pool->base < pool->mapped_bytes;
}

/*
 * The index of the slot that starts at `ptr`, or MR_NIL when `ptr` is not
 * the start of one of this pool's slots.
 */
static inline uint32_t mr__pool_index(const mr_pool_t *pool, const void *ptr)
{
    uintptr_t offset = (uintptr_t)ptr - (uintptr_t)pool->base;

    if (offset >= pool->mapped_bytes) return MR_NIL;
    if (pool->stride_log2 != 0) {
        if ((offset & (pool->stride - 1)) != 0) return MR_NIL;
        return (uint32_t)(offset >> pool->stride_log2);
    }
    if (offset % pool->stride != 0) return MR_NIL;
    return (uint32_t)(offset / pool->stride);
}

/* The slot an offset below mapped_bytes falls in: count or more in the mapping's tail. */
static inline size_t mr__pool_slot_at(const mr_pool_t *pool, uintptr_t offset)
{
    return pool->stride_log2 != 0 ? offset >> pool->stride_log2 : offset / pool->stride;
}

static inline size_t mr__pool_in_use(const mr_pool_t *pool)
{
    return pool->count - pool->free_top;
}

/*
 * FIFO queues of send-slot indices, one per destination, and the ring of
 * destinations whose queue is not empty, visited round-robin.
 */
typedef struct mr_deferq {
    int ndest;
    uint32_t *head;       /* Per destination. */
    uint32_t *tail;
    uint32_t *link;       /* Per send slot: next in its destination's queue. */
    uint32_t *queued;     /* Per destination: messages in its queue. */
    int *ring_next;       /* Per destination, -1 when not in the ring. */
    int *ring_prev;
    int ring_head;        /* A destination in the ring, or -1. */
    int ring_count;       /* Destinations in the ring. */
    size_t depth;         /* Messages queued over all destinations. */
    size_t peak_depth;
} mr_deferq_t;

mr_status_t mr__deferq_init(mr_deferq_t *q, int ndest, size_t nslots);
void mr__deferq_fini(mr_deferq_t *q);
/* mr__deferq_push() and mr__deferq_pop() when `dest` joins or leaves the ring. */
void mr__deferq_push_first(mr_deferq_t *q, int dest, uint32_t slot);
void mr__deferq_pop_last(mr_deferq_t *q, int dest);

/* Queues `slot` last for `dest`. Inline: a stream waiting for credit queues every message. */
static inline void mr__deferq_push(mr_deferq_t *q, int dest, uint32_t slot)
{
    q->link[slot] = MR_NIL;
    q->queued[dest]++;
    if (++q->depth > q->peak_depth) q->peak_depth = q->depth;
    if (__builtin_expect(q->head[dest] == MR_NIL, 0)) {
        mr__deferq_push_first(q, dest, slot);
    } else {
        q->link[q->tail[dest]] = slot;
        q->tail[dest] = slot;
    }
}

/* The oldest slot queued for `dest`, or MR_NIL. */
static inline uint32_t mr__deferq_peek(const mr_deferq_t *q, int dest)
{
    return q->head[dest];
}

/* Removes and returns the oldest slot for `dest` (MR_NIL when empty). */
static inline uint32_t mr__deferq_pop(mr_deferq_t *q, int dest)
{
    uint32_t slot = q->head[dest];

    if (slot == MR_NIL) return MR_NIL;
    q->head[dest] = q->link[slot];
    q->link[slot] = MR_NIL;
    q->queued[dest]--;
    q->depth--;
    if (__builtin_expect(q->head[dest] == MR_NIL, 0)) mr__deferq_pop_last(q, dest);
    return slot;
}

/* The first destination in the ring, or -1 when every queue is empty. */
static inline int mr__deferq_first(const mr_deferq_t *q)
{
    return q->ring_head;
}

/*
 * The destination after `dest` in the ring. To visit every destination once,
 * take ring_count steps from mr__deferq_first(), reading the next one before
 * popping the current: a destination whose queue becomes empty leaves the
 * ring, the others keep their order.
 */
static inline int mr__deferq_next(const mr_deferq_t *q, int dest)
{
    return q->ring_next[dest];
}

/*
 * A fixed-capacity map from pointers to slot indices (open addressing, linear
 * probing, deletion by backward shift): finds the receive slot of a buffer
 * that a substrate owns in O(1). Never allocates after init.
 */
typedef struct mr_ptrmap {
    const void **keys;    /* NULL: empty. */
    uint32_t *values;
    size_t mask;          /* Capacity - 1; capacity is a power of two. */
} mr_ptrmap_t;

/* A map for at most `entries` keys, kept at most half full. */
mr_status_t mr__ptrmap_init(mr_ptrmap_t *map, size_t entries);
void mr__ptrmap_fini(mr_ptrmap_t *map);

/* Sets `key` to `value` (replacing an older value of the same key). */
void mr__ptrmap_put(mr_ptrmap_t *map, const void *key, uint32_t value);

/* The value of `key`, or MR_NIL. */
uint32_t mr__ptrmap_get(const mr_ptrmap_t *map, const void *key);

/* Removes `key` if present. */
void mr__ptrmap_del(mr_ptrmap_t *map, const void *key);

/* Removes `key` if present with `value` (any value: MR_NIL), in one search. */
void mr__ptrmap_del_if(mr_ptrmap_t *map, const void *key, uint32_t value);

#endif /* MR_POOL_H */
