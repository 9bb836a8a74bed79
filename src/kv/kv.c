/*
 * kv.c — paged, tiered KV store (design in kv.h): pages, appends,
 * compaction and metadata; where page bytes live is kv_tier.c.
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
 * Appends and compaction write rows through to whichever tier holds the
 * layer (and to a slot that maps the page), after the layer's in-flight
 * loads have landed, so a load can never overwrite a newer row.
 *
 * Shared pages (kv.h): refs[id] counts the page tables and pins holding a
 * page, pins[id] the pins alone; a page returns to the free stack when both
 * reach zero.  Only a full page is ever shared, and nothing writes a full
 * page except compaction, which first gives the head its own copy of every
 * page it will rewrite (ks_kv_page_private: the copy-on-write step, which
 * copies the metadata with the rows, so summaries never need recomputing).
 * Pages before compaction's first dropped entry are left alone, which also
 * keeps an evictor's cut from rewriting an untouched shared prefix.
 */
#include "kv/kv_internal.h"

#include "core/file.h"
#include "tensor/dtype.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

ks_kv_params ks_kv_default_params(void) {
    return (ks_kv_params){.n_seq = 1, .page = 32, .type = KS_KV_F16, .n_copy_threads = 1};
}

size_t ks_kv_page_bytes(const ks_kv_store *kv) { return kv->page_bytes; }
size_t ks_kv_row_size(const ks_kv_store *kv) { return kv->row; }
size_t ks_kv_page_v_off(const ks_kv_store *kv) { return kv_row_off(kv, 0, true); }
int32_t ks_kv_page_size(const ks_kv_store *kv) { return kv->P; }
int32_t ks_kv_head_dim(const ks_kv_store *kv) { return kv->hd; }

int32_t ks_kv_n_entries(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head) {
    return kv->n_ent[kv_hidx(kv, seq, layer, head)];
}
int32_t ks_kv_n_pages(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head) {
    return (ks_kv_n_entries(kv, seq, layer, head) + kv->P - 1) / kv->P;
}

/* ------------------------------------------------------------ create -- */
void ks_kv_destroy(ks_kv_store *kv) {
    if (!kv) return;
    if (kv->pin_release) kv->pin_release(kv->pin_release_arg, kv); /* the holder copies out what it keeps */
    ks_copy_engine_destroy(kv->copy); /* drains queued loads first */
    for (int32_t i = 0; kv->parked && i < kv->p.n_seq; i++) ks_kv_parked_free(kv->parked[i]);
    ks_free(kv->parked);
    for (int32_t l = 0; kv->layers && l < kv->p.n_layer; l++) {
        kv_layer *L = &kv->layers[l];
        free(L->fast);
        ks_kv_release_slow(L);
        ks_free(L->slot_of);
        ks_free(L->in_use);
        ks_free(L->refs);
        ks_free(L->pins);
        ks_free(L->free_ids);
        ks_free(L->fill);
        ks_free(L->pos);
        ks_free(L->kmin);
        ks_free(L->kmax);
        ks_free(L->ksum);
        ks_free(L->kbound16);
        ks_free(L->kbound8);
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
    if (!kv) return KS_FAIL(KS_ERR_NOMEM, "KV store");
    kv->p = *p;
    kv->P = p->page;
    kv->hd = p->head_dim;
    kv->nh = p->n_head_kv;
    kv->max_pages = (p->n_ctx + p->page - 1) / p->page;
    kv->n_sh = p->n_seq * p->n_head_kv;
    kv->pin_cap = p->pin_pages > 0 ? p->pin_pages : 0;
    if ((int64_t)kv->n_sh * kv->max_pages + kv->pin_cap > INT32_MAX / (kv->P > 0 ? kv->P : 1))
        kv->pin_cap = 0; /* ids (and entry ids id * P + row) stay in int32 */
    kv->n_phys = kv->n_sh * kv->max_pages + kv->pin_cap;
    kv->n_slot = p->slot_entries > 0 && p->slot_entries < kv->max_pages * kv->P ? p->slot_entries : kv->max_pages * kv->P;
    kv->row = ks_kv_row_bytes(p->type, p->head_dim);
    kv->page_bytes = kv_n_halves(kv) * (size_t)kv->P * kv->row;
    kv->layers = ks_calloc((size_t)p->n_layer, sizeof(kv_layer));
    size_t n_heads_total = (size_t)p->n_seq * p->n_layer * p->n_head_kv;
    kv->table = ks_malloc(sizeof(int32_t) * n_heads_total * (size_t)kv->max_pages);
    kv->n_ent = ks_calloc(n_heads_total, sizeof(int32_t));
    kv->tmp = ks_malloc(sizeof(float) * 2 * (size_t)kv->hd);
    kv->page_tmp = ks_malloc(2 * kv->page_bytes);
    kv->parked = ks_calloc((size_t)p->n_seq, sizeof(kv_parked *));
    for (int32_t l = 0; kv->layers && l < p->n_layer; l++) kv->layers[l].fd = -1; /* destroy may run before a layer is built */
    if (!kv->layers || !kv->table || !kv->n_ent || !kv->tmp || !kv->page_tmp || !kv->parked) {
        ks_kv_destroy(kv);
        return KS_FAIL(KS_ERR_NOMEM, "KV tables of %d seqs x %d layers", p->n_seq, p->n_layer);
    }
    for (int32_t l = 0; l < p->n_layer; l++) {
        kv_layer *L = &kv->layers[l];
        L->tier = KS_TIER_FAST;
        L->fast = ks_alloc_streamed((size_t)kv->n_phys * kv->page_bytes);
        if (!L->fast) {
            double gib = (double)p->n_layer * kv->n_phys * kv->page_bytes / 1073741824.0;
            ks_kv_destroy(kv);
            return KS_FAIL(KS_ERR_NOMEM, "KV cache of %.1f GiB (%d seqs x %d tokens) does not fit in memory", gib,
                           p->n_seq, p->n_ctx);
        }
        L->in_use = ks_calloc((size_t)kv->n_phys, 1);
        L->refs = ks_calloc((size_t)kv->n_phys, sizeof(int32_t));
        L->pins = ks_calloc((size_t)kv->n_phys, sizeof(int32_t));
        L->free_ids = ks_malloc(sizeof(int32_t) * (size_t)kv->n_phys);
        L->fill = ks_calloc((size_t)kv->n_phys, sizeof(int32_t));
        L->pos = ks_malloc(sizeof(int32_t) * (size_t)kv->n_phys * kv->P);
        L->kmin = ks_malloc(sizeof(float) * (size_t)kv->n_phys * kv->hd);
        L->kmax = ks_malloc(sizeof(float) * (size_t)kv->n_phys * kv->hd);
        L->ksum = ks_malloc(sizeof(float) * (size_t)kv->n_phys * kv->hd);
        if (p->type == KS_KV_F16) L->kbound16 = ks_malloc(sizeof(uint16_t) * 2 * (size_t)kv->n_phys * kv->hd);
        L->kbound8 = ks_malloc(ks_kv_bounds8_bytes(kv->hd) * (size_t)kv->n_phys);
        L->slot_of = ks_malloc(sizeof(int32_t) * (size_t)kv->n_phys * kv->P);
        if (!L->in_use || !L->refs || !L->pins || !L->free_ids || !L->fill || !L->pos || !L->kmin || !L->kmax || !L->ksum ||
            (p->type == KS_KV_F16 && !L->kbound16) || !L->kbound8 || !L->slot_of) {
            ks_kv_destroy(kv);
            return KS_FAIL(KS_ERR_NOMEM, "page tables of KV layer %d", l);
        }
        for (size_t i = 0; i < (size_t)kv->n_phys * kv->P; i++) L->slot_of[i] = -1;
        for (int32_t i = 0; i < kv->n_phys; i++) L->free_ids[i] = kv->n_phys - 1 - i;
        L->n_free = kv->n_phys;
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
int32_t ks_kv_page_alloc(ks_kv_store *kv, kv_layer *L, int32_t seq, int32_t head, int32_t lp) {
    int32_t home = ((seq * kv->nh) + head) * kv->max_pages + lp;
    if (home < kv->n_phys && !L->in_use[home]) {
        L->in_use[home] = 1;
        L->refs[home] = 1;
        return home;
    }
    while (L->n_free > 0) {
        int32_t id = L->free_ids[--L->n_free];
        if (!L->in_use[id]) {
            L->in_use[id] = 1;
            L->refs[id] = 1;
            return id;
        }
    }
    return -1;
}

/* The last holder let go: the page returns to the pool. */
static void page_release(ks_kv_store *kv, kv_layer *L, int32_t id) {
    KS_ASSERT(L->in_use[id] && L->refs[id] == 0 && L->pins[id] == 0);
    L->in_use[id] = 0;
    L->fill[id] = 0;
    for (int32_t r = 0; r < kv->P; r++) { /* a slot must never alias a recycled id */
        int32_t *so = &L->slot_of[(size_t)id * kv->P + r];
        if (*so >= 0) {
            L->slot_ent[*so] = -1;
            *so = -1;
        }
    }
    if (L->n_free == kv->n_phys) { /* stale entries filled the stack: rebuild */
        L->n_free = 0;
        for (int32_t i = kv->n_phys - 1; i >= 0; i--)
            if (!L->in_use[i]) L->free_ids[L->n_free++] = i;
        return;
    }
    L->free_ids[L->n_free++] = id;
}

/* A page table lets go of page id (the sharing counters follow). */
static void page_unref(ks_kv_store *kv, kv_layer *L, int32_t id) {
    int32_t tabled = L->refs[id] - L->pins[id];
    KS_ASSERT(tabled >= 1);
    if (tabled >= 2) L->dup_pages--;
    else if (L->pins[id] > 0) L->pin_tabled--;
    if (--L->refs[id] == 0) page_release(kv, L, id);
}

ks_status ks_kv_page_private(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp) {
    kv_layer *L = &kv->layers[layer];
    int32_t *tab = kv_table_of(kv, seq, layer, head), id = tab[lp];
    if (L->refs[id] == 1) return KS_OK; /* this table's alone */
    int32_t nid = ks_kv_page_alloc(kv, L, seq, head, lp);
    if (nid < 0) return KS_FAIL(KS_ERR_NOMEM, "layer %d KV page pool exhausted (%d pages) copying a shared page", layer, kv->n_phys);
    if (L->tier == KS_TIER_FAST) {
        memcpy(kv_fast_k(kv, L, nid), kv_fast_k(kv, L, id), kv_half_bytes(kv));
        if (!kv->p.k_only) memcpy(kv_fast_v(kv, L, nid), kv_fast_v(kv, L, id), kv_half_bytes(kv));
    } else { /* rare (layers are unshared when they move): a heap buffer, since appends to other layers run meanwhile */
        uint8_t *buf = ks_malloc(kv->page_bytes);
        ks_status st = buf ? ks_kv_page_read(kv, L, id, buf) : KS_FAIL(KS_ERR_NOMEM, "a page copy of %zu bytes", kv->page_bytes);
        if (st == KS_OK) st = ks_kv_page_write(kv, L, nid, buf);
        ks_free(buf);
        if (st != KS_OK) {
            L->refs[nid] = 0;
            page_release(kv, L, nid);
            return st;
        }
    }
    size_t hd = (size_t)kv->hd, b8 = ks_kv_bounds8_bytes(kv->hd);
    L->fill[nid] = L->fill[id];
    memcpy(L->pos + (size_t)nid * kv->P, L->pos + (size_t)id * kv->P, sizeof(int32_t) * kv->P);
    memcpy(L->kmin + nid * hd, L->kmin + id * hd, sizeof(float) * hd);
    memcpy(L->kmax + nid * hd, L->kmax + id * hd, sizeof(float) * hd);
    memcpy(L->ksum + nid * hd, L->ksum + id * hd, sizeof(float) * hd);
    if (L->kbound16) memcpy(L->kbound16 + nid * 2 * hd, L->kbound16 + id * 2 * hd, sizeof(uint16_t) * 2 * hd);
    memcpy(L->kbound8 + nid * b8, L->kbound8 + id * b8, b8);
    page_unref(kv, L, id);
    tab[lp] = nid;
    return KS_OK;
}

/* ----------------------------------------------------- shared pages -- */
ks_status ks_kv_pin(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp, int32_t *id) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq && layer >= 0 && layer < kv->p.n_layer && head >= 0 && head < kv->nh);
    KS_ASSERT(lp >= 0 && lp < ks_kv_n_pages(kv, seq, layer, head));
    kv_layer *L = &kv->layers[layer];
    int32_t pid = kv_table_of(kv, seq, layer, head)[lp];
    if (L->tier != KS_TIER_FAST) return KS_FAIL(KS_ERR_UNSUPPORTED, "layer %d is in the slow tier: its pages are not pinned", layer);
    if (L->fill[pid] != kv->P) return KS_FAIL(KS_ERR_UNSUPPORTED, "only a full page is immutable, and pinned");
    if (L->pins[pid] == 0) {
        if (L->n_pinned >= kv->pin_cap)
            return KS_FAIL(KS_ERR_NOMEM, "layer %d: all %d pages of the pin headroom are pinned", layer, kv->pin_cap);
        L->n_pinned++;
        L->pin_tabled++; /* this table holds it */
    }
    L->pins[pid]++;
    L->refs[pid]++;
    *id = pid;
    return KS_OK;
}

void ks_kv_unpin(ks_kv_store *kv, int32_t layer, int32_t id) {
    kv_layer *L = &kv->layers[layer];
    KS_ASSERT(id >= 0 && id < kv->n_phys && L->pins[id] > 0);
    if (--L->pins[id] == 0) {
        L->n_pinned--;
        if (L->refs[id] - 1 > 0) L->pin_tabled--;
    }
    if (--L->refs[id] == 0) page_release(kv, L, id);
}

ks_status ks_kv_map_pinned(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t id) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq && layer >= 0 && layer < kv->p.n_layer && head >= 0 && head < kv->nh);
    KS_ASSERT(!kv->parked[seq]);
    kv_layer *L = &kv->layers[layer];
    KS_ASSERT(id >= 0 && id < kv->n_phys && L->pins[id] > 0);
    if (L->tier != KS_TIER_FAST) return KS_FAIL(KS_ERR_UNSUPPORTED, "layer %d is in the slow tier: pages are copied", layer);
    size_t hi = kv_hidx(kv, seq, layer, head);
    int32_t n = kv->n_ent[hi];
    KS_ASSERT(n % kv->P == 0);
    if (n + kv->P > kv->p.n_ctx) return KS_FAIL(KS_ERR_CONTEXT_FULL, "KV head holds %d entries already", n);
    int32_t tabled = L->refs[id] - L->pins[id];
    if (tabled >= 1) L->dup_pages++;
    else L->pin_tabled++;
    L->refs[id]++;
    kv_table_of(kv, seq, layer, head)[n / kv->P] = id;
    kv->n_ent[hi] = n + kv->P;
    return KS_OK;
}

ks_status ks_kv_read_pinned(ks_kv_store *kv, int32_t layer, int32_t id, uint8_t *buf) {
    kv_layer *L = &kv->layers[layer];
    KS_ASSERT(id >= 0 && id < kv->n_phys && L->pins[id] > 0);
    return ks_kv_page_read(kv, L, id, buf);
}

int32_t ks_kv_pinned_pos0(const ks_kv_store *kv, int32_t layer, int32_t id) {
    return kv->layers[layer].pos[(size_t)id * kv->P];
}

void ks_kv_share_info_get(const ks_kv_store *kv, ks_kv_share_info *out) {
    *out = (ks_kv_share_info){0};
    for (int32_t l = 0; l < kv->p.n_layer; l++) {
        out->dup_pages += kv->layers[l].dup_pages;
        out->pinned_pages += kv->layers[l].n_pinned;
        out->pinned_tabled_pages += kv->layers[l].pin_tabled;
    }
}

void ks_kv_set_pin_holder(ks_kv_store *kv, ks_kv_pin_release_fn fn, void *arg) {
    kv->pin_release = fn;
    kv->pin_release_arg = arg;
}

int32_t ks_kv_page_refs(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp) {
    const kv_layer *L = &kv->layers[layer];
    int32_t id = kv_table_of(kv, seq, layer, head)[lp];
    return L->refs[id] - L->pins[id];
}

size_t ks_kv_bounds8_bytes(int32_t hd) { return (sizeof(float) + 2 * (size_t)hd + 3) / 4 * 4; }

/* The 8-bit bounds of kv_meta.h: s = m / 126 for m = max |kmin|, |kmax|
 * (126, not 127: 127 s rounded may fall short of m), lo = floor(kmin / s)
 * and hi = ceil(kmax / s), each stepped outward once more where the float
 * product still lands inside (1 / s and the products round).  |kmin / s| <= 126 up
 * to rounding, so lo - 1 >= -128 and hi + 1 <= 127 fit.  A non-finite key
 * gives the widest finite bounds, so the page is never ranked below a
 * finite one by accident. */
void ks_kv_bounds8_encode(const float *kmin, const float *kmax, int32_t hd, uint8_t *out) {
    float m = 0.0f;
    bool finite = true;
    for (int32_t i = 0; i < hd; i++) {
        float a = fabsf(kmin[i]), b = fabsf(kmax[i]);
        finite = finite && isfinite(a) && isfinite(b);
        m = a > m ? a : m;
        m = b > m ? b : m;
    }
    int8_t *lo = (int8_t *)(out + sizeof(float)), *hi = lo + hd;
    float s = m / 126.0f;
    if (!finite || !isfinite(s)) {
        s = FLT_MAX / 128.0f;
        memset(lo, -127, (size_t)hd);
        memset(hi, 127, (size_t)hd);
    } else if (s < FLT_MIN) { /* every key zero, or so small that s (and 1 / s) leave the normal range: */
        s = m;                  /* +-1 step of m, which covers them */
        memset(lo, m > 0.0f ? -1 : 0, (size_t)hd);
        memset(hi, m > 0.0f ? 1 : 0, (size_t)hd);
    } else {
        float inv = 1.0f / s; /* a product off by an ulp moves floor / ceil by at most one: the steps below */
        for (int32_t i = 0; i < hd; i++) {
            int l = (int)floorf(kmin[i] * inv), h = (int)ceilf(kmax[i] * inv);
            if ((float)l * s > kmin[i]) l--;
            if ((float)h * s < kmax[i]) h++;
            KS_ASSERT(l >= -128 && h <= 127);
            lo[i] = (int8_t)l;
            hi[i] = (int8_t)h;
        }
    }
    memcpy(out, &s, sizeof s);
}

void ks_kv_meta_compact_bounds(ks_kv_store *kv, kv_layer *L, int32_t id) {
    const float *mn = L->kmin + (size_t)id * kv->hd, *mx = L->kmax + (size_t)id * kv->hd;
    ks_kv_bounds8_encode(mn, mx, kv->hd, L->kbound8 + (size_t)id * ks_kv_bounds8_bytes(kv->hd));
    if (!L->kbound16) return;
    uint16_t *b = L->kbound16 + (size_t)id * 2 * kv->hd;
    for (int i = 0; i < kv->hd; i++) {
        b[i] = ks_f32_to_f16(mn[i]);
        b[kv->hd + i] = ks_f32_to_f16(mx[i]);
    }
}

/* Fold one stored key into the page summaries (slot = its index in the page). */
static void meta_add(ks_kv_store *kv, kv_layer *L, int32_t id, int32_t slot, int32_t pos, const float *key) {
    float *mn = L->kmin + (size_t)id * kv->hd, *mx = L->kmax + (size_t)id * kv->hd, *sm = L->ksum + (size_t)id * kv->hd;
    uint16_t *b16 = L->kbound16 ? L->kbound16 + (size_t)id * 2 * kv->hd : NULL; /* exact: the keys are f16 values */
    if (slot == 0) {
        memcpy(mn, key, sizeof(float) * kv->hd);
        memcpy(mx, key, sizeof(float) * kv->hd);
        memcpy(sm, key, sizeof(float) * kv->hd);
        ks_kv_meta_compact_bounds(kv, L, id);
    } else {
        bool widened = false;
        for (int i = 0; i < kv->hd; i++) {
            if (key[i] < mn[i]) {
                mn[i] = key[i];
                widened = true;
                if (b16) b16[i] = ks_f32_to_f16(key[i]);
            }
            if (key[i] > mx[i]) {
                mx[i] = key[i];
                widened = true;
                if (b16) b16[kv->hd + i] = ks_f32_to_f16(key[i]);
            }
            sm[i] += key[i];
        }
        if (widened) /* the scale may have grown: the whole page's 8-bit bounds again */
            ks_kv_bounds8_encode(mn, mx, kv->hd, L->kbound8 + (size_t)id * ks_kv_bounds8_bytes(kv->hd));
    }
    L->pos[(size_t)id * kv->P + slot] = pos;
    L->fill[id] = slot + 1;
}

/* ----------------------------------------------------------- append -- */
ks_status ks_kv_append(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t pos, const float *k,
                       const float *v) {
    /* stack scratch: appends to different layers may run in parallel */
    uint8_t krow[KS_KV_MAX_HEAD_DIM * 2], vrow[KS_KV_MAX_HEAD_DIM * 2];
    ks_quantize_row(ks_kv_dtype(kv->p.type), k, krow, kv->hd);
    if (kv->p.k_only) return ks_kv_append_stored(kv, seq, layer, head, pos, krow, krow); /* v unused */
    ks_quantize_row(ks_kv_dtype(kv->p.type), v, vrow, kv->hd);
    return ks_kv_append_stored(kv, seq, layer, head, pos, krow, vrow);
}

ks_status ks_kv_append_stored(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t pos,
                              const uint8_t *krow, const uint8_t *vrow) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq && layer >= 0 && layer < kv->p.n_layer && head >= 0 && head < kv->nh);
    KS_ASSERT(!kv->parked[seq]); /* the context refuses steps of a parked sequence */
    kv_layer *L = &kv->layers[layer];
    size_t hi = kv_hidx(kv, seq, layer, head);
    int32_t n = kv->n_ent[hi];
    if (n >= kv->p.n_ctx) return KS_FAIL(KS_ERR_CONTEXT_FULL, "KV head holds %d entries already", n);
    int32_t lp = n / kv->P, slot = n % kv->P;
    int32_t *tab = kv_table_of(kv, seq, layer, head);
    if (slot == 0) {
        int32_t id = ks_kv_page_alloc(kv, L, seq, head, lp);
        if (id < 0) return KS_FAIL(KS_ERR_NOMEM, "layer %d KV page pool exhausted (%d pages)", layer, kv->n_phys);
        tab[lp] = id;
    }
    else if (L->refs[tab[lp]] > 1) /* a shared page is full and never appended to; a truncated one is copied first */
        KS_TRY(ks_kv_page_private(kv, seq, layer, head, lp));
    int32_t id = tab[lp];
    float key[KS_KV_MAX_HEAD_DIM];
    if (L->tier == KS_TIER_SLOW) {
        /* an in-flight load of this page must land before the newer row */
        KS_TRY(ks_copy_wait(&L->ev, &kv->wait_seconds));
        if (L->fd >= 0) {
            off_t base = (off_t)id * (off_t)kv->page_bytes;
            KS_TRY(ks_kv_file_write(L->fd, krow, kv->row, base + (off_t)kv_row_off(kv, slot, false)));
            if (!kv->p.k_only)
                KS_TRY(ks_kv_file_write(L->fd, vrow, kv->row, base + (off_t)kv_row_off(kv, slot, true)));
        }
        atomic_fetch_add(&kv->bytes_stored, kv_n_halves(kv) * kv->row);
        int32_t bs = L->slot_of[(size_t)id * kv->P + slot];
        if (bs >= 0) {
            memcpy(kv_slot_k(kv, L, bs), krow, kv->row);
            if (!kv->p.k_only) memcpy(kv_slot_v(kv, L, bs), vrow, kv->row);
        }
        uint8_t *m = kv_slow_mem(kv, L, id);
        if (m) {
            memcpy(m + kv_row_off(kv, slot, false), krow, kv->row);
            if (!kv->p.k_only) memcpy(m + kv_row_off(kv, slot, true), vrow, kv->row);
        }
    } else {
        memcpy(kv_fast_k(kv, L, id) + (size_t)slot * kv->row, krow, kv->row);
        if (!kv->p.k_only) memcpy(kv_fast_v(kv, L, id) + (size_t)slot * kv->row, vrow, kv->row);
    }
    ks_dequantize_row(ks_kv_dtype(kv->p.type), krow, key, kv->hd);
    meta_add(kv, L, id, slot, pos, key);
    kv->n_ent[hi] = n + 1;
    return KS_OK;
}

ks_status ks_kv_append_page_stored(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t pos0,
                                   const uint8_t *page, int32_t m) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq && layer >= 0 && layer < kv->p.n_layer && head >= 0 && head < kv->nh);
    KS_ASSERT(!kv->parked[seq] && m >= 1 && m <= kv->P);
    kv_layer *L = &kv->layers[layer];
    size_t hi = kv_hidx(kv, seq, layer, head);
    int32_t n = kv->n_ent[hi];
    KS_ASSERT(n % kv->P == 0);
    if (L->tier != KS_TIER_FAST) { /* the slow tier's write-through: row by row */
        for (int32_t r = 0; r < m; r++)
            KS_TRY(ks_kv_append_stored(kv, seq, layer, head, pos0 + r, page + kv_row_off(kv, r, false),
                                       page + kv_row_off(kv, r, true)));
        return KS_OK;
    }
    if (n + m > kv->p.n_ctx) return KS_FAIL(KS_ERR_CONTEXT_FULL, "KV head holds %d entries already", n);
    int32_t lp = n / kv->P, id = ks_kv_page_alloc(kv, L, seq, head, lp);
    if (id < 0) return KS_FAIL(KS_ERR_NOMEM, "layer %d KV page pool exhausted (%d pages)", layer, kv->n_phys);
    kv_table_of(kv, seq, layer, head)[lp] = id;
    memcpy(kv_fast_k(kv, L, id), page, (size_t)m * kv->row);
    if (!kv->p.k_only) memcpy(kv_fast_v(kv, L, id), page + kv_row_off(kv, 0, true), (size_t)m * kv->row);
    /* the summaries as m appends leave them: min / max are exact in any
     * order, the sum is taken in row order, and the compact bounds of the
     * final min / max are what the last widening encoded */
    int32_t hd = kv->hd;
    float *mn = L->kmin + (size_t)id * hd, *mx = L->kmax + (size_t)id * hd, *sm = L->ksum + (size_t)id * hd;
    float key[KS_KV_MAX_HEAD_DIM];
    for (int32_t r = 0; r < m; r++) {
        ks_dequantize_row(ks_kv_dtype(kv->p.type), page + kv_row_off(kv, r, false), key, hd);
        if (r == 0) {
            memcpy(mn, key, sizeof(float) * hd);
            memcpy(mx, key, sizeof(float) * hd);
            memcpy(sm, key, sizeof(float) * hd);
        } else {
            for (int32_t i = 0; i < hd; i++) {
                mn[i] = key[i] < mn[i] ? key[i] : mn[i];
                mx[i] = key[i] > mx[i] ? key[i] : mx[i];
                sm[i] += key[i];
            }
        }
        L->pos[(size_t)id * kv->P + r] = pos0 + r;
    }
    ks_kv_meta_compact_bounds(kv, L, id);
    L->fill[id] = m;
    kv->n_ent[hi] = n + m;
    return KS_OK;
}

void ks_kv_head_clear(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head) {
    kv_layer *L = &kv->layers[layer];
    size_t hi = kv_hidx(kv, seq, layer, head);
    int32_t np = (kv->n_ent[hi] + kv->P - 1) / kv->P;
    int32_t *tab = kv_table_of(kv, seq, layer, head);
    for (int32_t i = 0; i < np; i++) page_unref(kv, L, tab[i]);
    kv->n_ent[hi] = 0;
}

void ks_kv_seq_clear(ks_kv_store *kv, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq);
    ks_kv_parked_free(kv->parked[seq]); /* a parked sequence's copy goes too */
    kv->parked[seq] = NULL;
    for (int32_t l = 0; l < kv->p.n_layer; l++) {
        (void)ks_copy_wait(&kv->layers[l].ev, NULL); /* no load may land in a recycled slot */
        for (int32_t h = 0; h < kv->nh; h++) ks_kv_head_clear(kv, seq, l, h);
    }
}

ks_status ks_kv_compact(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, const uint8_t *keep) {
    kv_layer *L = &kv->layers[layer];
    KS_TRY(ks_copy_wait(&L->ev, &kv->wait_seconds));
    size_t hi = kv_hidx(kv, seq, layer, head);
    int32_t n = kv->n_ent[hi], P = kv->P;
    int32_t *tab = kv_table_of(kv, seq, layer, head);
    /* Entries before the first dropped one stay where they are: their pages
     * are neither read nor written (they may be shared).  The pages the
     * compaction rewrites become this head's own first (copy on write). */
    int32_t d = 0, kept = 0;
    while (d < n && keep[d]) d++;
    if (d == n) return KS_OK;
    for (int32_t r = 0; r < n; r++) kept += keep[r] != 0;
    int32_t first_lp = d / P, np_old = (n + P - 1) / P, np_new = (kept + P - 1) / P;
    for (int32_t lp = first_lp; lp < np_new; lp++) KS_TRY(ks_kv_page_private(kv, seq, layer, head, lp));
    uint8_t *src = kv->page_tmp, *dst = kv->page_tmp + kv->page_bytes;
    int32_t w = first_lp * P, src_lp = -1, dst_lp = -1;
    float *key = kv->tmp;
    /* Survivors move forward in order (w <= r), so pages are rewritten in
     * place: read a source page once, fill a destination page, write it back
     * when full or done.  Positions travel with their rows. */
    ks_status st = KS_OK;
    int32_t *pos_keep = ks_malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!pos_keep) return KS_FAIL(KS_ERR_NOMEM, "compacting %d entries", n); /* nothing moved yet */
    for (int32_t r = first_lp * P; r < n; r++) {
        if (!keep[r]) continue;
        int32_t rlp = r / P, rs = r % P;
        if (rlp != src_lp) {
            if ((st = ks_kv_page_read(kv, L, tab[rlp], src)) != KS_OK) goto done;
            src_lp = rlp;
        }
        int32_t wlp = w / P, ws = w % P;
        if (wlp != dst_lp) {
            if (dst_lp >= 0 && (st = ks_kv_page_write(kv, L, tab[dst_lp], dst)) != KS_OK) goto done;
            if (wlp == src_lp) memcpy(dst, src, kv->page_bytes);
            else if ((st = ks_kv_page_read(kv, L, tab[wlp], dst)) != KS_OK) goto done;
            dst_lp = wlp;
        }
        pos_keep[w] = L->pos[(size_t)tab[rlp] * P + rs];
        memcpy(dst + kv_row_off(kv, ws, false), src + kv_row_off(kv, rs, false), kv->row);
        if (!kv->p.k_only) memcpy(dst + kv_row_off(kv, ws, true), src + kv_row_off(kv, rs, true), kv->row);
        w++;
    }
    KS_ASSERT(w == kept);
    if (dst_lp >= 0 && (st = ks_kv_page_write(kv, L, tab[dst_lp], dst)) != KS_OK) goto done;
    /* rebuild summaries of the rewritten pages, free the rest */
    for (int32_t lp = first_lp; lp < np_new; lp++) {
        int32_t id = tab[lp];
        if ((st = ks_kv_page_read(kv, L, id, src)) != KS_OK) goto done;
        int32_t fill = w - lp * P < P ? w - lp * P : P;
        for (int32_t s = 0; s < fill; s++) {
            ks_dequantize_row(ks_kv_dtype(kv->p.type), src + kv_row_off(kv, s, false), key, kv->hd);
            meta_add(kv, L, id, s, pos_keep[lp * P + s], key);
        }
    }
    for (int32_t lp = np_new; lp < np_old; lp++) page_unref(kv, L, tab[lp]);
    kv->n_ent[hi] = w;
done:
    ks_free(pos_keep);
    return st;
}

ks_status ks_kv_drop_front(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t n_pages) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq && layer >= 0 && layer < kv->p.n_layer && head >= 0 && head < kv->nh);
    size_t hi = kv_hidx(kv, seq, layer, head);
    int32_t n = kv->n_ent[hi], P = kv->P, np = (n + P - 1) / P;
    KS_ASSERT(n_pages >= 0 && (int64_t)n_pages * P <= n);
    if (n_pages == 0) return KS_OK;
    kv_layer *L = &kv->layers[layer];
    KS_TRY(ks_copy_wait(&L->ev, &kv->wait_seconds)); /* no load may land in a page that leaves */
    int32_t *tab = kv_table_of(kv, seq, layer, head);
    /* whole pages leave the table; the rest shift down with their rows,
     * positions and summaries untouched (metadata follows the physical id) */
    for (int32_t lp = 0; lp < n_pages; lp++) page_unref(kv, L, tab[lp]);
    memmove(tab, tab + n_pages, sizeof(int32_t) * (size_t)(np - n_pages));
    kv->n_ent[hi] = n - n_pages * P;
    return KS_OK;
}

int32_t ks_kv_layer_pages_in_use(const ks_kv_store *kv, int32_t layer) {
    KS_ASSERT(layer >= 0 && layer < kv->p.n_layer);
    const kv_layer *L = &kv->layers[layer];
    int32_t used = 0;
    for (int32_t i = 0; i < kv->n_phys; i++) used += L->in_use[i] != 0;
    return used;
}

/* ---------------------------------------------------------- metadata -- */
void ks_kv_page_meta_get(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp,
                         ks_kv_page_meta *out) {
    KS_ASSERT(lp >= 0 && lp < ks_kv_n_pages(kv, seq, layer, head));
    const kv_layer *L = &kv->layers[layer];
    int32_t id = kv_table_of(kv, seq, layer, head)[lp];
    out->fill = L->fill[id];
    out->pos = L->pos + (size_t)id * kv->P;
    out->kmin = L->kmin + (size_t)id * kv->hd;
    out->kmax = L->kmax + (size_t)id * kv->hd;
    out->ksum = L->ksum + (size_t)id * kv->hd;
    out->kbound16 = L->kbound16 ? L->kbound16 + (size_t)id * 2 * kv->hd : NULL;
    out->kbound8 = L->kbound8 + (size_t)id * ks_kv_bounds8_bytes(kv->hd);
}

void ks_kv_pages_bounds8(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t np,
                         const uint8_t **out) {
    KS_ASSERT(np >= 0 && np <= ks_kv_n_pages(kv, seq, layer, head));
    const kv_layer *L = &kv->layers[layer];
    const int32_t *tab = kv_table_of(kv, seq, layer, head);
    size_t stride = ks_kv_bounds8_bytes(kv->hd);
    for (int32_t lp = 0; lp < np; lp++) out[lp] = L->kbound8 + (size_t)tab[lp] * stride;
}

bool ks_kv_pages_bounds16(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t np,
                          const uint16_t **out) {
    KS_ASSERT(np >= 0 && np <= ks_kv_n_pages(kv, seq, layer, head));
    const kv_layer *L = &kv->layers[layer];
    if (!L->kbound16) return false;
    const int32_t *tab = kv_table_of(kv, seq, layer, head);
    for (int32_t lp = 0; lp < np; lp++) out[lp] = L->kbound16 + (size_t)tab[lp] * 2 * kv->hd;
    return true;
}

