/*
 * test_kv_share.c — shared pages in the KV store (kv.h, "shared pages").
 *
 * A full page may be held by several page tables and pins at once; it must
 * never change under any of them.  Checked on hand-made rows, against a
 * reference store that holds private copies of the same rows:
 *  - mapping a pinned page shares the physical page (same rows, same
 *    metadata, no copy) and the sharing counters count it once;
 *  - a sequence extending a shared prefix appends into a page of its own;
 *  - compaction (an evictor's cut, truncation) copies the pages it rewrites
 *    and leaves the shared ones and the other holders exactly as they were,
 *    its result equal to the same compaction without sharing;
 *  - a layer moving to the slow tier unshares, parking and unparking a
 *    sharer restores it byte for byte, and the other holders are untouched;
 *  - clearing and unpinning return every page: afterwards both sequences
 *    fill their whole context (pins never eat a sequence's pages);
 *  - pins beyond the headroom are refused (the caller copies instead).
 */
#include "kv/kv.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { HD = 64, NH = 2, NL = 2, P = 8, CTX = 64 };

static ks_kv_store *make_store(int n_seq, int pin_pages) {
    ks_kv_params p = ks_kv_default_params();
    p.n_layer = NL;
    p.n_head_kv = NH;
    p.head_dim = HD;
    p.n_seq = n_seq;
    p.n_ctx = CTX;
    p.page = P;
    p.pin_pages = pin_pages;
    ks_kv_store *kv = NULL;
    assert_int_equal(ks_kv_create(&p, &kv), KS_OK);
    return kv;
}

static void row_values(int layer, int head, int i, int which, float *out) {
    for (int d = 0; d < HD; d++) out[d] = sinf(0.37f * (float)(d + 1) * (float)(i + 1) + 0.7f * layer + 0.11f * head + which);
}

/* entries [from, to) of the common token stream into seq */
static void fill(ks_kv_store *kv, int seq, int from, int to) {
    float k[HD], v[HD];
    for (int i = from; i < to; i++)
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < NH; h++) {
                row_values(l, h, i, 0, k);
                row_values(l, h, i, 1, v);
                assert_int_equal(ks_kv_append(kv, seq, l, h, i, k, v), KS_OK);
            }
}

/* (a, sa) and (b, sb) hold the same entries, rows and summaries */
static void assert_same(ks_kv_store *a, int sa, ks_kv_store *b, int sb) {
    size_t pb = ks_kv_page_bytes(a);
    uint8_t *x = malloc(pb), *y = malloc(pb);
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) {
            assert_int_equal(ks_kv_n_entries(a, sa, l, h), ks_kv_n_entries(b, sb, l, h));
            for (int lp = 0; lp < ks_kv_n_pages(a, sa, l, h); lp++) {
                ks_kv_page_meta ma, mb;
                ks_kv_page_meta_get(a, sa, l, h, lp, &ma);
                ks_kv_page_meta_get(b, sb, l, h, lp, &mb);
                assert_int_equal(ma.fill, mb.fill);
                assert_memory_equal(ma.pos, mb.pos, sizeof(int32_t) * ma.fill);
                assert_memory_equal(ma.kmin, mb.kmin, sizeof(float) * HD);
                assert_memory_equal(ma.kmax, mb.kmax, sizeof(float) * HD);
                assert_memory_equal(ma.ksum, mb.ksum, sizeof(float) * HD);
                assert_memory_equal(ma.kbound8, mb.kbound8, ks_kv_bounds8_bytes(HD));
                assert_int_equal(ks_kv_read_page(a, sa, l, h, lp, x), KS_OK);
                assert_int_equal(ks_kv_read_page(b, sb, l, h, lp, y), KS_OK);
                /* rows past the fill are not data: compare K and V rows in use */
                size_t row = ks_kv_row_size(a);
                assert_memory_equal(x, y, row * ma.fill);
                assert_memory_equal(x + row * P, y + row * P, row * ma.fill);
            }
        }
    free(x);
    free(y);
}

/* Pin seq's first np pages of every (layer, head) into ids[NL][NH][np]. */
static void pin_all(ks_kv_store *kv, int seq, int np, int32_t *ids) {
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++)
            for (int lp = 0; lp < np; lp++) assert_int_equal(ks_kv_pin(kv, seq, l, h, lp, &ids[(l * NH + h) * np + lp]), KS_OK);
}
static void map_all(ks_kv_store *kv, int seq, int np, const int32_t *ids) {
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++)
            for (int lp = 0; lp < np; lp++) assert_int_equal(ks_kv_map_pinned(kv, seq, l, h, ids[(l * NH + h) * np + lp]), KS_OK);
}
static void unpin_all(ks_kv_store *kv, int np, const int32_t *ids) {
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++)
            for (int lp = 0; lp < np; lp++) ks_kv_unpin(kv, l, ids[(l * NH + h) * np + lp]);
}

static void test_map_extend_compact(void **state) {
    (void)state;
    ks_kv_store *kv = make_store(3, 3 * NH);
    ks_kv_store *ref = make_store(1, 0); /* private copies of the same rows */
    enum { NP = 3 };
    int32_t ids[NL * NH * NP];
    fill(kv, 0, 0, NP * P + 3); /* 3 full pages and a partial one */
    pin_all(kv, 0, NP, ids);
    map_all(kv, 1, NP, ids);
    map_all(kv, 2, NP, ids);
    ks_kv_share_info si;
    ks_kv_share_info_get(kv, &si);
    assert_int_equal(si.pinned_pages, NL * NH * NP);
    assert_int_equal(si.pinned_tabled_pages, NL * NH * NP);
    assert_int_equal(si.dup_pages, 2 * NL * NH * NP); /* three tables, one page: counted once */
    for (int lp = 0; lp < NP; lp++) {
        const uint8_t *k0, *v0, *k1, *v1;
        ks_kv_page_rows(kv, 0, 1, 1, lp, &k0, &v0);
        ks_kv_page_rows(kv, 1, 1, 1, lp, &k1, &v1);
        assert_ptr_equal(k0, k1); /* mapped, not copied */
        assert_ptr_equal(v0, v1);
        assert_int_equal(ks_kv_page_refs(kv, 1, 1, 1, lp), 3);
    }
    /* seq 1 extends the shared prefix with the same rows (its own last page) */
    fill(kv, 1, NP * P, NP * P + 3);
    fill(ref, 0, 0, NP * P + 3);
    assert_same(kv, 1, ref, 0);
    assert_same(kv, 0, ref, 0);
    assert_int_equal(ks_kv_page_refs(kv, 1, 0, 0, NP), 1);
    /* seq 2 goes on with other rows: seq 0 and 1 must not see them */
    float k[HD], v[HD];
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) {
            row_values(l, h, 999, 0, k);
            row_values(l, h, 999, 1, v);
            assert_int_equal(ks_kv_append(kv, 2, l, h, NP * P, k, v), KS_OK);
        }
    assert_same(kv, 0, ref, 0);
    /* an evictor's cut inside the shared prefix (entry 10, page 1) in seq 1 */
    uint8_t keep[NP * P + 3];
    for (int i = 0; i < NP * P + 3; i++) keep[i] = i != 10 && i != 20;
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) {
            assert_int_equal(ks_kv_compact(kv, 1, l, h, keep), KS_OK);
            assert_int_equal(ks_kv_compact(ref, 0, l, h, keep), KS_OK);
        }
    assert_same(kv, 1, ref, 0);
    assert_int_equal(ks_kv_page_refs(kv, 1, 0, 0, 0), 3);  /* before the cut: still shared */
    assert_int_equal(ks_kv_page_refs(kv, 1, 0, 0, 1), 1);  /* rewritten: its own copy */
    ks_kv_store *ref0 = make_store(1, 0);
    fill(ref0, 0, 0, NP * P + 3);
    assert_same(kv, 0, ref0, 0); /* the sharers saw nothing */
    /* truncation into the shared prefix, then an append: copy on write */
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) {
            assert_int_equal(ks_kv_truncate(kv, 2, l, h, P + 4), KS_OK);
            assert_int_equal(ks_kv_truncate(ref0, 0, l, h, P + 4), KS_OK);
        }
    fill(kv, 2, P + 4, P + 6);
    fill(ref0, 0, P + 4, P + 6);
    assert_same(kv, 2, ref0, 0);
    ks_kv_store *ref1 = make_store(1, 0);
    fill(ref1, 0, 0, NP * P + 3);
    assert_same(kv, 0, ref1, 0);
    /* everything goes back: then both... every sequence fills its whole context */
    for (int s = 0; s < 3; s++) ks_kv_seq_clear(kv, s);
    ks_kv_share_info_get(kv, &si);
    assert_int_equal(si.dup_pages, 0);
    assert_int_equal(si.pinned_tabled_pages, 0);
    assert_int_equal(si.pinned_pages, NL * NH * NP); /* the pins hold their pages */
    for (int s = 0; s < 3; s++) fill(kv, s, 0, CTX); /* pins never take a sequence's pages */
    unpin_all(kv, NP, ids);
    ks_kv_share_info_get(kv, &si);
    assert_int_equal(si.pinned_pages, 0);
    ks_kv_destroy(kv);
    ks_kv_destroy(ref);
    ks_kv_destroy(ref0);
    ks_kv_destroy(ref1);
}

static void test_pin_headroom(void **state) {
    (void)state;
    ks_kv_store *kv = make_store(1, 2);
    fill(kv, 0, 0, 3 * P + 1);
    int32_t a, b, c;
    assert_int_equal(ks_kv_pin(kv, 0, 0, 0, 0, &a), KS_OK);
    assert_int_equal(ks_kv_pin(kv, 0, 0, 0, 0, &b), KS_OK); /* the same page again: no new headroom */
    assert_int_equal(a, b);
    assert_int_equal(ks_kv_pin(kv, 0, 0, 0, 1, &b), KS_OK);
    assert_int_equal(ks_kv_pin(kv, 0, 0, 0, 2, &c), KS_ERR_NOMEM);
    assert_int_equal(ks_kv_pin(kv, 0, 0, 0, 3, &c), KS_ERR_UNSUPPORTED); /* not full */
    ks_kv_unpin(kv, 0, a);
    ks_kv_unpin(kv, 0, a);
    ks_kv_unpin(kv, 0, b);
    ks_kv_destroy(kv);
}

static void test_tier_and_park(void **state) {
    (void)state;
    ks_kv_store *kv = make_store(2, 2 * NH * NL);
    ks_kv_store *ref = make_store(1, 0);
    enum { NP = 2 };
    int32_t ids[NL * NH * NP];
    fill(kv, 0, 0, NP * P + 5);
    fill(ref, 0, 0, NP * P + 5);
    pin_all(kv, 0, NP, ids);
    map_all(kv, 1, NP, ids);
    fill(kv, 1, NP * P, NP * P + 5);
    /* park the sharer and bring it back: byte for byte, the other untouched */
    assert_int_equal(ks_kv_seq_park(kv, 1), KS_OK);
    assert_same(kv, 0, ref, 0);
    assert_int_equal(ks_kv_seq_unpark(kv, 1), KS_OK);
    assert_same(kv, 1, ref, 0);
    /* map again after a clear, then move layer 1 to the slow tier and back */
    ks_kv_seq_clear(kv, 1);
    map_all(kv, 1, NP, ids);
    fill(kv, 1, NP * P, NP * P + 5);
    assert_int_equal(ks_kv_set_layer_tier(kv, 1, KS_TIER_SLOW), KS_OK);
    for (int lp = 0; lp < NP; lp++) assert_int_equal(ks_kv_page_refs(kv, 1, 1, 0, lp), 1); /* unshared */
    assert_int_equal(ks_kv_page_refs(kv, 1, 0, 0, 0), 2); /* the fast layer still shares */
    assert_int_equal(ks_kv_map_pinned(kv, 1, 1, 0, ids[(1 * NH + 0) * NP]), KS_ERR_UNSUPPORTED);
    assert_same(kv, 0, ref, 0);
    assert_same(kv, 1, ref, 0);
    assert_int_equal(ks_kv_set_layer_tier(kv, 1, KS_TIER_FAST), KS_OK);
    assert_same(kv, 0, ref, 0);
    assert_same(kv, 1, ref, 0);
    ks_kv_seq_clear(kv, 0);
    ks_kv_seq_clear(kv, 1);
    unpin_all(kv, NP, ids);
    fill(kv, 0, 0, CTX);
    fill(kv, 1, 0, CTX);
    ks_kv_destroy(kv);
    ks_kv_destroy(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_extend_compact),
        cmocka_unit_test(test_pin_headroom),
        cmocka_unit_test(test_tier_and_park),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
