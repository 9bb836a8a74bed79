/*
 * kv_tier.c — where a page's bytes live, and how they move between tiers.
 *
 * A FAST layer keeps every page in memory, K halves and V halves in two
 * regions (kv_internal.h).  A SLOW layer keeps each page contiguous, K then
 * V, in host memory or in a file, and attention reads a fixed elastic
 * buffer of entry slots per (sequence, layer, KV head) that ks_kv_fetch
 * fills: entries already buffered stay, the others take the slots of
 * entries the request does not need (least recently used first), and only
 * they are copied, row runs merged (synchronously, or queued on the copy
 * engine with one completion event per layer).  A slot whose load may have
 * failed is dropped rather than read.
 *
 * Slow-tier files are created in the offload directory, unlinked at once (no
 * leftovers after a crash) and reserved up front (ks_platform_reserve_file), so a
 * full disk is reported when a layer is offloaded, not in the middle of a
 * step.  All file I/O is pread/pwrite at page-aligned offsets.
 */
#define _GNU_SOURCE
#include "kv/kv_internal.h"

#include "core/file.h"
#include "core/platform.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------- page storage -- */
ks_status ks_kv_file_write(int fd, const void *src, size_t n, off_t off) {
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

ks_status ks_kv_page_read(const ks_kv_store *kv, const kv_layer *L, int32_t id, uint8_t *buf) {
    if (L->tier == KS_TIER_FAST) {
        memcpy(buf, kv_fast_k(kv, L, id), kv_half_bytes(kv));
        if (!kv->p.k_only) memcpy(buf + kv_half_bytes(kv), kv_fast_v(kv, L, id), kv_half_bytes(kv));
        return KS_OK;
    }
    if (L->fail_reads) return KS_FAIL(KS_ERR_IO, "slow-tier read failed (injected)");
    const uint8_t *m = kv_slow_mem(kv, L, id);
    if (m) {
        memcpy(buf, m, kv->page_bytes);
        return KS_OK;
    }
    return file_read(L->fd, buf, kv->page_bytes, (off_t)id * (off_t)kv->page_bytes);
}

ks_status ks_kv_page_write(ks_kv_store *kv, kv_layer *L, int32_t id, const uint8_t *buf) {
    if (L->tier == KS_TIER_FAST) {
        memcpy(kv_fast_k(kv, L, id), buf, kv_half_bytes(kv));
        if (!kv->p.k_only) memcpy(kv_fast_v(kv, L, id), buf + kv_half_bytes(kv), kv_half_bytes(kv));
        return KS_OK;
    }
    uint8_t *m = kv_slow_mem(kv, L, id);
    if (m) memcpy(m, buf, kv->page_bytes);
    else KS_TRY(ks_kv_file_write(L->fd, buf, kv->page_bytes, (off_t)id * (off_t)kv->page_bytes));
    atomic_fetch_add(&kv->bytes_stored, kv->page_bytes);
    for (int32_t r = 0; r < kv->P; r++) { /* buffered rows of the page follow its new contents */
        int32_t s = L->slot_of[(size_t)id * kv->P + r];
        if (s < 0) continue;
        memcpy(kv_slot_k(kv, L, s), buf + (size_t)r * kv->row, kv->row);
        if (!kv->p.k_only) memcpy(kv_slot_v(kv, L, s), buf + kv_half_bytes(kv) + (size_t)r * kv->row, kv->row);
    }
    return KS_OK;
}

void ks_kv_release_slow(kv_layer *L) {
    free(L->slow);
    free(L->slots);
    if (L->fd >= 0) close(L->fd);
    ks_free(L->slot_ent);
    ks_free(L->slot_stamp);
    ks_free(L->slot_victim);
    L->slot_victim = NULL;
    ks_free(L->stamp);
    L->slow = L->slots = NULL;
    L->slot_ent = NULL;
    L->slot_stamp = L->stamp = NULL;
    L->fd = -1;
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
    int e = ks_platform_reserve_file(fd, bytes);
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
        /* an elastic-buffer slot maps a physical entry for one sequence:
         * pages several sequences share get a copy each but one's first */
        for (int32_t seq = 0; seq < kv->p.n_seq; seq++)
            for (int32_t h = 0; h < kv->nh; h++)
                for (int32_t lp = 0; lp < ks_kv_n_pages(kv, seq, layer, h); lp++) {
                    int32_t id = kv_table_of(kv, seq, layer, h)[lp];
                    if (L->refs[id] - L->pins[id] > 1) KS_TRY(ks_kv_page_private(kv, seq, layer, h, lp));
                }
        int fd = -1;
        uint8_t *slow = NULL;
        if (kv->p.offload_dir) KS_TRY(open_slow_file(kv, layer, &fd));
        else if (!(slow = ks_alloc_streamed(total))) return KS_FAIL(KS_ERR_NOMEM, "slow tier of %zu bytes refused", total);
        uint8_t *slots = ks_alloc_streamed((size_t)kv->n_sh * kv->n_slot * kv_n_halves(kv) * kv->row);
        int32_t *slot_ent = ks_malloc(sizeof(int32_t) * (size_t)kv->n_sh * kv->n_slot);
        uint32_t *slot_stamp = ks_calloc((size_t)kv->n_sh * kv->n_slot, sizeof(uint32_t));
        int32_t *slot_victim = ks_malloc(sizeof(int32_t) * (size_t)kv->n_sh * kv->n_slot);
        uint32_t *stamp = ks_calloc((size_t)kv->n_sh, sizeof(uint32_t));
        if (!slots || !slot_ent || !slot_stamp || !slot_victim || !stamp) {
            if (fd >= 0) close(fd);
            free(slow);
            free(slots);
            ks_free(slot_ent);
            ks_free(slot_stamp);
            ks_free(slot_victim);
            ks_free(stamp);
            return KS_FAIL(KS_ERR_NOMEM, "fast-tier slots for layer %d refused", layer);
        }
        /* copy the pages in use; the rest of the file stays reserved */
        for (int32_t id = 0; id < kv->n_phys; id++) {
            if (!L->in_use[id]) continue;
            uint8_t *src = kv->page_tmp;
            memcpy(src, kv_fast_k(kv, L, id), kv_half_bytes(kv));
            if (!kv->p.k_only) memcpy(src + kv_half_bytes(kv), kv_fast_v(kv, L, id), kv_half_bytes(kv));
            if (slow) memcpy(slow + (size_t)id * kv->page_bytes, src, kv->page_bytes);
            else {
                ks_status st = ks_kv_file_write(fd, src, kv->page_bytes, (off_t)id * (off_t)kv->page_bytes);
                if (st != KS_OK) {
                    close(fd);
                    free(slots);
                    ks_free(slot_ent);
                    ks_free(slot_stamp);
                    ks_free(slot_victim);
                    ks_free(stamp);
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
        L->slot_ent = slot_ent;
        L->slot_stamp = slot_stamp;
        L->slot_victim = slot_victim;
        L->stamp = stamp;
        for (size_t i = 0; i < (size_t)kv->n_sh * kv->n_slot; i++) L->slot_ent[i] = -1;
        for (size_t i = 0; i < (size_t)kv->n_phys * kv->P; i++) L->slot_of[i] = -1;
        L->tier = KS_TIER_SLOW;
        return KS_OK;
    }
    uint8_t *fast = ks_alloc_streamed(total);
    if (!fast) return KS_FAIL(KS_ERR_NOMEM, "fast tier of %zu bytes refused for layer %d", total, layer);
    for (int32_t id = 0; id < kv->n_phys; id++) {
        if (!L->in_use[id]) continue;
        ks_status st = ks_kv_page_read(kv, L, id, kv->page_tmp);
        if (st != KS_OK) {
            free(fast);
            return st;
        }
        memcpy(fast + (size_t)id * kv_half_bytes(kv), kv->page_tmp, kv_half_bytes(kv));
        if (!kv->p.k_only)
            memcpy(fast + ((size_t)kv->n_phys + id) * kv_half_bytes(kv), kv->page_tmp + kv_half_bytes(kv), kv_half_bytes(kv));
        atomic_fetch_add(&kv->bytes_loaded, kv->page_bytes);
    }
    ks_kv_release_slow(L);
    L->fast = fast;
    for (size_t i = 0; i < (size_t)kv->n_phys * kv->P; i++) L->slot_of[i] = -1;
    L->tier = KS_TIER_FAST;
    return KS_OK;
}

/* LRU order, then slot order: free slots side by side take consecutive misses, whose loads then merge */
static int cmp_victim(const void *a, const void *b, void *arg) {
    const uint32_t *st = arg;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    uint32_t x = st[i], y = st[j];
    return x != y ? (x > y) - (x < y) : (i > j) - (i < j);
}

/* Unmap global slot g (its entry is no longer buffered). */
static void slot_drop(kv_layer *L, int32_t g) {
    if (L->slot_ent[g] >= 0) L->slot_of[L->slot_ent[g]] = -1;
    L->slot_ent[g] = -1;
}

ks_status ks_kv_fetch(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, const int32_t *ent, int32_t n,
                      bool async) {
    kv_layer *L = &kv->layers[layer];
    if (L->tier == KS_TIER_FAST || n <= 0) return KS_OK;
    if (n > kv->n_slot)
        return KS_FAIL(KS_ERR_NOMEM, "a selection of %d entries exceeds the %d-entry buffer of a KV head", n, kv->n_slot);
    /* a synchronous fetch reads what it maps right away: earlier loads of the
     * layer (prefetches into slots this call may reuse) must have landed */
    if (!async && atomic_load(&L->ev.pending) > 0) KS_TRY(ks_copy_wait(&L->ev, &kv->wait_seconds));
    int32_t P = kv->P, sh = seq * kv->nh + head, ne = ks_kv_n_entries(kv, seq, layer, head);
    const int32_t *tab = kv_table_of(kv, seq, layer, head);
    int32_t base = sh * kv->n_slot;
    uint32_t *ss = L->slot_stamp + (size_t)base;
    uint32_t cur = ++L->stamp[sh];
    if (cur == 0) { /* wrapped: restart the clock */
        memset(ss, 0, sizeof(uint32_t) * kv->n_slot);
        cur = L->stamp[sh] = 1;
    }
    /* S_now ∩ S_last stays where it is */
    int32_t n_miss = 0;
    for (int32_t i = 0; i < n; i++) {
        KS_ASSERT(ent[i] >= 0 && ent[i] < ne && (i == 0 || ent[i] > ent[i - 1]));
        int32_t g = L->slot_of[(size_t)tab[ent[i] / P] * P + ent[i] % P];
        if (g >= 0) ss[g - base] = cur;
        else n_miss++;
    }
    atomic_fetch_add(&kv->entries_hit, (uint64_t)(n - n_miss));
    if (n_miss == 0) {
        /* hits may still be loading (prefetched): a synchronous caller reads now */
        if (!async && atomic_load(&L->ev.pending) > 0) KS_TRY(ks_copy_wait(&L->ev, &kv->wait_seconds));
        return KS_OK;
    }
    /* S_now - S_last goes into the slots of S_last - S_now (then of the least recently used) */
    int32_t *vic = L->slot_victim + (size_t)base, n_vic = 0;
    for (int32_t s = 0; s < kv->n_slot; s++)
        if (ss[s] != cur) vic[n_vic++] = s;
    qsort_r(vic, (size_t)n_vic, sizeof(int32_t), cmp_victim, ss);
    KS_ASSERT(n_vic >= n_miss);
    ks_status st = KS_OK;
    int32_t next = 0;
    for (int32_t i = 0; i < n && st == KS_OK;) {
        int32_t lp = ent[i] / P, r = ent[i] % P, id = tab[lp];
        if (L->slot_of[(size_t)id * P + r] >= 0) {
            i++;
            continue;
        }
        /* a run of misses: consecutive rows of one page into consecutive slots is one transfer */
        int32_t s0 = vic[next], len = 0;
        while (i + len < n && ent[i + len] == ent[i] + len && (ent[i] + len) / P == lp && next + len < n_vic &&
               vic[next + len] == s0 + len && L->slot_of[(size_t)id * P + r + len] < 0)
            len++;
        for (int32_t k = 0; k < len; k++) {
            int32_t g = base + s0 + k;
            slot_drop(L, g);
            L->slot_ent[g] = id * P + r + k;
            L->slot_of[(size_t)id * P + r + k] = g;
            ss[s0 + k] = cur;
        }
        size_t off = (size_t)id * kv->page_bytes + (size_t)r * kv->row;
        ks_copy_job job = {.src = L->slow ? L->slow + off : NULL,
                           .fd = L->fd,
                           .offset = (off_t)off,
                           .dst = kv_slot_k(kv, L, base + s0),
                           .dst2 = kv->p.k_only ? NULL : kv_slot_v(kv, L, base + s0),
                           .bytes = kv_n_halves(kv) * (size_t)len * kv->row,
                           .src2_off = kv->p.k_only ? 0 : kv_half_bytes(kv),
                           .fail = L->fail_reads,
                           .ev = &L->ev};
        if (async) ks_copy_submit(kv->copy, &job);
        else {
            ks_copy_run(&job);
            if (atomic_load(&L->ev.failed)) {
                atomic_store(&L->ev.failed, 0);
                for (int32_t k = 0; k < len; k++) slot_drop(L, base + s0 + k);
                st = KS_FAIL(KS_ERR_IO, "%s", L->ev.msg);
                break;
            }
        }
        atomic_fetch_add(&kv->bytes_loaded, job.bytes);
        atomic_fetch_add(&kv->entries_loaded, (uint64_t)len);
        next += len;
        i += len;
    }
    return st;
}

ks_status ks_kv_wait_layer(ks_kv_store *kv, int32_t layer) {
    kv_layer *L = &kv->layers[layer];
    if (L->tier == KS_TIER_FAST) return KS_OK;
    ks_status st = ks_copy_wait(&L->ev, &kv->wait_seconds);
    if (st != KS_OK) /* slots whose load may have failed cannot be trusted: drop them all */
        for (int32_t g = 0; g < kv->n_sh * kv->n_slot; g++) slot_drop(L, g);
    return st;
}

void ks_kv_fast_view_of(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, ks_kv_fast_view *out) {
    const kv_layer *L = &kv->layers[layer];
    KS_ASSERT(L->tier == KS_TIER_FAST);
    *out = (ks_kv_fast_view){.table = kv_table_of(kv, seq, layer, head),
                             .k = kv_fast_k(kv, L, 0),
                             .v = kv_fast_v(kv, L, 0),
                             .half = kv_half_bytes(kv)};
}

void ks_kv_page_rows(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp, const uint8_t **K,
                     const uint8_t **V) {
    const kv_layer *L = &kv->layers[layer];
    KS_ASSERT(L->tier == KS_TIER_FAST); /* a slow layer's rows are read one by one (ks_kv_entry_rows) */
    int32_t id = kv_table_of(kv, seq, layer, head)[lp];
    *K = kv_fast_k(kv, L, id);
    *V = kv_fast_v(kv, L, id);
}

void ks_kv_entry_rows(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t e, const uint8_t **K,
                      const uint8_t **V) {
    const kv_layer *L = &kv->layers[layer];
    int32_t id = kv_table_of(kv, seq, layer, head)[e / kv->P], r = e % kv->P;
    if (L->tier == KS_TIER_FAST) {
        *K = kv_fast_k(kv, L, id) + (size_t)r * kv->row;
        *V = kv_fast_v(kv, L, id) + (size_t)r * kv->row;
        return;
    }
    int32_t g = L->slot_of[(size_t)id * kv->P + r];
    KS_ASSERT(g >= 0); /* the entry was fetched this step */
    *K = kv_slot_k(kv, L, g);
    *V = kv_slot_v(kv, L, g);
}

void ks_kv_note_sync_fallback(ks_kv_store *kv) { atomic_fetch_add(&kv->sync_fallbacks, 1); }

void ks_kv_take_traffic(ks_kv_store *kv, ks_kv_traffic *out) {
    out->bytes_loaded = atomic_exchange(&kv->bytes_loaded, 0);
    out->bytes_stored = atomic_exchange(&kv->bytes_stored, 0);
    out->pages_loaded = atomic_exchange(&kv->pages_loaded, 0);
    out->pages_hit = atomic_exchange(&kv->pages_hit, 0);
    out->entries_loaded = atomic_exchange(&kv->entries_loaded, 0);
    out->entries_hit = atomic_exchange(&kv->entries_hit, 0);
    out->sync_fallbacks = atomic_exchange(&kv->sync_fallbacks, 0);
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
            f += (uint64_t)kv->n_sh * kv->n_slot * 2 * kv->row;
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
    if (!keep) return KS_FAIL(KS_ERR_NOMEM, "truncating %d entries", n);
    for (int32_t i = 0; i < n; i++) keep[i] = i < n_keep;
    ks_status st = ks_kv_compact(kv, seq, layer, head, keep);
    ks_free(keep);
    return st;
}

ks_status ks_kv_read_page(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp, uint8_t *buf) {
    KS_ASSERT(lp >= 0 && lp < ks_kv_n_pages(kv, seq, layer, head));
    kv_layer *L = &kv->layers[layer];
    int32_t id = kv_table_of(kv, seq, layer, head)[lp];
    KS_TRY(ks_kv_page_read(kv, L, id, buf));
    if (L->tier == KS_TIER_SLOW) { /* a gathered page is a load that no slot will keep */
        atomic_fetch_add(&kv->bytes_loaded, kv->page_bytes);
        atomic_fetch_add(&kv->pages_loaded, 1);
    }
    return KS_OK;
}

ks_status ks_kv_read_keys(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t first, int32_t n,
                          uint8_t *dst) {
    KS_ASSERT(first >= 0 && n >= 0 && first + n <= ks_kv_n_entries(kv, seq, layer, head));
    const kv_layer *L = &kv->layers[layer];
    const int32_t *tab = kv_table_of(kv, seq, layer, head);
    for (int32_t e = first; e < first + n;) { /* a run of rows inside one page at a time */
        int32_t r = e % kv->P, run = kv->P - r < first + n - e ? kv->P - r : first + n - e, id = tab[e / kv->P];
        uint8_t *d = dst + (size_t)(e - first) * kv->row;
        size_t bytes = (size_t)run * kv->row;
        if (L->tier == KS_TIER_FAST) {
            memcpy(d, kv_fast_k(kv, L, id) + (size_t)r * kv->row, bytes);
        } else { /* the slow tier is the source of truth (appends write it first): no slot to wait for */
            if (L->fail_reads) return KS_FAIL(KS_ERR_IO, "slow-tier read failed (injected)");
            const uint8_t *m = kv_slow_mem(kv, L, id);
            if (m) memcpy(d, m + kv_row_off(kv, r, false), bytes);
            else KS_TRY(file_read(L->fd, d, bytes, (off_t)id * (off_t)kv->page_bytes + (off_t)kv_row_off(kv, r, false)));
            atomic_fetch_add(&kv->bytes_loaded, bytes);
        }
        e += run;
    }
    return KS_OK;
}

int32_t ks_kv_buffer_entries(const ks_kv_store *kv) { return kv->n_slot; }

/* -------------------------------------------------- parked sequences -- */
/* A sequence is parked whole: its pages leave the layer pools (so the fast
 * tier no longer holds them, and no slot maps them), and come back byte for
 * byte with their metadata, so attention after unparking reads exactly what
 * it would have read without the detour: nothing is re-quantized or
 * recomputed.  Physical ids may differ afterwards (home ids are preferred);
 * attention addresses entries through the page tables, so that is invisible. */
void ks_kv_parked_free(kv_parked *pk) {
    if (!pk) return;
    free(pk->data);
    if (pk->fd >= 0) close(pk->fd);
    ks_free(pk->n_ent);
    ks_free(pk->fill);
    ks_free(pk->pos);
    ks_free(pk->kmin);
    ks_free(pk->kmax);
    ks_free(pk->ksum);
    ks_free(pk);
}

bool ks_kv_seq_parked(const ks_kv_store *kv, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq);
    return kv->parked[seq] != NULL;
}

int64_t ks_kv_seq_parked_entries(const ks_kv_store *kv, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq);
    return kv->parked[seq] ? kv->parked[seq]->n_entries : 0;
}

static ks_status park_file(const ks_kv_store *kv, int32_t seq, off_t bytes, int *fd_out) {
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/kvsieve-%d-%p-seq%d.kv", kv->p.offload_dir, (int)getpid(), (void *)kv, seq);
    if (n < 0 || (size_t)n >= sizeof path) return KS_FAIL(KS_ERR_INVALID_ARG, "offload directory path is too long");
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return KS_FAIL(KS_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    unlink(path);
    int e = bytes > 0 ? ks_platform_reserve_file(fd, bytes) : 0;
    if (e != 0) {
        close(fd);
        return KS_FAIL(KS_ERR_IO, "cannot reserve %.1f MiB to park sequence %d in %s: %s", bytes / 1048576.0, seq,
                       kv->p.offload_dir, strerror(e));
    }
    *fd_out = fd;
    return KS_OK;
}

ks_status ks_kv_seq_park(ks_kv_store *kv, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq);
    if (kv->parked[seq]) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d is parked already", seq);
    int32_t NL = kv->p.n_layer, nh = kv->nh, P = kv->P, hd = kv->hd;
    int64_t np = 0, ne = 0;
    for (int32_t l = 0; l < NL; l++)
        for (int32_t h = 0; h < nh; h++) {
            ne += ks_kv_n_entries(kv, seq, l, h);
            np += ks_kv_n_pages(kv, seq, l, h);
        }
    kv_parked *pk = ks_calloc(1, sizeof *pk);
    if (!pk) return KS_FAIL(KS_ERR_NOMEM, "parking sequence %d", seq);
    pk->fd = -1;
    pk->n_pages = np;
    pk->n_entries = ne;
    pk->n_ent = ks_malloc(sizeof(int32_t) * (size_t)NL * nh);
    size_t m = np > 0 ? (size_t)np : 1;
    pk->fill = ks_malloc(sizeof(int32_t) * m);
    pk->pos = ks_malloc(sizeof(int32_t) * m * P);
    pk->kmin = ks_malloc(sizeof(float) * m * hd);
    pk->kmax = ks_malloc(sizeof(float) * m * hd);
    pk->ksum = ks_malloc(sizeof(float) * m * hd);
    ks_status st = KS_OK;
    if (!pk->n_ent || !pk->fill || !pk->pos || !pk->kmin || !pk->kmax || !pk->ksum)
        st = KS_FAIL(KS_ERR_NOMEM, "parking sequence %d: page metadata of %lld pages", seq, (long long)np);
    else if (kv->p.offload_dir) st = park_file(kv, seq, (off_t)np * (off_t)kv->page_bytes, &pk->fd);
    else if (!(pk->data = malloc(m * kv->page_bytes)))
        st = KS_FAIL(KS_ERR_NOMEM, "parking sequence %d: %.1f MiB of slow tier refused", seq,
                     (double)np * kv->page_bytes / 1048576.0);
    int64_t k = 0;
    for (int32_t l = 0; l < NL && st == KS_OK; l++) {
        kv_layer *L = &kv->layers[l];
        /* loads in flight may land in this sequence's slots: they must be done */
        if ((st = ks_copy_wait(&L->ev, &kv->wait_seconds)) != KS_OK) break;
        for (int32_t h = 0; h < nh && st == KS_OK; h++) {
            pk->n_ent[l * nh + h] = ks_kv_n_entries(kv, seq, l, h);
            const int32_t *tab = kv_table_of(kv, seq, l, h);
            for (int32_t lp = 0; lp < ks_kv_n_pages(kv, seq, l, h); lp++, k++) {
                int32_t id = tab[lp];
                uint8_t *dst = pk->data ? pk->data + (size_t)k * kv->page_bytes : kv->page_tmp;
                if ((st = ks_kv_page_read(kv, L, id, dst)) != KS_OK) break;
                if (pk->fd >= 0 &&
                    (st = ks_kv_file_write(pk->fd, dst, kv->page_bytes, (off_t)k * (off_t)kv->page_bytes)) != KS_OK)
                    break;
                pk->fill[k] = L->fill[id];
                memcpy(pk->pos + (size_t)k * P, L->pos + (size_t)id * P, sizeof(int32_t) * P);
                memcpy(pk->kmin + (size_t)k * hd, L->kmin + (size_t)id * hd, sizeof(float) * hd);
                memcpy(pk->kmax + (size_t)k * hd, L->kmax + (size_t)id * hd, sizeof(float) * hd);
                memcpy(pk->ksum + (size_t)k * hd, L->ksum + (size_t)id * hd, sizeof(float) * hd);
            }
        }
    }
    if (st != KS_OK) {
        ks_kv_parked_free(pk);
        return st;
    }
    for (int32_t l = 0; l < NL; l++)
        for (int32_t h = 0; h < nh; h++) ks_kv_head_clear(kv, seq, l, h);
    atomic_fetch_add(&kv->bytes_stored, (uint64_t)np * kv->page_bytes);
    kv->parked[seq] = pk;
    return KS_OK;
}

ks_status ks_kv_seq_unpark(ks_kv_store *kv, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < kv->p.n_seq);
    kv_parked *pk = kv->parked[seq];
    if (!pk) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d is not parked", seq);
    int32_t NL = kv->p.n_layer, nh = kv->nh, P = kv->P, hd = kv->hd;
    ks_status st = KS_OK;
    int64_t k = 0;
    for (int32_t l = 0; l < NL && st == KS_OK; l++) {
        kv_layer *L = &kv->layers[l];
        if ((st = ks_copy_wait(&L->ev, &kv->wait_seconds)) != KS_OK) break;
        for (int32_t h = 0; h < nh && st == KS_OK; h++) {
            int32_t n = pk->n_ent[l * nh + h], npg = (n + P - 1) / P;
            int32_t *tab = kv_table_of(kv, seq, l, h);
            size_t hi = kv_hidx(kv, seq, l, h);
            KS_ASSERT(kv->n_ent[hi] == 0);
            for (int32_t lp = 0; lp < npg; lp++, k++) {
                int32_t id = ks_kv_page_alloc(kv, L, seq, h, lp);
                if (id < 0) {
                    st = KS_FAIL(KS_ERR_NOMEM, "layer %d KV page pool exhausted (%d pages) unparking sequence %d", l,
                                 kv->n_phys, seq);
                    break;
                }
                tab[lp] = id;
                /* entries so far, so a failure frees exactly the pages taken */
                kv->n_ent[hi] = (lp + 1) * P < n ? (lp + 1) * P : n;
                const uint8_t *src = pk->data ? pk->data + (size_t)k * kv->page_bytes : kv->page_tmp;
                if (pk->fd >= 0) {
                    if (L->fail_reads) st = KS_FAIL(KS_ERR_IO, "slow-tier read failed (injected)");
                    else st = file_read(pk->fd, kv->page_tmp, kv->page_bytes, (off_t)k * (off_t)kv->page_bytes);
                    if (st != KS_OK) break;
                }
                if ((st = ks_kv_page_write(kv, L, id, src)) != KS_OK) break;
                if (L->tier == KS_TIER_FAST) atomic_fetch_add(&kv->bytes_loaded, kv->page_bytes);
                L->fill[id] = pk->fill[k];
                memcpy(L->pos + (size_t)id * P, pk->pos + (size_t)k * P, sizeof(int32_t) * P);
                memcpy(L->kmin + (size_t)id * hd, pk->kmin + (size_t)k * hd, sizeof(float) * hd);
                memcpy(L->kmax + (size_t)id * hd, pk->kmax + (size_t)k * hd, sizeof(float) * hd);
                memcpy(L->ksum + (size_t)id * hd, pk->ksum + (size_t)k * hd, sizeof(float) * hd);
                ks_kv_meta_compact_bounds(kv, L, id);
            }
        }
    }
    if (st != KS_OK) { /* back to parked: free what was taken */
        for (int32_t l = 0; l < NL; l++)
            for (int32_t h = 0; h < nh; h++) ks_kv_head_clear(kv, seq, l, h);
        return st;
    }
    kv->parked[seq] = NULL;
    ks_kv_parked_free(pk);
    return KS_OK;
}
