/*
 * Fixed buffer pools and the deferred send queue.
 */
#include "mr_pool.h"
#include "mr_log.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifdef MR_HAVE_NUMA
#include <numa.h>
#endif

#define POOL_ALIGN 64

mr_status_t mr__pool_init(mr_pool_t *pool, size_t count, size_t slot_size, bool numa)
{
    size_t stride = (slot_size + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
    size_t bytes;
    char *base = NULL;
    bool numa_local = false;

    if (stride == 0) stride = POOL_ALIGN;
    if (count == 0 || count >= MR_NIL || stride > SIZE_MAX / count) {
        mr_error("A pool of %zu slots of %zu bytes cannot be represented.", count, slot_size);
        return MR_ERR_INVALID_PARAM;
    }
    bytes = stride * count;
#ifdef MR_HAVE_NUMA
    if (numa && numa_available() >= 0) {
        base = numa_alloc_local(bytes);
        numa_local = base != NULL;
    }
#else
    (void)numa;
#endif
    if (base == NULL) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            mr_error("Cannot allocate a pool of %zu bytes (%zu slots of %zu bytes).", bytes,
                     count, stride);
            return MR_ERR_NO_MEMORY;
        }
        base = p;
    }
    uint32_t *stack = malloc(count * sizeof(*stack));
    if (stack == NULL) {
        mr_error("Cannot allocate the free list of a pool of %zu slots.", count);
#ifdef MR_HAVE_NUMA
        if (numa_local) numa_free(base, bytes);
        else
#endif
            munmap(base, bytes);
        return MR_ERR_NO_MEMORY;
    }
    /* The lowest index is handed out first. */
    for (size_t i = 0; i < count; i++) stack[i] = (uint32_t)(count - 1 - i);
    pool->base = base;
    pool->stride = stride;
    pool->stride_log2 = 0;
    if ((stride & (stride - 1)) == 0) {
        while (((size_t)1 << pool->stride_log2) < stride) pool->stride_log2++;
    }
    pool->count = count;
    pool->mapped_bytes = bytes;
    pool->numa_local = numa_local;
    pool->free_stack = stack;
    pool->free_top = count;
    return MR_OK;
}

void mr__pool_fini(mr_pool_t *pool)
{
    if (pool->base == NULL) return;
#ifdef MR_HAVE_NUMA
    if (pool->numa_local) numa_free(pool->base, pool->mapped_bytes);
    else
#endif
        munmap(pool->base, pool->mapped_bytes);
    free(pool->free_stack);
    memset(pool, 0, sizeof(*pool));
}

mr_status_t mr__deferq_init(mr_deferq_t *q, int ndest, size_t nslots)
{
    memset(q, 0, sizeof(*q));
    q->head = malloc((size_t)ndest * sizeof(*q->head));
    q->tail = malloc((size_t)ndest * sizeof(*q->tail));
    q->link = malloc(nslots * sizeof(*q->link));
    q->queued = calloc((size_t)ndest, sizeof(*q->queued));
    q->ring_next = malloc((size_t)ndest * sizeof(*q->ring_next));
    q->ring_prev = malloc((size_t)ndest * sizeof(*q->ring_prev));
    if (!q->head || !q->tail || !q->link || !q->queued || !q->ring_next || !q->ring_prev) {
        mr_error("Cannot allocate the deferred send queue for %d destinations.", ndest);
        mr__deferq_fini(q);
        return MR_ERR_NO_MEMORY;
    }
    q->ndest = ndest;
    for (int d = 0; d < ndest; d++) {
        q->head[d] = q->tail[d] = MR_NIL;
        q->ring_next[d] = q->ring_prev[d] = -1;
    }
    for (size_t i = 0; i < nslots; i++) q->link[i] = MR_NIL;
    q->ring_head = -1;
    return MR_OK;
}

void mr__deferq_fini(mr_deferq_t *q)
{
    free(q->head);
    free(q->tail);
    free(q->link);
    free(q->queued);
    free(q->ring_next);
    free(q->ring_prev);
    memset(q, 0, sizeof(*q));
    q->ring_head = -1;
}

void mr__deferq_push_first(mr_deferq_t *q, int dest, uint32_t slot)
{
    q->head[dest] = slot;
    q->tail[dest] = slot;
    /* The destination joins the ring just before its head, i.e. last. */
    if (q->ring_head < 0) {
        q->ring_head = dest;
        q->ring_next[dest] = q->ring_prev[dest] = dest;
    } else {
        int last = q->ring_prev[q->ring_head];
        q->ring_next[last] = dest;
        q->ring_prev[dest] = last;
        q->ring_next[dest] = q->ring_head;
        q->ring_prev[q->ring_head] = dest;
    }
    q->ring_count++;
}

void mr__deferq_pop_last(mr_deferq_t *q, int dest)
{
    q->tail[dest] = MR_NIL;
    if (q->ring_next[dest] == dest) {
        q->ring_head = -1;
    } else {
        q->ring_next[q->ring_prev[dest]] = q->ring_next[dest];
        q->ring_prev[q->ring_next[dest]] = q->ring_prev[dest];
        if (q->ring_head == dest) q->ring_head = q->ring_next[dest];
    }
    q->ring_next[dest] = q->ring_prev[dest] = -1;
    q->ring_count--;
}

mr_status_t mr__ptrmap_init(mr_ptrmap_t *map, size_t entries)
{
    size_t capacity = 16;

    while (capacity < 2 * entries) capacity *= 2;
    map->keys = calloc(capacity, sizeof(*map->keys));
    map->values = calloc(capacity, sizeof(*map->values));
    map->mask = capacity - 1;
    if (map->keys == NULL || map->values == NULL) {
        mr_error("Cannot allocate a pointer map of %zu entries.", capacity);
        mr__ptrmap_fini(map);
        return MR_ERR_NO_MEMORY;
    }
    return MR_OK;
}

void mr__ptrmap_fini(mr_ptrmap_t *map)
{
    free(map->keys);
    free(map->values);
    map->keys = NULL;
    map->values = NULL;
    map->mask = 0;
}

static size_t ptrmap_home(const mr_ptrmap_t *map, const void *key)
{
    uint64_t h = (uint64_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & map->mask;
}

void mr__ptrmap_put(mr_ptrmap_t *map, const void *key, uint32_t value)
{
    size_t i = ptrmap_home(map, key);

    while (map->keys[i] != NULL && map->keys[i] != key) i = (i + 1) & map->mask;
    map->keys[i] = key;
    map->values[i] = value;
}

uint32_t mr__ptrmap_get(const mr_ptrmap_t *map, const void *key)
{
    if (key == NULL || map->keys == NULL) return MR_NIL;
    for (size_t i = ptrmap_home(map, key); map->keys[i] != NULL; i = (i + 1) & map->mask) {
        if (map->keys[i] == key) return map->values[i];
    }
    return MR_NIL;
}

void mr__ptrmap_del(mr_ptrmap_t *map, const void *key)
{
    mr__ptrmap_del_if(map, key, MR_NIL);
}

void mr__ptrmap_del_if(mr_ptrmap_t *map, const void *key, uint32_t value)
{
    size_t i = ptrmap_home(map, key), j;

    while (map->keys[i] != NULL && map->keys[i] != key) i = (i + 1) & map->mask;
    if (map->keys[i] == NULL || (value != MR_NIL && map->values[i] != value)) return;
    /* Backward shift: move up every later entry whose home is not between the hole and it. */
    for (j = (i + 1) & map->mask; map->keys[j] != NULL; j = (j + 1) & map->mask) {
        size_t home = ptrmap_home(map, map->keys[j]);
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        map->keys[i] = map->keys[j];
        map->values[i] = map->values[j];
        i = j;
    }
    map->keys[i] = NULL;
}
