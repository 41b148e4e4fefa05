/*
 * YGM trace reader and writer. Never trusts the bytes: every field is read
 * with a bounds check, and every problem names the file and the offset.
 */
#include "ygm_trace.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The payload size, after the int32 type, of each kind in a layout. */
static size_t ygm_payload(ygm_layout_t layout, ygm_kind_t kind)
{
    switch (kind) {
    case YGM_ASYNC:
    case YGM_MPI_SEND:
    case YGM_MPI_RECV: return 8 + 4 + 4;
    case YGM_MPI_SEND_COMPLETE: return layout == YGM_LAYOUT_OLD ? 8 + 4 + 4 : 8 + 8 + 4;
    case YGM_BARRIER_BEGIN:
    case YGM_BARRIER_END: return 8 + 5 * 8;
    }
    return 0;
}

/* Maps a type index to a kind in a layout; false for an unknown index. */
static bool ygm_kind_of(ygm_layout_t layout, int32_t type, ygm_kind_t *kind)
{
    static const ygm_kind_t old_kinds[] = {YGM_ASYNC, YGM_MPI_SEND, YGM_MPI_RECV,
                                           YGM_BARRIER_BEGIN, YGM_BARRIER_END};
    static const ygm_kind_t new_kinds[] = {YGM_ASYNC, YGM_MPI_SEND, YGM_MPI_SEND_COMPLETE,
                                           YGM_MPI_RECV, YGM_BARRIER_BEGIN, YGM_BARRIER_END};
    if (layout == YGM_LAYOUT_OLD && type >= 0 && type < 5) {
        *kind = old_kinds[type];
        return true;
    }
    if (layout == YGM_LAYOUT_NEW && type >= 0 && type < 6) {
        *kind = new_kinds[type];
        return true;
    }
    return false;
}

static int32_t ygm_kind_index(ygm_layout_t layout, ygm_kind_t kind)
{
    /* The older layout writes send completions as sends (see ygm_trace.h). */
    if (layout == YGM_LAYOUT_OLD && kind == YGM_MPI_SEND_COMPLETE) return 1;
    for (int32_t t = 0; t < 6; t++) {
        ygm_kind_t k;
        if (ygm_kind_of(layout, t, &k) && k == kind) return t;
    }
    return -1;
}

static uint32_t ygm_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t ygm_le64(const uint8_t *p)
{
    return (uint64_t)ygm_le32(p) | (uint64_t)ygm_le32(p + 4) << 32;
}

const char *ygm_layout_name(ygm_layout_t layout)
{
    return layout == YGM_LAYOUT_OLD ? "older" : layout == YGM_LAYOUT_NEW ? "newer" : "auto";
}

/* The older layout's MPI sends still waiting for a completion record: their
 * buffer sizes in file order, from `head` on. */
typedef struct ygm_pending_sends {
    uint32_t *size;
    size_t head, count, cap;
} ygm_pending_sends_t;

/*
 * Whether `r`, a type-1 record of the older layout whose destination is
 * outside 0..nranks-1, is one of YGM's send completion records (the rule is in
 * ygm_trace.h). Returns NULL and consumes the send it completes, or says why not.
 */
static const char *ygm_match_completion(const ygm_record_t *r, int nranks,
                                        ygm_pending_sends_t *pending)
{
    if (nranks <= 0) return "the number of ranks is not known";
    if (pending->head == pending->count) return "no earlier MPI send awaits completion";
    if (((uint32_t)r->event_id - (uint32_t)r->peer) % (uint32_t)nranks != 0) {
        return "its event id and request id are not from one YGM id counter";
    }
    for (size_t i = pending->head; i < pending->count; i++) {
        if (pending->size[i] == r->size) {
            pending->head = i + 1;
            return NULL;
        }
    }
    return "no earlier MPI send of that size awaits completion";
}

/* Parses the whole buffer in one layout; on failure, says where and why. */
static int ygm_parse_as(const uint8_t *buf, size_t len, ygm_layout_t layout, int nranks,
                        const char *name, ygm_trace_t *out, char *err, size_t err_len)
{
    size_t off = 0, count = 0, cap = 0;
    ygm_record_t *records = NULL;
    ygm_pending_sends_t pending = {0};
    int open_barriers = 0;

    while (off < len) {
        size_t start = off;
        ygm_record_t r = {.peer = -1};
        int32_t type;

        if (len - off < 4) {
            snprintf(err, err_len, "%s: truncated record type at offset %zu (%zu bytes left)",
                     name, off, len - off);
            goto fail;
        }
        type = (int32_t)ygm_le32(buf + off);
        off += 4;
        if (!ygm_kind_of(layout, type, &r.kind)) {
            snprintf(err, err_len, "%s: unknown record type %d at offset %zu (%s layout)", name,
                     type, start, ygm_layout_name(layout));
            goto fail;
        }
        size_t need = ygm_payload(layout, r.kind);
        if (len - off < need) {
            snprintf(err, err_len,
                     "%s: truncated record at offset %zu: type %d needs %zu bytes, %zu left",
                     name, start, type, need, len - off);
            goto fail;
        }
        r.event_id = ygm_le64(buf + off);
        switch (r.kind) {
        case YGM_ASYNC:
        case YGM_MPI_SEND:
        case YGM_MPI_RECV:
            r.peer = (int32_t)ygm_le32(buf + off + 8);
            r.size = ygm_le32(buf + off + 12);
            if (r.peer < 0 || (nranks > 0 && r.peer >= nranks)) {
                const char *why = NULL;
                if (layout == YGM_LAYOUT_OLD && r.kind == YGM_MPI_SEND) {
                    why = ygm_match_completion(&r, nranks, &pending);
                    if (why == NULL) {
                        r.kind = YGM_MPI_SEND_COMPLETE;
                        r.start_id = (uint64_t)(int64_t)r.peer;
                        r.peer = -1;
                        break;
                    }
                }
                snprintf(err, err_len, "%s: record at offset %zu names rank %d, outside 0..%d%s%s",
                         name, start, r.peer, nranks - 1,
                         why ? ", and is no MPI send completion: " : "", why ? why : "");
                goto fail;
            }
            if (layout == YGM_LAYOUT_OLD && r.kind == YGM_MPI_SEND) {
                if (pending.count == pending.cap) {
                    size_t ncap = pending.cap ? 2 * pending.cap : 64;
                    uint32_t *n = realloc(pending.size, ncap * sizeof(*n));
                    if (n == NULL) {
                        snprintf(err, err_len, "%s: out of memory at offset %zu", name, start);
                        goto fail;
                    }
                    pending.size = n;
                    pending.cap = ncap;
                }
                pending.size[pending.count++] = r.size;
            }
            break;
        case YGM_MPI_SEND_COMPLETE:
            r.start_id = ygm_le64(buf + off + 8);
            r.size = ygm_le32(buf + off + 16);
            break;
        case YGM_BARRIER_BEGIN:
        case YGM_BARRIER_END:
            for (int k = 0; k < 5; k++) r.counters[k] = ygm_le64(buf + off + 8 + 8 * (size_t)k);
            open_barriers += r.kind == YGM_BARRIER_BEGIN ? 1 : -1;
            if (open_barriers < 0 || open_barriers > 1) {
                snprintf(err, err_len, "%s: unpaired barrier record at offset %zu", name, start);
                goto fail;
            }
            break;
        }
        off += need;
        if (count == cap) {
            size_t ncap = cap ? 2 * cap : 256;
            ygm_record_t *n = realloc(records, ncap * sizeof(*n));
            if (n == NULL) {
                snprintf(err, err_len, "%s: out of memory at offset %zu", name, start);
                goto fail;
            }
            records = n;
            cap = ncap;
        }
        records[count++] = r;
    }
    if (open_barriers != 0) {
        snprintf(err, err_len, "%s: the trace ends inside a barrier (offset %zu)", name, len);
        goto fail;
    }
    free(pending.size);
    out->layout = layout;
    out->records = records;
    out->count = count;
    return 0;

fail:
    free(pending.size);
    free(records);
    return -1;
}

int ygm_trace_parse(const uint8_t *buf, size_t len, ygm_layout_t layout, int nranks,
                    const char *name, ygm_trace_t *out, char *err, size_t err_len)
{
    char err_new[512];

    if (layout != YGM_LAYOUT_AUTO) {
        return ygm_parse_as(buf, len, layout, nranks, name, out, err, err_len);
    }
    if (ygm_parse_as(buf, len, YGM_LAYOUT_OLD, nranks, name, out, err, err_len) == 0) return 0;
    if (ygm_parse_as(buf, len, YGM_LAYOUT_NEW, nranks, name, out, err_new, sizeof(err_new)) ==
        0) {
        return 0;
    }
    /* Neither: report both readings, the older first. */
    size_t used = strlen(err);
    snprintf(err + used, err_len - used, "; as the newer layout: %s", err_new);
    return -1;
}

int ygm_trace_read(const char *path, ygm_layout_t layout, int nranks, ygm_trace_t *out,
                   char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    long len;
    int rc = -1;

    if (f == NULL) {
        snprintf(err, err_len, "%s: cannot open", path);
        return -1;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        snprintf(err, err_len, "%s: cannot determine the size", path);
        goto out;
    }
    buf = malloc(len ? (size_t)len : 1);
    if (buf == NULL || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        snprintf(err, err_len, "%s: cannot read %ld bytes", path, len);
        goto out;
    }
    rc = ygm_trace_parse(buf, (size_t)len, layout, nranks, path, out, err, err_len);
out:
    free(buf);
    fclose(f);
    return rc;
}

void ygm_trace_free(ygm_trace_t *trace)
{
    free(trace->records);
    trace->records = NULL;
    trace->count = 0;
}

static void ygm_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void ygm_put64(uint8_t *p, uint64_t v)
{
    ygm_put32(p, (uint32_t)v);
    ygm_put32(p + 4, (uint32_t)(v >> 32));
}

int ygm_trace_write(FILE *f, ygm_layout_t layout, const ygm_record_t *r)
{
    uint8_t buf[4 + 48];
    int32_t type = ygm_kind_index(layout, r->kind);
    size_t need = ygm_payload(layout, r->kind);

    if (type < 0) return -1;
    if (layout == YGM_LAYOUT_OLD && r->kind == YGM_MPI_SEND_COMPLETE &&
        (uint64_t)(int64_t)(int32_t)(uint32_t)r->start_id != r->start_id) {
        return -1; /* The request id would not fit in the destination field. */
    }
    ygm_put32(buf, (uint32_t)type);
    ygm_put64(buf + 4, r->event_id);
    switch (r->kind) {
    case YGM_ASYNC:
    case YGM_MPI_SEND:
    case YGM_MPI_RECV:
        ygm_put32(buf + 12, (uint32_t)r->peer);
        ygm_put32(buf + 16, r->size);
        break;
    case YGM_MPI_SEND_COMPLETE:
        if (layout == YGM_LAYOUT_OLD) {
            ygm_put32(buf + 12, (uint32_t)r->start_id);
            ygm_put32(buf + 16, r->size);
            break;
        }
        ygm_put64(buf + 12, r->start_id);
        ygm_put32(buf + 20, r->size);
        break;
    case YGM_BARRIER_BEGIN:
    case YGM_BARRIER_END:
        for (int k = 0; k < 5; k++) ygm_put64(buf + 12 + 8 * (size_t)k, r->counters[k]);
        break;
    }
    return fwrite(buf, 1, 4 + need, f) == 4 + need ? 0 : -1;
}
