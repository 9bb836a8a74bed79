/*
 * kv_tier.c — where a page's bytes live, and how they move between tiers.
 *
 * A FAST layer keeps every page in memory, K halves and V halves in two
 * regions (kv_internal.h).  A SLOW layer keeps each page contiguous, K then
 * V, in host memory or in a file, and attention reads fixed fast *slots* per
 * (sequence, layer, KV head) that ks_kv_fetch maps: hits stay, misses evict
 * the least recently used slot not needed by the same request, and only the
 * misses are copied (synchronously, or queued on the copy engine with one
 * completion event per layer).  A slot whose load may have failed is dropped
 * rather than read.
 *
 * Slow-tier files are created in the offload directory, unlinked at once (no
 * leftovers after a crash) and reserved with posix_fallocate up front, so a
 * full disk is reported when a layer is offloaded, not in the middle of a
 * step.  All file I/O is pread/pwrite at page-aligned offsets.
 */
#define _GNU_SOURCE
#include "kv/kv_internal.h"

#include "core/file.h"

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
        memcpy(buf + kv_half_bytes(kv), kv_fast_v(kv, L, id), kv_half_bytes(kv));
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
        memcpy(kv_fast_v(kv, L, id), buf + kv_half_bytes(kv), kv_half_bytes(kv));
        return KS_OK;
    }
    uint8_t *m = kv_slow_mem(kv, L, id);
    if (m) memcpy(m, buf, kv->page_bytes);
    else KS_TRY(ks_kv_file_write(L->fd, buf, kv->page_bytes, (off_t)id * (off_t)kv->page_bytes));
    atomic_fetch_add(&kv->bytes_stored, kv->page_bytes);
    int32_t s = L->slot_of[id];
    if (s >= 0) {
        memcpy(kv_slot_k(kv, L, s), buf, kv_half_bytes(kv));
        memcpy(kv_slot_v(kv, L, s), buf + kv_half_bytes(kv), kv_half_bytes(kv));
    }
    return KS_OK;
}

void ks_kv_release_slow(kv_layer *L) {
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
        else if (!(slow = ks_alloc_streamed(total))) return KS_FAIL(KS_ERR_NOMEM, "slow tier of %zu bytes refused", total);
        uint8_t *slots = ks_alloc_streamed((size_t)kv->n_sh * kv->n_slot * kv->page_bytes);
        if (!slots) {
            if (fd >= 0) close(fd);
            free(slow);
            return KS_FAIL(KS_ERR_NOMEM, "fast-tier slots for layer %d refused", layer);
        }
        /* copy the pages in use; the rest of the file stays reserved */
        for (int32_t id = 0; id < kv->n_phys; id++) {
            if (!L->in_use[id]) continue;
            uint8_t *src = kv->page_tmp;
            memcpy(src, kv_fast_k(kv, L, id), kv_half_bytes(kv));
            memcpy(src + kv_half_bytes(kv), kv_fast_v(kv, L, id), kv_half_bytes(kv));
            if (slow) memcpy(slow + (size_t)id * kv->page_bytes, src, kv->page_bytes);
            else {
                ks_status st = ks_kv_file_write(fd, src, kv->page_bytes, (off_t)id * (off_t)kv->page_bytes);
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
        memcpy(fast + ((size_t)kv->n_phys + id) * kv_half_bytes(kv), kv->page_tmp + kv_half_bytes(kv), kv_half_bytes(kv));
        atomic_fetch_add(&kv->bytes_loaded, kv->page_bytes);
    }
    ks_kv_release_slow(L);
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
    const int32_t *tab = kv_table_of(kv, seq, layer, head);
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
                           .dst = kv_slot_k(kv, L, sh * kv->n_slot + s),
                           .dst2 = kv_slot_v(kv, L, sh * kv->n_slot + s),
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
    int32_t id = kv_table_of(kv, seq, layer, head)[lp];
    if (L->tier == KS_TIER_FAST) {
        *K = kv_fast_k(kv, L, id);
        *V = kv_fast_v(kv, L, id);
    } else {
        int32_t s = L->slot_of[id];
        KS_ASSERT(s >= 0); /* the page was fetched this step */
        *K = kv_slot_k(kv, L, s);
        *V = kv_slot_v(kv, L, s);
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
    int32_t id = kv_table_of(kv, seq, layer, head)[lp];
    KS_TRY(ks_kv_page_read(kv, L, id, buf));
    if (L->tier == KS_TIER_SLOW) { /* a gathered page is a load that no slot will keep */
        atomic_fetch_add(&kv->bytes_loaded, kv->page_bytes);
        atomic_fetch_add(&kv->pages_loaded, 1);
    }
    return KS_OK;
}

int32_t ks_kv_slot_pages(const ks_kv_store *kv) { return kv->n_slot; }
