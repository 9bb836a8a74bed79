/*
 * test_kv.c — the paged, tiered KV store on hand-made rows.
 *
 * Invariants checked: page summaries (positions, min, max, key sum) equal a
 * recomputation from the stored rows after appends that cross page
 * boundaries; compaction keeps survivors in order with their positions and
 * frees pages; moving a layer to the slow tier (memory or file) and back is
 * bit-identical; fetches reuse resident slots and load only misses; a failed
 * slow-tier read and a full offload directory give KS_ERR_IO, never data;
 * parking a sequence and bringing it back restores its pages and metadata
 * byte for byte (f16 and 8-bit KV, memory and file slow tier).
 */
#define _GNU_SOURCE
#include "kv/kv.h"
#include "tensor/dtype.h"
#include "testutil.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

enum { HD = 64, NH = 2, NL = 2, P = 8, CTX = 100 };

static ks_kv_store *make_store(int n_seq, int slot_entries, const char *dir) {
    ks_kv_params p = ks_kv_default_params();
    p.n_layer = NL;
    p.n_head_kv = NH;
    p.head_dim = HD;
    p.n_seq = n_seq;
    p.n_ctx = CTX;
    p.page = P;
    p.slot_entries = slot_entries;
    p.offload_dir = dir;
    ks_kv_store *kv = NULL;
    assert_int_equal(ks_kv_create(&p, &kv), KS_OK);
    return kv;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* deterministic row values for (seq, layer, head, i, which) */
static void row_values(int seq, int layer, int head, int i, int which, float *out) {
    for (int d = 0; d < HD; d++)
        out[d] = sinf(0.37f * (float)(d + 1) * (float)(i + 1) + 1.3f * seq + 0.7f * layer + 0.11f * head + which);
}

static void fill(ks_kv_store *kv, int seq, int n) {
    float k[HD], v[HD];
    for (int i = 0; i < n; i++)
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < NH; h++) {
                row_values(seq, l, h, i, 0, k);
                row_values(seq, l, h, i, 1, v);
                assert_int_equal(ks_kv_append(kv, seq, l, h, 1000 + i, k, v), KS_OK);
            }
}

/* the stored (f16-rounded) K row of entry e */
static void stored_key(const ks_kv_store *kv, int seq, int l, int h, int e, float *out) {
    const uint8_t *K, *V;
    ks_kv_page_rows(kv, seq, l, h, e / P, &K, &V);
    const ks_f16 *r = (const ks_f16 *)(K + (size_t)(e % P) * ks_kv_row_size(kv));
    for (int d = 0; d < HD; d++) out[d] = ks_f16_to_f32(r[d]);
}

static void check_meta(const ks_kv_store *kv, int seq, int l, int h, const int32_t *expect_pos) {
    int n = ks_kv_n_entries(kv, seq, l, h);
    assert_int_equal(ks_kv_n_pages(kv, seq, l, h), (n + P - 1) / P);
    for (int lp = 0; lp < ks_kv_n_pages(kv, seq, l, h); lp++) {
        ks_kv_page_meta m;
        ks_kv_page_meta_get(kv, seq, l, h, lp, &m);
        int fill = n - lp * P < P ? n - lp * P : P;
        assert_int_equal(m.fill, fill);
        float mn[HD], mx[HD], sm[HD], key[HD];
        for (int s = 0; s < fill; s++) {
            stored_key(kv, seq, l, h, lp * P + s, key);
            assert_int_equal(m.pos[s], expect_pos[lp * P + s]);
            for (int d = 0; d < HD; d++) {
                mn[d] = s ? fminf(mn[d], key[d]) : key[d];
                mx[d] = s ? fmaxf(mx[d], key[d]) : key[d];
                sm[d] = s ? sm[d] + key[d] : key[d];
            }
        }
        assert_memory_equal(m.kmin, mn, sizeof mn);
        assert_memory_equal(m.kmax, mx, sizeof mx);
        assert_memory_equal(m.ksum, sm, sizeof sm);
        if (m.kbound16) /* an f16 cache's f16 bounds: the same values */
            for (int d = 0; d < HD; d++) {
                assert_true(ks_f16_to_f32(m.kbound16[d]) == mn[d]);
                assert_true(ks_f16_to_f32(m.kbound16[HD + d]) == mx[d]);
            }
    }
}

static void test_append_meta_exact(void **state) {
    (void)state;
    ks_kv_store *kv = make_store(2, 0, NULL);
    fill(kv, 0, 37); /* 4 full pages + 5 */
    fill(kv, 1, 8);  /* exactly one page */
    int32_t pos[CTX];
    for (int i = 0; i < CTX; i++) pos[i] = 1000 + i;
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) {
            assert_int_equal(ks_kv_n_entries(kv, 0, l, h), 37);
            check_meta(kv, 0, l, h, pos);
            check_meta(kv, 1, l, h, pos);
        }
    /* values read back through the page table */
    float key[HD], want[HD];
    row_values(0, 1, 1, 33, 0, want);
    stored_key(kv, 0, 1, 1, 33, key);
    for (int d = 0; d < HD; d++) assert_true(fabsf(key[d] - want[d]) < 1e-3f);
    ks_kv_seq_clear(kv, 0);
    assert_int_equal(ks_kv_n_entries(kv, 0, 0, 0), 0);
    assert_int_equal(ks_kv_n_entries(kv, 1, 0, 0), 8);
    fill(kv, 0, 20); /* recycled pages */
    check_meta(kv, 0, 0, 1, pos);
    ks_kv_destroy(kv);
}

static void test_compact(void **state) {
    (void)state;
    ks_kv_store *kv = make_store(1, 0, NULL);
    fill(kv, 0, 37);
    uint8_t keep[37];
    int32_t pos[CTX];
    float before[37][HD];
    for (int i = 0; i < 37; i++) stored_key(kv, 0, 1, 0, i, before[i]);
    int m = 0;
    for (int i = 0; i < 37; i++) {
        keep[i] = (i % 3 == 0) || i > 30;
        if (keep[i]) pos[m++] = 1000 + i;
    }
    assert_int_equal(ks_kv_compact(kv, 0, 1, 0, keep), KS_OK);
    assert_int_equal(ks_kv_n_entries(kv, 0, 1, 0), m);
    assert_int_equal(ks_kv_n_entries(kv, 0, 1, 1), 37); /* other heads untouched */
    check_meta(kv, 0, 1, 0, pos);
    for (int i = 0, w = 0; i < 37; i++) {
        if (!keep[i]) continue;
        float key[HD];
        stored_key(kv, 0, 1, 0, w++, key);
        assert_memory_equal(key, before[i], sizeof key);
    }
    /* appends continue after the survivors */
    float k[HD], v[HD];
    row_values(0, 1, 0, 99, 0, k);
    row_values(0, 1, 0, 99, 1, v);
    assert_int_equal(ks_kv_append(kv, 0, 1, 0, 2000, k, v), KS_OK);
    pos[m] = 2000;
    check_meta(kv, 0, 1, 0, pos);
    ks_kv_destroy(kv);
}

/* every page of every head, as bytes */
static uint8_t *snapshot(ks_kv_store *kv, int seq) {
    size_t pb = ks_kv_page_bytes(kv), off = 0;
    uint8_t *buf = malloc(pb * NL * NH * (CTX / P + 1));
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++)
            for (int lp = 0; lp < ks_kv_n_pages(kv, seq, l, h); lp++, off += pb) {
                assert_int_equal(ks_kv_read_page(kv, seq, l, h, lp, buf + off), KS_OK);
                /* bytes past the fill are not data: zero them for the comparison */
                ks_kv_page_meta m;
                ks_kv_page_meta_get(kv, seq, l, h, lp, &m);
                size_t row = ks_kv_row_size(kv);
                memset(buf + off + m.fill * row, 0, (P - m.fill) * row);
                memset(buf + off + (P + m.fill) * row, 0, (P - m.fill) * row);
            }
    return buf;
}

static void tier_roundtrip(const char *dir) {
    ks_kv_store *kv = make_store(1, 3 * P, dir);
    fill(kv, 0, 37);
    uint8_t *a = snapshot(kv, 0);
    assert_int_equal(ks_kv_set_layer_tier(kv, 1, KS_TIER_SLOW), KS_OK);
    assert_int_equal(ks_kv_layer_tier(kv, 1), KS_TIER_SLOW);
    uint8_t *b = snapshot(kv, 0);
    size_t bytes = ks_kv_page_bytes(kv) * NL * NH * 5;
    assert_memory_equal(a, b, bytes);
    /* appends to a slow layer go to the slow copy */
    float k[HD], v[HD];
    for (int h = 0; h < NH; h++) {
        row_values(0, 1, h, 37, 0, k);
        row_values(0, 1, h, 37, 1, v);
        assert_int_equal(ks_kv_append(kv, 0, 1, h, 1037, k, v), KS_OK);
        row_values(0, 0, h, 37, 0, k);
        row_values(0, 0, h, 37, 1, v);
        assert_int_equal(ks_kv_append(kv, 0, 0, h, 1037, k, v), KS_OK);
    }
    /* K rows only, across page boundaries, fast and slow: the page's K rows; a slow read moves those rows alone */
    ks_kv_traffic tr;
    ks_kv_take_traffic(kv, &tr);
    size_t row = ks_kv_row_size(kv);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < NH; h++) {
            uint8_t keys[35 * HD * 2], page[2 * P * HD * 2];
            assert_int_equal(ks_kv_read_keys(kv, 0, l, h, 3, 35, keys), KS_OK);
            for (int e = 3; e < 38; e++) {
                assert_int_equal(ks_kv_read_page(kv, 0, l, h, e / P, page), KS_OK);
                assert_memory_equal(keys + (size_t)(e - 3) * row, page + (size_t)(e % P) * row, row);
            }
        }
    ks_kv_take_traffic(kv, &tr);
    /* the slow layer: its key rows plus the whole pages the check itself read */
    assert_int_equal(tr.bytes_loaded, (uint64_t)NH * (35 * row + 35 * ks_kv_page_bytes(kv)));
    /* fetch through a buffer of 3 pages' worth of entries: misses load, hits stay */
    int32_t want[3 * P], next[3 * P];
    for (int i = 0; i < 3 * P; i++) want[i] = (i / P == 2 ? 4 : i / P) * P + i % P; /* pages 0, 1, 4 */
    for (int i = 0; i < 3 * P; i++) next[i] = (i / P == 0 ? 2 : i / P == 1 ? 1 : 4) * P + i % P;
    qsort(next, 3 * P, sizeof(int32_t), cmp_i32);
    int32_t nw = 0;
    for (int i = 0; i < 3 * P; i++) want[nw] = want[i], nw += want[i] < 38; /* page 4 holds entries 32..37 only */
    assert_int_equal(ks_kv_fetch(kv, 0, 1, 0, want, nw, true), KS_OK);
    assert_int_equal(ks_kv_wait_layer(kv, 1), KS_OK);
    ks_kv_take_traffic(kv, &tr);
    assert_int_equal(tr.entries_loaded, nw);
    assert_int_equal(ks_kv_fetch(kv, 0, 1, 0, want, nw, true), KS_OK);
    assert_int_equal(ks_kv_wait_layer(kv, 1), KS_OK);
    ks_kv_take_traffic(kv, &tr);
    assert_int_equal(tr.entries_loaded, 0);
    assert_int_equal(tr.entries_hit, nw);
    int32_t nn = 0;
    for (int i = 0; i < 3 * P; i++) next[nn] = next[i], nn += next[i] < 38;
    assert_int_equal(ks_kv_fetch(kv, 0, 1, 0, next, nn, false), KS_OK);
    ks_kv_take_traffic(kv, &tr);
    assert_int_equal(tr.entries_loaded, P); /* page 2 in, page 0 out */
    assert_int_equal(tr.entries_hit, nn - P);
    assert_int_equal(tr.bytes_loaded, 2 * P * row);
    /* the buffer holds exactly the slow copy */
    for (int i = 0; i < nn; i++) {
        const uint8_t *K, *V;
        uint8_t page[2 * P * HD * 2];
        ks_kv_entry_rows(kv, 0, 1, 0, next[i], &K, &V);
        assert_int_equal(ks_kv_read_page(kv, 0, 1, 0, next[i] / P, page), KS_OK);
        assert_memory_equal(K, page + (size_t)(next[i] % P) * row, row);
        assert_memory_equal(V, page + (size_t)(P + next[i] % P) * row, row);
    }
    int32_t too_many[3 * P + 1];
    for (int i = 0; i <= 3 * P; i++) too_many[i] = i;
    assert_int_equal(ks_kv_fetch(kv, 0, 1, 0, too_many, 3 * P + 1, false), KS_ERR_NOMEM);
    /* back to the fast tier: identical to a store that never moved */
    assert_int_equal(ks_kv_set_layer_tier(kv, 1, KS_TIER_FAST), KS_OK);
    ks_kv_store *ref = make_store(1, 0, NULL);
    fill(ref, 0, 37);
    for (int h = 0; h < NH; h++)
        for (int l = 0; l < NL; l++) {
            row_values(0, l, h, 37, 0, k);
            row_values(0, l, h, 37, 1, v);
            assert_int_equal(ks_kv_append(ref, 0, l, h, 1037, k, v), KS_OK);
        }
    uint8_t *c = snapshot(kv, 0), *d = snapshot(ref, 0);
    assert_memory_equal(c, d, bytes);
    free(a);
    free(b);
    free(c);
    free(d);
    ks_kv_destroy(ref);
    ks_kv_destroy(kv);
}

/* Elastic loading (SpeContext, Section 5.4): with a scattered selection of
 * B entries in the buffer of every slow layer and KV head, a step whose
 * selection changed by k entries moves exactly k entries' K and V rows per
 * (layer, head), no more (no page or whole-budget reloads), and the entries
 * read afterwards are the slow copy's. */
static void test_elastic_loading(void **state) {
    (void)state;
    enum { B = 20, K = 3 };
    ks_kv_store *kv = make_store(1, B, NULL);
    fill(kv, 0, 90);
    for (int l = 0; l < NL; l++) assert_int_equal(ks_kv_set_layer_tier(kv, l, KS_TIER_SLOW), KS_OK);
    size_t row = ks_kv_row_size(kv);
    int32_t sel[B], sel2[B];
    for (int i = 0; i < B; i++) sel[i] = 3 + 4 * i + (i % 3); /* scattered: no two in a row */
    ks_kv_traffic tr;
    ks_kv_take_traffic(kv, &tr);
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) assert_int_equal(ks_kv_fetch(kv, 0, l, h, sel, B, true), KS_OK);
    for (int l = 0; l < NL; l++) assert_int_equal(ks_kv_wait_layer(kv, l), KS_OK);
    ks_kv_take_traffic(kv, &tr);
    assert_int_equal(tr.entries_loaded, (uint64_t)B * NL * NH); /* the first step fills the buffers */
    for (int step = 0; step < 4; step++) {
        /* K entries leave, K entries not selected before arrive */
        memcpy(sel2, sel, sizeof sel);
        for (int k = 0; k < K; k++) {
            int32_t cand = (step * 7 + 29 * k + 1) % 89;
            for (bool taken = true; taken;) {
                taken = false;
                for (int j = 0; j < B; j++) taken |= sel[j] == cand || sel2[j] == cand;
                if (taken) cand = (cand + 1) % 89;
            }
            sel2[(5 * k + step) % B] = cand;
        }
        qsort(sel2, B, sizeof(int32_t), cmp_i32);
        int32_t n2 = B, changed = K;
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < NH; h++) assert_int_equal(ks_kv_fetch(kv, 0, l, h, sel2, n2, true), KS_OK);
        for (int l = 0; l < NL; l++) assert_int_equal(ks_kv_wait_layer(kv, l), KS_OK);
        ks_kv_take_traffic(kv, &tr);
        assert_true(changed > 0);
        assert_int_equal(tr.entries_loaded, (uint64_t)changed * NL * NH);
        assert_int_equal(tr.entries_hit, (uint64_t)(n2 - changed) * NL * NH);
        assert_int_equal(tr.bytes_loaded, (uint64_t)changed * NL * NH * 2 * row);
        assert_int_equal(tr.pages_loaded, 0);
        assert_int_equal(tr.sync_fallbacks, 0);
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < n2; i++) {
                    const uint8_t *Kr, *Vr;
                    uint8_t page[2 * P * HD * 2];
                    ks_kv_entry_rows(kv, 0, l, h, sel2[i], &Kr, &Vr);
                    assert_int_equal(ks_kv_read_page(kv, 0, l, h, sel2[i] / P, page), KS_OK);
                    assert_memory_equal(Kr, page + (size_t)(sel2[i] % P) * row, row);
                    assert_memory_equal(Vr, page + (size_t)(P + sel2[i] % P) * row, row);
                }
        ks_kv_take_traffic(kv, &tr);
        memcpy(sel, sel2, sizeof sel);
    }
    ks_kv_destroy(kv);
}


/* page metadata of every page of a sequence (fill, positions, key summaries), as bytes */
static size_t meta_snapshot(const ks_kv_store *kv, int seq, uint8_t *out) {
    size_t off = 0;
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) {
            int32_t n = ks_kv_n_entries(kv, seq, l, h);
            memcpy(out + off, &n, sizeof n), off += sizeof n;
            for (int lp = 0; lp < ks_kv_n_pages(kv, seq, l, h); lp++) {
                ks_kv_page_meta m;
                ks_kv_page_meta_get(kv, seq, l, h, lp, &m);
                memcpy(out + off, &m.fill, sizeof m.fill), off += sizeof m.fill;
                memcpy(out + off, m.pos, sizeof(int32_t) * m.fill), off += sizeof(int32_t) * m.fill;
                memcpy(out + off, m.kmin, sizeof(float) * HD), off += sizeof(float) * HD;
                memcpy(out + off, m.kmax, sizeof(float) * HD), off += sizeof(float) * HD;
                memcpy(out + off, m.ksum, sizeof(float) * HD), off += sizeof(float) * HD;
                if (m.kbound16) memcpy(out + off, m.kbound16, sizeof(uint16_t) * 2 * HD), off += sizeof(uint16_t) * 2 * HD;
            }
        }
    return off;
}

/* Park / unpark (the scheduler's pause): a parked sequence holds nothing in
 * the store (its pages return to the pools, the fast-tier bytes drop), the
 * other sequences go on (appends, a layer moving to the slow tier meanwhile),
 * and unparking restores its pages and metadata byte for byte, after which
 * appends continue as if nothing happened. */
static void park_roundtrip(ks_kv_type type, const char *dir) {
    ks_kv_params p = ks_kv_default_params();
    p.n_layer = NL, p.n_head_kv = NH, p.head_dim = HD, p.n_seq = 2, p.n_ctx = CTX, p.page = P;
    p.slot_entries = 3 * P, p.type = type, p.offload_dir = dir;
    ks_kv_store *kv = NULL, *ref = NULL;
    assert_int_equal(ks_kv_create(&p, &kv), KS_OK);
    assert_int_equal(ks_kv_create(&p, &ref), KS_OK);
    fill(kv, 0, 37);
    fill(kv, 1, 21);
    fill(ref, 0, 37);
    size_t bytes = ks_kv_page_bytes(kv) * NL * NH * 5, mcap = (size_t)NL * NH * (CTX / P + 1) * (16 + 3 * HD * 4 + 2 * HD * 2 + P * 4) + 64;
    uint8_t *a = snapshot(kv, 0), *ma = calloc(1, mcap), *mb = calloc(1, mcap);
    size_t na = meta_snapshot(kv, 0, ma);
    assert_false(ks_kv_seq_parked(kv, 0));
    assert_int_equal(ks_kv_seq_unpark(kv, 0), KS_ERR_INVALID_ARG); /* not parked */
    assert_int_equal(ks_kv_seq_park(kv, 0), KS_OK);
    assert_true(ks_kv_seq_parked(kv, 0));
    assert_int_equal(ks_kv_seq_park(kv, 0), KS_ERR_INVALID_ARG); /* twice */
    assert_int_equal(ks_kv_seq_parked_entries(kv, 0), 37 * NL * NH);
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) {
            assert_int_equal(ks_kv_n_entries(kv, 0, l, h), 0);
            assert_int_equal(ks_kv_n_entries(kv, 1, l, h), 21);
        }
    /* meanwhile: layer 1 goes slow, the other sequence grows */
    assert_int_equal(ks_kv_set_layer_tier(kv, 1, KS_TIER_SLOW), KS_OK);
    float k[HD], v[HD];
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) {
            row_values(1, l, h, 21, 0, k);
            row_values(1, l, h, 21, 1, v);
            assert_int_equal(ks_kv_append(kv, 1, l, h, 1021, k, v), KS_OK);
        }
    assert_int_equal(ks_kv_seq_unpark(kv, 0), KS_OK);
    assert_false(ks_kv_seq_parked(kv, 0));
    assert_int_equal(ks_kv_seq_parked_entries(kv, 0), 0);
    uint8_t *b = snapshot(kv, 0);
    assert_memory_equal(a, b, bytes);
    assert_int_equal(meta_snapshot(kv, 0, mb), na);
    assert_memory_equal(ma, mb, na);
    /* appends go on exactly as in a store that never parked */
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) {
            row_values(0, l, h, 37, 0, k);
            row_values(0, l, h, 37, 1, v);
            assert_int_equal(ks_kv_append(kv, 0, l, h, 1037, k, v), KS_OK);
            assert_int_equal(ks_kv_append(ref, 0, l, h, 1037, k, v), KS_OK);
        }
    uint8_t *c = snapshot(kv, 0), *d = snapshot(ref, 0);
    assert_memory_equal(c, d, bytes);
    assert_int_equal(meta_snapshot(kv, 0, ma), meta_snapshot(ref, 0, mb));
    assert_memory_equal(ma, mb, meta_snapshot(ref, 0, mb));
    /* a parked sequence's copy goes with a clear (and with the store) */
    assert_int_equal(ks_kv_seq_park(kv, 1), KS_OK);
    ks_kv_seq_clear(kv, 1);
    assert_false(ks_kv_seq_parked(kv, 1));
    assert_int_equal(ks_kv_seq_park(kv, 0), KS_OK);
    free(a), free(b), free(c), free(d), free(ma), free(mb);
    ks_kv_destroy(ref);
    ks_kv_destroy(kv);
}

static void test_park_f16(void **state) {
    (void)state;
    park_roundtrip(KS_KV_F16, NULL);
}

static void test_park_q8(void **state) {
    (void)state;
    park_roundtrip(KS_KV_Q8, NULL);
}

static void test_park_file(void **state) {
    (void)state;
    char dir[] = "/tmp/kvsieve-test-park-XXXXXX";
    assert_non_null(mkdtemp(dir));
    park_roundtrip(KS_KV_Q8, dir);
    assert_int_equal(rmdir(dir), 0); /* the parked file was unlinked at creation */
}

/* A failed slow-tier read while parking leaves the sequence as it was. */
static void test_park_failed_read(void **state) {
    (void)state;
    ks_kv_store *kv = make_store(1, 4 * P, NULL);
    fill(kv, 0, 20);
    assert_int_equal(ks_kv_set_layer_tier(kv, 1, KS_TIER_SLOW), KS_OK);
    ks_kv_debug_fail_reads(kv, 1, true);
    assert_int_equal(ks_kv_seq_park(kv, 0), KS_ERR_IO);
    assert_false(ks_kv_seq_parked(kv, 0));
    assert_int_equal(ks_kv_n_entries(kv, 0, 1, 1), 20);
    ks_kv_debug_fail_reads(kv, 1, false);
    assert_int_equal(ks_kv_seq_park(kv, 0), KS_OK);
    ks_kv_destroy(kv);
}

static void test_tier_memory(void **state) {
    (void)state;
    tier_roundtrip(NULL);
}

static char g_dir[256];

static void test_tier_file(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/kvsieve-test-kv-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    tier_roundtrip(g_dir);
    rmdir(g_dir); /* files are unlinked at creation: the directory is empty */
}

static void test_failed_read(void **state) {
    (void)state;
    ks_kv_store *kv = make_store(1, 4 * P, NULL);
    fill(kv, 0, 20);
    assert_int_equal(ks_kv_set_layer_tier(kv, 0, KS_TIER_SLOW), KS_OK);
    ks_kv_debug_fail_reads(kv, 0, true);
    int32_t lp[2] = {0, 9};
    assert_int_equal(ks_kv_fetch(kv, 0, 0, 0, lp, 2, false), KS_ERR_IO);
    assert_non_null(strstr(ks_last_error(), "failed"));
    assert_int_equal(ks_kv_fetch(kv, 0, 0, 1, lp, 2, true), KS_OK);
    assert_int_equal(ks_kv_wait_layer(kv, 0), KS_ERR_IO);
    uint8_t page[2 * P * HD * 2];
    assert_int_equal(ks_kv_read_page(kv, 0, 0, 0, 0, page), KS_ERR_IO);
    assert_int_equal(ks_kv_read_keys(kv, 0, 0, 0, 0, 4, page), KS_ERR_IO);
    /* reads work again once the fault is gone; nothing stale was kept */
    ks_kv_debug_fail_reads(kv, 0, false);
    assert_int_equal(ks_kv_fetch(kv, 0, 0, 1, lp, 2, false), KS_OK);
    ks_kv_destroy(kv);
}

static void test_full_directory(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/kvsieve-test-kv-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    ks_kv_store *kv = make_store(1, 0, g_dir);
    fill(kv, 0, 20);
    /* a file-size limit stands in for a full disk: the reservation fails */
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    ks_status st = ks_kv_set_layer_tier(kv, 1, KS_TIER_SLOW);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    assert_int_equal(st, KS_ERR_IO);
    assert_non_null(strstr(ks_last_error(), "cannot reserve"));
    assert_int_equal(ks_kv_layer_tier(kv, 1), KS_TIER_FAST); /* nothing moved */
    int32_t pos[CTX];
    for (int i = 0; i < CTX; i++) pos[i] = 1000 + i;
    check_meta(kv, 0, 1, 0, pos);
    ks_kv_destroy(kv);
    rmdir(g_dir);
}

static void test_bad_directory(void **state) {
    (void)state;
    ks_kv_store *kv = make_store(1, 0, "/nonexistent/kvsieve");
    assert_int_equal(ks_kv_set_layer_tier(kv, 0, KS_TIER_SLOW), KS_ERR_IO);
    assert_non_null(strstr(ks_last_error(), "cannot create"));
    ks_kv_destroy(kv);
}

static void test_pool_exhausted_and_full(void **state) {
    (void)state;
    ks_kv_store *kv = make_store(1, 0, NULL);
    fill(kv, 0, CTX);
    float k[HD] = {0}, v[HD] = {0};
    assert_int_equal(ks_kv_append(kv, 0, 0, 0, 5000, k, v), KS_ERR_CONTEXT_FULL);
    assert_int_equal(ks_kv_n_entries(kv, 0, 0, 0), CTX);
    ks_kv_destroy(kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_meta_exact), cmocka_unit_test(test_compact),
        cmocka_unit_test(test_elastic_loading),   cmocka_unit_test(test_tier_memory),       cmocka_unit_test(test_tier_file),
        cmocka_unit_test(test_failed_read),       cmocka_unit_test(test_full_directory),
        cmocka_unit_test(test_bad_directory),     cmocka_unit_test(test_pool_exhausted_and_full),
        cmocka_unit_test(test_park_f16),          cmocka_unit_test(test_park_q8),
        cmocka_unit_test(test_park_file),         cmocka_unit_test(test_park_failed_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
