/*
 * kv.c — paged, tiered KV store (design in kv.h).
 *
 * Physical ids: every layer has n_phys head-pages.  When the pool is fully
 * provisioned (the default: n_seq x n_head_kv x ceil(n_ctx / P)), logical
 * page lp of (seq, head) prefers its *home* id, so in the common case one
 * head's pages sit back to back and a dense scan is as sequential as a flat
 * cache; otherwise (or when the home id is taken) a free stack supplies any
 * id.  The free stack may hold stale entries (ids taken through their home
 * slot); pops skip ids in use, and the stack is rebuilt from the in-use map
 * when it would overflow.
 *
 * Slow-tier files are created in the offload directory, unlinked at once (no
 * leftovers after a crash) and reserved with posix_fallocate up front, so a
 * full disk is reported when a layer is offloaded, not in the middle of a
 * step.  All file I/O is pread/pwrite at page-aligned offsets.
 */
#define _GNU_SOURCE
#include "kv/kv.h"

#include "kv/copy.h"
#include "tensor/dtype.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    ks_kv_tier tier;
    uint8_t *fast;        /* [n_phys][page_bytes] pages of a FAST layer */
    uint8_t *slow;        /* [n_phys][page_bytes] memory slow tier (SLOW, no directory) */
    int fd;               /* file slow tier (SLOW with a directory), else -1 */
    uint8_t *slots;       /* [n_sh][n_slot][page_bytes] fast slots of a SLOW layer */
    int32_t *slot_page;   /* [n_sh][n_slot] physical id held by a slot, -1 empty */
    uint32_t *slot_stamp; /* [n_sh][n_slot] fetch stamp of the last use */
    uint32_t *stamp;      /* [n_sh] current fetch stamp of each (seq, head) */
    int32_t *slot_of;     /* [n_phys] slot holding a page, -1 none */
    uint8_t *in_use;      /* [n_phys] */
    int32_t *free_ids;    /* [n_phys] free stack (may hold stale ids) */
    int32_t n_free;
    int32_t *fill;        /* [n_phys] valid entries */
    int32_t *pos;         /* [n_phys][P] positions */
    float *kmin, *kmax, *ksum; /* [n_phys][head_dim] key summaries */
    ks_copy_event ev;
    bool fail_reads;
} kv_layer;

struct ks_kv_store {
    ks_kv_params p;
    int32_t P, hd, nh, max_pages, n_sh, n_slot;
    int32_t n_phys;       /* head-pages per layer */
    size_t row, page_bytes;
    kv_layer *layers;     /* [n_layer] */
    int32_t *table;       /* [n_seq][n_layer][n_head_kv][max_pages] logical -> physical */
    int32_t *n_ent;       /* [n_seq][n_layer][n_head_kv] entries */
    ks_copy_engine *copy;
    float *tmp;           /* [2][head_dim] row conversion scratch (appends are serial) */
    uint8_t *page_tmp;    /* [2][page_bytes] compaction scratch */
    _Atomic uint64_t bytes_loaded, bytes_stored, pages_loaded, pages_hit;
    double wait_seconds;
};

ks_kv_params ks_kv_default_params(void) {
    return (ks_kv_params){.n_seq = 1, .page = 32, .type = KS_KV_F16, .n_copy_threads = 1};
}

size_t ks_kv_page_bytes(const ks_kv_store *kv) { return kv->page_bytes; }
size_t ks_kv_row_size(const ks_kv_store *kv) { return kv->row; }
int32_t ks_kv_page_size(const ks_kv_store *kv) { return kv->P; }
int32_t ks_kv_head_dim(const ks_kv_store *kv) { return kv->hd; }

static size_t hidx(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head) {
    return ((size_t)seq * kv->p.n_layer + (size_t)layer) * (size_t)kv->nh + (size_t)head;
}
static int32_t *table_of(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head) {
    return kv->table + hidx(kv, seq, layer, head) * (size_t)kv->max_pages;
}

int32_t ks_kv_n_entries(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head) {
    return kv->n_ent[hidx(kv, seq, layer, head)];
}
int32_t ks_kv_n_pages(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head) {
    return (ks_kv_n_entries(kv, seq, layer, head) + kv->P - 1) / kv->P;
}

/* Large buffers are streamed end to end; huge pages remove a TLB miss per
 * 4 KiB.  Caller-sized: NULL is reported, never aborted on. */
static uint8_t *big_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (bytes >= huge) {
        size_t n = (bytes + huge - 1) / huge * huge;
        if (posix_memalign(&p, huge, n) != 0) return NULL;
        madvise(p, n, MADV_HUGEPAGE);
        return p;
    }
    return malloc(bytes ? bytes : 1);
}

/* ------------------------------------------------------------ create -- */
void ks_kv_destroy(ks_kv_store *kv) {
    if (!kv) return;
    ks_copy_engine_destroy(kv->copy); /* drains queued loads first */
    for (int32_t l = 0; kv->layers && l < kv->p.n_layer; l++) {
        kv_layer *L = &kv->layers[l];
        free(L->fast);
        free(L->slow);
        free(L->slots);
        if (L->fd >= 0) close(L->fd);
        ks_free(L->slot_page);
        ks_free(L->slot_stamp);
        ks_free(L->stamp);
        ks_free(L->slot_of);
        ks_free(L->in_use);
        ks_free(L->free_ids);
        ks_free(L->fill);
        ks_free(L->pos);
        ks_free(L->kmin);
        ks_free(L->kmax);
        ks_free(L->ksum);
    }
    ks_free(kv->layers);
    ks_free(kv->table);
    ks_free(kv->n_ent);
    ks_free(kv->tmp);
    ks_free(kv->page_tmp);
    ks_free(kv);
}

ks_status ks_kv_create(const ks_kv_params *p, ks_kv_store **out) {
    KS_ASSERT(p && out);
    if (p->page < 1 || p->page > 4096) return KS_FAIL(KS_ERR_INVALID_ARG, "page size %d out of range [1, 4096]", p->page);
    if (p->n_layer < 1 || p->n_head_kv < 1 || p->head_dim < 1 || p->n_seq < 1 || p->n_ctx < 1)
        return KS_FAIL(KS_ERR_INVALID_ARG, "empty KV shape");
    if (p->head_dim > KS_KV_MAX_HEAD_DIM)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "head dim %d exceeds %d", p->head_dim, KS_KV_MAX_HEAD_DIM);
    if (p->type == KS_KV_Q8 && p->head_dim % KS_QK8_0)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "8-bit KV needs a head dim multiple of %d", KS_QK8_0);
    ks_kv_store *kv = ks_calloc(1, sizeof *kv);
    kv->p = *p;
    kv->P = p->page;
    kv->hd = p->head_dim;
    kv->nh = p->n_head_kv;
    kv->max_pages = (p->n_ctx + p->page - 1) / p->page;
    kv->n_sh = p->n_seq * p->n_head_kv;
    kv->n_phys = kv->n_sh * kv->max_pages;
    kv->n_slot = p->slot_pages > 0 && p->slot_pages < kv->max_pages ? p->slot_pages : kv->max_pages;
    kv->row = p->type == KS_KV_F16 ? (size_t)p->head_dim * 2 : ks_dtype_row_bytes(KS_DTYPE_Q8_0, p->head_dim);
    kv->page_bytes = 2 * (size_t)kv->P * kv->row;
    kv->layers = ks_calloc((size_t)p->n_layer, sizeof(kv_layer));
    size_t n_heads_total = (size_t)p->n_seq * p->n_layer * p->n_head_kv;
    kv->table = ks_malloc(sizeof(int32_t) * n_heads_total * (size_t)kv->max_pages);
    kv->n_ent = ks_calloc(n_heads_total, sizeof(int32_t));
    kv->tmp = ks_malloc(sizeof(float) * 2 * (size_t)kv->hd);
    kv->page_tmp = ks_malloc(2 * kv->page_bytes);
    for (int32_t l = 0; l < p->n_layer; l++) {
        kv_layer *L = &kv->layers[l];
        L->fd = -1;
        L->tier = KS_TIER_FAST;
        L->fast = big_alloc((size_t)kv->n_phys * kv->page_bytes);
        if (!L->fast) {
            double gib = (double)p->n_layer * kv->n_phys * kv->page_bytes / 1073741824.0;
            ks_kv_destroy(kv);
            return KS_FAIL(KS_ERR_NOMEM, "KV cache of %.1f GiB (%d seqs x %d tokens) does not fit in memory", gib,
                           p->n_seq, p->n_ctx);
        }
        L->in_use = ks_calloc((size_t)kv->n_phys, 1);
        L->free_ids = ks_malloc(sizeof(int32_t) * (size_t)kv->n_phys);
        for (int32_t i = 0; i < kv->n_phys; i++) L->free_ids[i] = kv->n_phys - 1 - i;
        L->n_free = kv->n_phys;
        L->fill = ks_calloc((size_t)kv->n_phys, sizeof(int32_t));
        L->pos = ks_malloc(sizeof(int32_t) * (size_t)kv->n_phys * kv->P);
        L->kmin = ks_malloc(sizeof(float) * (size_t)kv->n_phys * kv->hd);
        L->kmax = ks_malloc(sizeof(float) * (size_t)kv->n_phys * kv->hd);
        L->ksum = ks_malloc(sizeof(float) * (size_t)kv->n_phys * kv->hd);
        L->slot_of = ks_malloc(sizeof(int32_t) * (size_t)kv->n_phys);
        for (int32_t i = 0; i < kv->n_phys; i++) L->slot_of[i] = -1;
    }
    ks_status st = ks_copy_engine_create(p->n_copy_threads, &kv->copy);
    if (st != KS_OK) {
        ks_kv_destroy(kv);
        return st;
    }
    *out = kv;
    return KS_OK;
}

/* -------------------------------------------------------- page ids -- */
static int32_t page_alloc(ks_kv_store *kv, kv_layer *L, int32_t seq, int32_t head, int32_t lp) {
    int32_t home = ((seq * kv->nh) + head) * kv->max_pages + lp;
    if (home < kv->n_phys && !L->in_use[home]) {
        L->in_use[home] = 1;
        return home;
    }
    while (L->n_free > 0) {
        int32_t id = L->free_ids[--L->n_free];
        if (!L->in_use[id]) {
            L->in_use[id] = 1;
            return id;
        }
    }
    return -1;
}

static void page_free(ks_kv_store *kv, kv_layer *L, int32_t id) {
    KS_ASSERT(L->in_use[id]);
    L->in_use[id] = 0;
    L->fill[id] = 0;
    if (L->slot_of[id] >= 0) { /* a slot must never alias a recycled id */
        L->slot_page[L->slot_of[id]] = -1;
        L->slot_of[id] = -1;
    }
    if (L->n_free == kv->n_phys) { /* stale entries filled the stack: rebuild */
        L->n_free = 0;
        for (int32_t i = kv->n_phys - 1; i >= 0; i--)
            if (!L->in_use[i]) L->free_ids[L->n_free++] = i;
        return;
    }
    L->free_ids[L->n_free++] = id;
}

/* ---------------------------------------------------- page storage -- */
static size_t row_off(const ks_kv_store *kv, int32_t slot, bool is_v) {
    return ((is_v ? (size_t)kv->P : 0) + (size_t)slot) * kv->row;
}

/* Fast-tier layout (FreeKV's hybrid layout): all K halves of a layer's pages
 * back to back, then all V halves, so the K rows of a head whose pages are
 * consecutive ids form one sequential stream for the attention kernel, as in
 * a flat cache.  The slow tier keeps each page's K and V together (one
 * transfer); loads split it into the two halves. */
static size_t half_bytes(const ks_kv_store *kv) { return (size_t)kv->P * kv->row; }
static uint8_t *fast_k(const ks_kv_store *kv, const kv_layer *L, int32_t id) {
    return L->fast + (size_t)id * half_bytes(kv);
}
static uint8_t *fast_v(const ks_kv_store *kv, const kv_layer *L, int32_t id) {
    return L->fast + ((size_t)kv->n_phys + (size_t)id) * half_bytes(kv);
}
static size_t n_slots_total(const ks_kv_store *kv) { return (size_t)kv->n_sh * kv->n_slot; }
static uint8_t *slot_k(const ks_kv_store *kv, const kv_layer *L, int32_t s) {
    return L->slots + (size_t)s * half_bytes(kv);
}
static uint8_t *slot_v(const ks_kv_store *kv, const kv_layer *L, int32_t s) {
    return L->slots + (n_slots_total(kv) + (size_t)s) * half_bytes(kv);
}

/* Contiguous bytes (K then V) of a page in the memory slow tier, or NULL. */
static uint8_t *slow_mem(const ks_kv_store *kv, const kv_layer *L, int32_t id) {
    return L->tier == KS_TIER_SLOW && L->slow ? L->slow + (size_t)id * kv->page_bytes : NULL;
}

static ks_status file_write(int fd, const void *src, size_t n, off_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(fd, (const uint8_t *)src + done, n - done, off + (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return KS_FAIL(KS_ERR_IO, "slow-tier write of %zu bytes failed: %s", n, w < 0 ? strerror(errno) : "short write");
        done += (size_t)w;
    }
    return KS_OK;
}

static ks_status file_read(int fd, void *dst, size_t n, off_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (uint8_t *)dst + done, n - done, off + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return KS_FAIL(KS_ERR_IO, "slow-tier read of %zu bytes failed: %s", n, r < 0 ? strerror(errno) : "end of file");
        done += (size_t)r;
    }
    return KS_OK;
}

/* Whole page to buf (any tier). */
static ks_status page_read(const ks_kv_store *kv, const kv_layer *L, int32_t id, uint8_t *buf) {
    if (L->tier == KS_TIER_FAST) {
        memcpy(buf, fast_k(kv, L, id), half_bytes(kv));
        memcpy(buf + half_bytes(kv), fast_v(kv, L, id), half_bytes(kv));
        return KS_OK;
    }
    if (L->fail_reads) return KS_FAIL(KS_ERR_IO, "slow-tier read failed (injected)");
    const uint8_t *m = slow_mem(kv, L, id);
    if (m) {
        memcpy(buf, m, kv->page_bytes);
        return KS_OK;
    }
    return file_read(L->fd, buf, kv->page_bytes, (off_t)id * (off_t)kv->page_bytes);
}

static ks_status page_write(ks_kv_store *kv, kv_layer *L, int32_t id, const uint8_t *buf) {
    if (L->tier == KS_TIER_FAST) {
        memcpy(fast_k(kv, L, id), buf, half_bytes(kv));
        memcpy(fast_v(kv, L, id), buf + half_bytes(kv), half_bytes(kv));
        return KS_OK;
    }
    uint8_t *m = slow_mem(kv, L, id);
    if (m) memcpy(m, buf, kv->page_bytes);
    else KS_TRY(file_write(L->fd, buf, kv->page_bytes, (off_t)id * (off_t)kv->page_bytes));
    atomic_fetch_add(&kv->bytes_stored, kv->page_bytes);
    int32_t s = L->slot_of[id];
    if (s >= 0) {
        memcpy(slot_k(kv, L, s), buf, half_bytes(kv));
        memcpy(slot_v(kv, L, s), buf + half_bytes(kv), half_bytes(kv));
    }
    return KS_OK;
}

static void row_to_f32(const ks_kv_store *kv, const uint8_t *row, float *dst) {
    if (kv->p.type == KS_KV_F16) {
        const ks_f16 *h = (const ks_f16 *)row;
        for (int i = 0; i < kv->hd; i++) dst[i] = ks_f16_to_f32(h[i]);
    } else {
        ks_dequantize_row(KS_DTYPE_Q8_0, row, dst, kv->hd);
    }
}

static void row_from_f32(const ks_kv_store *kv, const float *src, uint8_t *row) {
    if (kv->p.type == KS_KV_F16) {
        ks_f16 *h = (ks_f16 *)row;
        for (int i = 0; i < kv->hd; i++) h[i] = ks_f32_to_f16(src[i]);
    } else {
        ks_quantize_row(KS_DTYPE_Q8_0, src, row, kv->hd);
    }
}

/* Fold one stored key into the page summaries (slot = its index in the page). */
static void meta_add(ks_kv_store *kv, kv_layer *L, int32_t id, int32_t slot, int32_t pos, const float *key) {
    float *mn = L->kmin + (size_t)id * kv->hd, *mx = L->kmax + (size_t)id * kv->hd, *sm = L->ksum + (size_t)id * kv->hd;
    if (slot == 0) {
        memcpy(mn, key, sizeof(float) * kv->hd);
        memcpy(mx, key, sizeof(float) * kv->hd);
        memcpy(sm, key, sizeof(float) * kv->hd);
    } else {
        for (int i = 0; i < kv->hd; i++) {
            if (key[i] < mn[i]) mn[i] = key[i];
            if (key[i] > mx[i]) mx[i] = key[i];
            sm[i] += key[i];
        }
    }
    L->pos[(size_t)id * kv->P + slot] = pos;
    L->fill[id] = slot + 1;
}

/* ----------------------------------------------------------- append -- */
ks_status ks_kv_append(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t pos, const float *k,
                       const float *v) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq && layer >= 0 && layer < kv->p.n_layer && head >= 0 && head < kv->nh);
    kv_layer *L = &kv->layers[layer];
    size_t hi = hidx(kv, seq, layer, head);
    int32_t n = kv->n_ent[hi];
    if (n >= kv->p.n_ctx) return KS_FAIL(KS_ERR_CONTEXT_FULL, "KV head holds %d entries already", n);
    int32_t lp = n / kv->P, slot = n % kv->P;
    int32_t *tab = table_of(kv, seq, layer, head);
    if (slot == 0) {
        int32_t id = page_alloc(kv, L, seq, head, lp);
        if (id < 0) return KS_FAIL(KS_ERR_NOMEM, "layer %d KV page pool exhausted (%d pages)", layer, kv->n_phys);
        tab[lp] = id;
    }
    int32_t id = tab[lp];
    /* stack scratch: appends to different layers may run in parallel */
    uint8_t krow[KS_KV_MAX_HEAD_DIM * 2], vrow[KS_KV_MAX_HEAD_DIM * 2];
    float key[KS_KV_MAX_HEAD_DIM];
    row_from_f32(kv, k, krow);
    row_from_f32(kv, v, vrow);
    if (L->tier == KS_TIER_SLOW) {
        /* an in-flight load of this page must land before the newer row */
        KS_TRY(ks_copy_wait(&L->ev, &kv->wait_seconds));
        if (L->fd >= 0) {
            off_t base = (off_t)id * (off_t)kv->page_bytes;
            KS_TRY(file_write(L->fd, krow, kv->row, base + (off_t)row_off(kv, slot, false)));
            KS_TRY(file_write(L->fd, vrow, kv->row, base + (off_t)row_off(kv, slot, true)));
        }
        atomic_fetch_add(&kv->bytes_stored, 2 * kv->row);
        if (L->slot_of[id] >= 0) {
            memcpy(slot_k(kv, L, L->slot_of[id]) + (size_t)slot * kv->row, krow, kv->row);
            memcpy(slot_v(kv, L, L->slot_of[id]) + (size_t)slot * kv->row, vrow, kv->row);
        }
        uint8_t *m = slow_mem(kv, L, id);
        if (m) {
            memcpy(m + row_off(kv, slot, false), krow, kv->row);
            memcpy(m + row_off(kv, slot, true), vrow, kv->row);
        }
    } else {
        memcpy(fast_k(kv, L, id) + (size_t)slot * kv->row, krow, kv->row);
        memcpy(fast_v(kv, L, id) + (size_t)slot * kv->row, vrow, kv->row);
    }
    row_to_f32(kv, krow, key);
    meta_add(kv, L, id, slot, pos, key);
    kv->n_ent[hi] = n + 1;
    return KS_OK;
}

static void head_clear(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head) {
    kv_layer *L = &kv->layers[layer];
    size_t hi = hidx(kv, seq, layer, head);
    int32_t np = (kv->n_ent[hi] + kv->P - 1) / kv->P;
    int32_t *tab = table_of(kv, seq, layer, head);
    for (int32_t i = 0; i < np; i++) page_free(kv, L, tab[i]);
    kv->n_ent[hi] = 0;
}

void ks_kv_seq_clear(ks_kv_store *kv, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq);
    for (int32_t l = 0; l < kv->p.n_layer; l++) {
        (void)ks_copy_wait(&kv->layers[l].ev, NULL); /* no load may land in a recycled slot */
        for (int32_t h = 0; h < kv->nh; h++) head_clear(kv, seq, l, h);
    }
}

ks_status ks_kv_compact(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, const uint8_t *keep) {
    kv_layer *L = &kv->layers[layer];
    KS_TRY(ks_copy_wait(&L->ev, &kv->wait_seconds));
    size_t hi = hidx(kv, seq, layer, head);
    int32_t n = kv->n_ent[hi], P = kv->P;
    int32_t *tab = table_of(kv, seq, layer, head);
    uint8_t *src = kv->page_tmp, *dst = kv->page_tmp + kv->page_bytes;
    int32_t w = 0, src_lp = -1, dst_lp = -1;
    float *key = kv->tmp;
    /* Survivors move forward in order (w <= r), so pages are rewritten in
     * place: read a source page once, fill a destination page, write it back
     * when full or done.  Positions travel with their rows. */
    int32_t *pos_keep = ks_malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    for (int32_t r = 0; r < n; r++) {
        if (!keep[r]) continue;
        int32_t rlp = r / P, rs = r % P;
        if (rlp != src_lp) {
            KS_TRY(page_read(kv, L, tab[rlp], src));
            src_lp = rlp;
        }
        int32_t wlp = w / P, ws = w % P;
        if (wlp != dst_lp) {
            if (dst_lp >= 0) KS_TRY(page_write(kv, L, tab[dst_lp], dst));
            if (wlp == src_lp) memcpy(dst, src, kv->page_bytes);
            else KS_TRY(page_read(kv, L, tab[wlp], dst));
            dst_lp = wlp;
        }
        pos_keep[w] = L->pos[(size_t)tab[rlp] * P + rs];
        memcpy(dst + row_off(kv, ws, false), src + row_off(kv, rs, false), kv->row);
        memcpy(dst + row_off(kv, ws, true), src + row_off(kv, rs, true), kv->row);
        w++;
    }
    if (dst_lp >= 0) KS_TRY(page_write(kv, L, tab[dst_lp], dst));
    /* rebuild summaries of the surviving pages, free the rest */
    int32_t np_old = (n + P - 1) / P, np_new = (w + P - 1) / P;
    for (int32_t lp = 0; lp < np_new; lp++) {
        int32_t id = tab[lp];
        KS_TRY(page_read(kv, L, id, src));
        int32_t fill = w - lp * P < P ? w - lp * P : P;
        for (int32_t s = 0; s < fill; s++) {
            row_to_f32(kv, src + row_off(kv, s, false), key);
            meta_add(kv, L, id, s, pos_keep[lp * P + s], key);
        }
    }
    for (int32_t lp = np_new; lp < np_old; lp++) page_free(kv, L, tab[lp]);
    kv->n_ent[hi] = w;
    ks_free(pos_keep);
    return KS_OK;
}

/* ---------------------------------------------------------- metadata -- */
void ks_kv_page_meta_get(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp,
                         ks_kv_page_meta *out) {
    KS_ASSERT(lp >= 0 && lp < ks_kv_n_pages(kv, seq, layer, head));
    const kv_layer *L = &kv->layers[layer];
    int32_t id = table_of(kv, seq, layer, head)[lp];
    out->fill = L->fill[id];
    out->pos = L->pos + (size_t)id * kv->P;
    out->kmin = L->kmin + (size_t)id * kv->hd;
    out->kmax = L->kmax + (size_t)id * kv->hd;
    out->ksum = L->ksum + (size_t)id * kv->hd;
}

/* ------------------------------------------------------------- tiers -- */
ks_kv_tier ks_kv_layer_tier(const ks_kv_store *kv, int32_t layer) { return kv->layers[layer].tier; }

static ks_status open_slow_file(const ks_kv_store *kv, int32_t layer, int *fd_out) {
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/kvsieve-%d-%p-layer%d.kv", kv->p.offload_dir, (int)getpid(), (void *)kv,
                     layer);
    if (n < 0 || (size_t)n >= sizeof path) return KS_FAIL(KS_ERR_INVALID_ARG, "offload directory path is too long");
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return KS_FAIL(KS_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    unlink(path); /* anonymous from now on: nothing is left behind */
    off_t bytes = (off_t)kv->n_phys * (off_t)kv->page_bytes;
    int e = posix_fallocate(fd, 0, bytes);
    if (e != 0) {
        close(fd);
        return KS_FAIL(KS_ERR_IO, "cannot reserve %.1f MiB for layer %d in %s: %s", bytes / 1048576.0, layer,
                       kv->p.offload_dir, strerror(e));
    }
    *fd_out = fd;
    return KS_OK;
}

ks_status ks_kv_set_layer_tier(ks_kv_store *kv, int32_t layer, ks_kv_tier tier) {
    KS_ASSERT(layer >= 0 && layer < kv->p.n_layer);
    kv_layer *L = &kv->layers[layer];
    if (L->tier == tier) return KS_OK;
    KS_TRY(ks_copy_wait(&L->ev, &kv->wait_seconds));
    size_t total = (size_t)kv->n_phys * kv->page_bytes;
    if (tier == KS_TIER_SLOW) {
        int fd = -1;
        uint8_t *slow = NULL;
        if (kv->p.offload_dir) KS_TRY(open_slow_file(kv, layer, &fd));
        else if (!(slow = big_alloc(total))) return KS_FAIL(KS_ERR_NOMEM, "slow tier of %zu bytes refused", total);
        uint8_t *slots = big_alloc((size_t)kv->n_sh * kv->n_slot * kv->page_bytes);
        if (!slots) {
            if (fd >= 0) close(fd);
            free(slow);
            return KS_FAIL(KS_ERR_NOMEM, "fast-tier slots for layer %d refused", layer);
        }
        /* copy the pages in use; the rest of the file stays reserved */
        for (int32_t id = 0; id < kv->n_phys; id++) {
            if (!L->in_use[id]) continue;
            uint8_t *src = kv->page_tmp;
            memcpy(src, fast_k(kv, L, id), half_bytes(kv));
            memcpy(src + half_bytes(kv), fast_v(kv, L, id), half_bytes(kv));
            if (slow) memcpy(slow + (size_t)id * kv->page_bytes, src, kv->page_bytes);
            else {
                ks_status st = file_write(fd, src, kv->page_bytes, (off_t)id * (off_t)kv->page_bytes);
                if (st != KS_OK) {
                    close(fd);
                    free(slots);
                    return st;
                }
            }
            atomic_fetch_add(&kv->bytes_stored, kv->page_bytes);
        }
        free(L->fast);
        L->fast = NULL;
        L->slow = slow;
        L->fd = fd;
        L->slots = slots;
        L->slot_page = ks_malloc(sizeof(int32_t) * (size_t)kv->n_sh * kv->n_slot);
        L->slot_stamp = ks_calloc((size_t)kv->n_sh * kv->n_slot, sizeof(uint32_t));
        L->stamp = ks_calloc((size_t)kv->n_sh, sizeof(uint32_t));
        for (size_t i = 0; i < (size_t)kv->n_sh * kv->n_slot; i++) L->slot_page[i] = -1;
        for (int32_t i = 0; i < kv->n_phys; i++) L->slot_of[i] = -1;
        L->tier = KS_TIER_SLOW;
        return KS_OK;
    }
    uint8_t *fast = big_alloc(total);
    if (!fast) return KS_FAIL(KS_ERR_NOMEM, "fast tier of %zu bytes refused for layer %d", total, layer);
    for (int32_t id = 0; id < kv->n_phys; id++) {
        if (!L->in_use[id]) continue;
        ks_status st = page_read(kv, L, id, kv->page_tmp);
        if (st != KS_OK) {
            free(fast);
            return st;
        }
        memcpy(fast + (size_t)id * half_bytes(kv), kv->page_tmp, half_bytes(kv));
        memcpy(fast + ((size_t)kv->n_phys + id) * half_bytes(kv), kv->page_tmp + half_bytes(kv), half_bytes(kv));
        atomic_fetch_add(&kv->bytes_loaded, kv->page_bytes);
    }
    free(L->slow);
    free(L->slots);
    if (L->fd >= 0) close(L->fd);
    ks_free(L->slot_page);
    ks_free(L->slot_stamp);
    ks_free(L->stamp);
    L->slow = L->slots = NULL;
    L->slot_page = NULL;
    L->slot_stamp = L->stamp = NULL;
    L->fd = -1;
    L->fast = fast;
    for (int32_t i = 0; i < kv->n_phys; i++) L->slot_of[i] = -1;
    L->tier = KS_TIER_FAST;
    return KS_OK;
}

static int cmp_victim(const void *a, const void *b, void *arg) {
    const uint32_t *st = arg;
    uint32_t x = st[*(const int32_t *)a], y = st[*(const int32_t *)b];
    return (x > y) - (x < y);
}

ks_status ks_kv_fetch(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, const int32_t *lp, int32_t n,
                      bool async) {
    kv_layer *L = &kv->layers[layer];
    if (L->tier == KS_TIER_FAST || n <= 0) return KS_OK;
    /* a synchronous fetch reads what it maps right away: earlier loads of the
     * layer (prefetches into slots this call may reuse) must have landed */
    if (!async && atomic_load(&L->ev.pending) > 0) KS_TRY(ks_copy_wait(&L->ev, &kv->wait_seconds));
    int32_t sh = seq * kv->nh + head, np = ks_kv_n_pages(kv, seq, layer, head);
    const int32_t *tab = table_of(kv, seq, layer, head);
    int32_t *sp = L->slot_page + (size_t)sh * kv->n_slot;
    uint32_t *ss = L->slot_stamp + (size_t)sh * kv->n_slot;
    uint32_t cur = ++L->stamp[sh];
    if (cur == 0) { /* wrapped: restart the clock */
        memset(ss, 0, sizeof(uint32_t) * kv->n_slot);
        cur = L->stamp[sh] = 1;
    }
    int32_t n_miss = 0;
    for (int32_t i = 0; i < n; i++) {
        KS_ASSERT(lp[i] >= 0 && lp[i] < np);
        int32_t s = L->slot_of[tab[lp[i]]];
        if (s >= 0) {
            ss[s - sh * kv->n_slot] = cur;
        } else {
            n_miss++;
        }
    }
    if (n_miss == 0) {
        atomic_fetch_add(&kv->pages_hit, (uint64_t)n);
        /* hits may still be loading (prefetched): a synchronous caller reads now */
        if (!async && atomic_load(&L->ev.pending) > 0) KS_TRY(ks_copy_wait(&L->ev, &kv->wait_seconds));
        return KS_OK;
    }
    /* victims: slots not needed by this request, least recently used first */
    int32_t *vic = ks_malloc(sizeof(int32_t) * (size_t)kv->n_slot);
    int32_t n_vic = 0;
    for (int32_t s = 0; s < kv->n_slot; s++)
        if (ss[s] != cur) vic[n_vic++] = s;
    qsort_r(vic, (size_t)n_vic, sizeof(int32_t), cmp_victim, ss);
    int32_t next = 0;
    ks_status st = KS_OK;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = tab[lp[i]];
        if (L->slot_of[id] >= 0) continue;
        if (next == n_vic) {
            st = KS_FAIL(KS_ERR_NOMEM, "a selection of %d pages exceeds the %d fast-tier slots of a KV head", n, kv->n_slot);
            break;
        }
        int32_t s = vic[next++];
        if (sp[s] >= 0) L->slot_of[sp[s]] = -1;
        sp[s] = id;
        ss[s] = cur;
        L->slot_of[id] = sh * kv->n_slot + s;
        ks_copy_job job = {.src = L->slow ? L->slow + (size_t)id * kv->page_bytes : NULL,
                           .fd = L->fd,
                           .offset = (off_t)id * (off_t)kv->page_bytes,
                           .dst = slot_k(kv, L, sh * kv->n_slot + s),
                           .dst2 = slot_v(kv, L, sh * kv->n_slot + s),
                           .bytes = kv->page_bytes,
                           .fail = L->fail_reads,
                           .ev = &L->ev};
        if (async) ks_copy_submit(kv->copy, &job);
        else {
            ks_copy_run(&job);
            if (atomic_load(&L->ev.failed)) {
                atomic_store(&L->ev.failed, 0);
                sp[s] = -1;
                L->slot_of[id] = -1;
                st = KS_FAIL(KS_ERR_IO, "%s", L->ev.msg);
                break;
            }
        }
        atomic_fetch_add(&kv->bytes_loaded, kv->page_bytes);
        atomic_fetch_add(&kv->pages_loaded, 1);
    }
    atomic_fetch_add(&kv->pages_hit, (uint64_t)(n - n_miss));
    ks_free(vic);
    return st;
}

ks_status ks_kv_wait_layer(ks_kv_store *kv, int32_t layer) {
    kv_layer *L = &kv->layers[layer];
    if (L->tier == KS_TIER_FAST) return KS_OK;
    ks_status st = ks_copy_wait(&L->ev, &kv->wait_seconds);
    if (st != KS_OK) {
        /* slots whose load may have failed cannot be trusted: drop them all */
        for (size_t i = 0; i < (size_t)kv->n_sh * kv->n_slot; i++) {
            if (L->slot_page[i] >= 0) L->slot_of[L->slot_page[i]] = -1;
            L->slot_page[i] = -1;
        }
    }
    return st;
}

void ks_kv_page_rows(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp, const uint8_t **K,
                     const uint8_t **V) {
    const kv_layer *L = &kv->layers[layer];
    int32_t id = table_of(kv, seq, layer, head)[lp];
    if (L->tier == KS_TIER_FAST) {
        *K = fast_k(kv, L, id);
        *V = fast_v(kv, L, id);
    } else {
        int32_t s = L->slot_of[id];
        KS_ASSERT(s >= 0); /* the page was fetched this step */
        *K = slot_k(kv, L, s);
        *V = slot_v(kv, L, s);
    }
}

void ks_kv_take_traffic(ks_kv_store *kv, ks_kv_traffic *out) {
    out->bytes_loaded = atomic_exchange(&kv->bytes_loaded, 0);
    out->bytes_stored = atomic_exchange(&kv->bytes_stored, 0);
    out->pages_loaded = atomic_exchange(&kv->pages_loaded, 0);
    out->pages_hit = atomic_exchange(&kv->pages_hit, 0);
    out->copy_seconds = ks_copy_take_busy(kv->copy);
    out->wait_seconds = kv->wait_seconds;
    kv->wait_seconds = 0;
}

void ks_kv_memory(const ks_kv_store *kv, uint64_t *fast_bytes, uint64_t *slow_bytes) {
    uint64_t f = 0, s = 0, all = (uint64_t)kv->n_phys * kv->page_bytes;
    for (int32_t l = 0; l < kv->p.n_layer; l++) {
        if (kv->layers[l].tier == KS_TIER_FAST) f += all;
        else {
            s += all;
            f += (uint64_t)kv->n_sh * kv->n_slot * kv->page_bytes;
        }
    }
    *fast_bytes = f;
    *slow_bytes = s;
}

void ks_kv_debug_fail_reads(ks_kv_store *kv, int32_t layer, bool fail) { kv->layers[layer].fail_reads = fail; }

ks_status ks_kv_truncate(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t n_keep) {
    int32_t n = ks_kv_n_entries(kv, seq, layer, head);
    KS_ASSERT(n_keep >= 0 && n_keep <= n);
    if (n_keep == n) return KS_OK;
    uint8_t *keep = ks_malloc((size_t)n);
    for (int32_t i = 0; i < n; i++) keep[i] = i < n_keep;
    ks_status st = ks_kv_compact(kv, seq, layer, head, keep);
    ks_free(keep);
    return st;
}

ks_status ks_kv_read_page(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp, uint8_t *buf) {
    KS_ASSERT(lp >= 0 && lp < ks_kv_n_pages(kv, seq, layer, head));
    kv_layer *L = &kv->layers[layer];
    int32_t id = table_of(kv, seq, layer, head)[lp];
    KS_TRY(page_read(kv, L, id, buf));
    if (L->tier == KS_TIER_SLOW) { /* a gathered page is a load that no slot will keep */
        atomic_fetch_add(&kv->bytes_loaded, kv->page_bytes);
        atomic_fetch_add(&kv->pages_loaded, 1);
    }
    return KS_OK;
}

int32_t ks_kv_slot_pages(const ks_kv_store *kv) { return kv->n_slot; }
