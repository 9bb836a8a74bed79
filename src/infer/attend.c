/*
 * attend.c — the attention of one layer: every (row, KV head) of the step
 * becomes a task, and workers take tasks from an atomic counter.
 *
 * A task processes a whole GQA group (the G query heads that share a KV
 * head), so each K/V row is converted once and used G times, and
 * long-context decode reads each selected entry exactly once per step.  At a
 * decode step the policy is asked for its selection inside the task, which
 * runs selection in parallel with attention instead of before it; a layer in
 * the slow tier then fetches the selected entries into its elastic buffer
 * (or, past the buffer, gathers whole pages: a counted fallback),
 * and a policy's hint for the next step starts loading before the task ends,
 * overlapping the rest of the step.
 *
 * A prefill chunk of one sequence takes the blocked kernel instead: tasks are
 * (block of KS_PREFILL_BLOCK rows, KV head), and each page is read once per
 * block rather than once per row.  On AVX-512 BF16 hosts (f16 or Q8_0 KV,
 * head dims that are multiples of 32) that kernel is the bf16 one with an
 * online softmax (attn_block_bf16.c); KS_ATTN=f32 keeps the f32 kernels, which
 * reproduce the decode kernel's bits (f16) or dequantise pages to f32 (Q8_0).
 * When a block cannot run (a shape the kernel does not take, a failed read)
 * its rows fall back to the per-row path, which reports any error.
 *
 * Failures inside the parallel section are recorded once (the first wins)
 * and returned after the join.
 */
#include "infer/internal.h"

#include "core/simd.h"
#include "policy/policy_util.h" /* ks_topk_scratch: the turnover probe's oracle */

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

typedef struct {
    ks_context *c;
    int il, n;
    const int32_t *seq, *pos;
    bool sparse;          /* a decode step: each row's policy may select (ks_infer_seq_sparse) */
    int align;            /* rows of the first block before the chunk's first row (sparse prefill) */
    bool blocked;         /* prefill of one sequence: blocks of rows per task */
    atomic_int next;
    const ks_weight *wnext; /* or NULL: quantize each finished row for this weight's product */
    int parts;              /* tasks per (row, KV head): 2 when a decode step splits its query heads */
    struct attn_split *split; /* [rows x KV heads] when parts == 2 */
} attn_job;

/* A decode step with fewer (row, KV head) tasks than threads, on a wide
 * group (latent attention: one KV head, 16 query heads), would leave the
 * other threads idle through the layer's attention, which at 32K is most of
 * the step.  Its query heads are then two halves, each a task: the first
 * (attend_one) selects, plans and publishes the runs, attends the lower half
 * and waits for the upper; the second (split_upper) waits for the runs and
 * attends the upper half.  Whichever of the two claims the upper half first
 * runs it, so one thread alone, or a second that arrives late, still
 * finishes it.  The halves are the same kernel calls whether or not another
 * thread takes one (split_heads), so the bits never depend on the threads. */
typedef struct attn_split {
    atomic_int state;   /* 0: not yet planned; 1: runs published, upper half to run; 2: none (done by the first) */
    atomic_int claimed; /* the upper half taken */
    atomic_int done;    /* the upper half finished */
    const ks_kv_seg *segs;
    int nseg, total;
    const float *q, *sinks; /* q, sinks: the group's; NULL sinks: none */
    float *o;
} attn_split;
enum { ATTN_SPLIT_MAX = 16 }; /* (row, KV head) tasks a step splits at most: fewer than the threads */

static void record_failure(ks_context *c, ks_status st) {
    if (!atomic_flag_test_and_set(&c->step_failed)) c->step_status = st;
}

/* Latent attention's value rows hold its key rows' values (infer/mla.c):
 * the kernels read them from the K side, so a step reads each attended
 * latent once, and its bytes are the selected latents' alone. */
static void values_from_keys(const ks_context *c, ks_kv_seg *segs, int32_t nseg) {
    if (c->model->hp.kv_lora_rank <= 0) return;
    for (int32_t i = 0; i < nseg; i++) segs[i].V = segs[i].K;
}

/* The dense attention weights of entries [0, n) of (seq, il, h), summed
 * over the group's query heads, into s->weights (the probes' one dense pass
 * over the head's resident pages; s->segs, first, pages, scores are spent). */
static void dense_weights(ks_context *c, ks_attn_scratch *s, int32_t seq, int il, int h, int32_t n, const float *q) {
    const ks_hparams *hp = &c->model->hp;
    int G = hp->n_head / hp->n_head_kv;
    int32_t np, total;
    int32_t nseg = ks_infer_segs_plan(NULL, n, c->params.page, s->segs, s->first, s->pages, &np, &total);
    (void)ks_infer_segs_resolve(c->kv, seq, il, h, s->segs, s->first, nseg, s->pages, NULL); /* in place: cannot fail */
    values_from_keys(c, s->segs, nseg);
    memset(s->weights, 0, sizeof(float) * (size_t)n);
    ks_attention_segs(c->kv_type, s->segs, nseg, n, hp->head_dim, G, q, s->scores, s->probe_out, s->tmp, s->weights,
                      true);
}

/* The share of the dense attention mass that the mask covers (eval's recall
 * probe). */
static double recall_of_mask(ks_context *c, ks_attn_scratch *s, int32_t seq, int il, int h, int32_t n,
                             const float *q, const uint64_t *mask, bool have_weights) {
    if (!have_weights) dense_weights(c, s, seq, il, h, n, q);
    double in = 0, tot = 0;
    for (int32_t e = 0; e < n; e++) {
        tot += s->weights[e];
        if (mask[e >> 6] >> (e & 63) & 1) in += s->weights[e];
    }
    return tot > 0 ? in / tot : 1.0;
}

/* The turnover probe (ks_context_set_turnover_probe) for (seq, il, h): the
 * entries of this step's selection (mask over [0, n)) that the previous
 * step's lacked, which is what elastic loading copies, against the same
 * count for an oracle that selects the true top-T of this step's dense
 * attention weights, T = this step's selected count: a selector cannot
 * move less than its target's own attention turns over at equal size. */
static void turnover_of(ks_context *c, ks_attn_scratch *s, int32_t seq, int il, int h, int32_t n, const float *q,
                        const uint64_t *mask) {
    const ks_hparams *hp = &c->model->hp;
    size_t slot = ((size_t)seq * hp->n_layer + (size_t)il) * hp->n_head_kv + (size_t)h, W = c->turn_words;
    uint64_t *pol = c->turn_pol + slot * W, *orc = c->turn_orc + slot * W, *cnt = c->turn_cnt + 3 * slot;
    size_t nw = ((size_t)n + 63) / 64;
    uint64_t tail = n % 64 ? (1ull << (n % 64)) - 1 : ~0ull, pm = 0, om = 0;
    int32_t T = 0;
    for (size_t w = 0; w < W; w++) {
        uint64_t m = w < nw ? mask[w] & (w + 1 == nw ? tail : ~0ull) : 0;
        T += __builtin_popcountll(m);
        pm += (uint64_t)__builtin_popcountll(m & ~pol[w]);
        pol[w] = m;
    }
    dense_weights(c, s, seq, il, h, n, q);
    int32_t k = ks_topk_scratch(s->weights, n, T, s->entries, s->scores); /* the group's scores are spent */
    for (int32_t i = 0; i < k; i++) om += !(orc[s->entries[i] >> 6] >> (s->entries[i] & 63) & 1);
    memset(orc, 0, sizeof(uint64_t) * W);
    for (int32_t i = 0; i < k; i++) orc[s->entries[i] >> 6] |= 1ull << (s->entries[i] & 63);
    if (c->turn_have[slot]) { /* the first step only sets the baseline */
        cnt[0] += pm;
        cnt[1] += om;
        cnt[2] += (uint64_t)T;
    }
    c->turn_have[slot] = 1;
}

/* The step's shared plan of (seq, h) when its policy selects the same
 * entries in every layer and this layer holds every position (n == pos + 1:
 * no prefill eviction made the layers differ); NULL otherwise.  Each
 * (seq, h) is one task per layer and layers run one after another, so the
 * buffers need no lock. */
static ks_step_plan *shared_plan(ks_context *c, const ks_policy *pol, int32_t seq, int h, int32_t n, int32_t pos) {
    if (!c->decoding || c->plan_per_layer || n != pos + 1 || !ks_policy_same_every_layer(pol)) return NULL;
    ks_step_plan *pl = &c->step_plans[(size_t)seq * c->model->hp.n_head_kv + h];
    if (!pl->mask) {
        size_t n_ctx = (size_t)c->n_ctx, max_pages = (n_ctx + c->params.page - 1) / c->params.page;
        pl->mask = ks_malloc(sizeof(uint64_t) * (n_ctx / 64 + 2));
        pl->first = ks_malloc(sizeof(int32_t) * (n_ctx + 1));
        pl->len = ks_malloc(sizeof(int32_t) * (n_ctx + 1));
        pl->pages = ks_malloc(sizeof(int32_t) * (max_pages + 1));
        if (!pl->mask || !pl->first || !pl->len || !pl->pages) { /* refused: nothing kept, the caller fails */
            ks_free(pl->mask);
            ks_free(pl->first);
            ks_free(pl->len);
            ks_free(pl->pages);
            *pl = (ks_step_plan){0};
            return NULL;
        }
    }
    return pl;
}

/* Speculative recall for the next step (the policy's hint: entries, or
 * whole pages), overlapped with the rest of this one.  Uses s->mask and
 * s->entries as scratch. */
static ks_status prefetch_next(ks_context *c, ks_attn_scratch *s, int32_t seq, int il, int h, const ks_selection *sel) {
    int32_t P = c->params.page, ne = ks_kv_n_entries(c->kv, seq, il, h);
    memset(s->mask, 0, sizeof(uint64_t) * ((size_t)ne / 64 + 1));
    for (int32_t i = 0; i < sel->n_next; i++) {
        int32_t a = sel->next_pages ? sel->next[i] * P : sel->next[i], b = sel->next_pages ? a + P : a + 1;
        a = a < 0 ? 0 : a;
        b = b > ne ? ne : b;
        for (int32_t t = a; t < b; t++) s->mask[t >> 6] |= 1ull << (t & 63);
    }
    int32_t m = ks_infer_mask_entries(s->mask, ne, s->entries);
    if (m <= ks_kv_buffer_entries(c->kv)) KS_TRY(ks_kv_fetch(c->kv, seq, il, h, s->entries, m, true));
    return KS_OK;
}

/* Whether this run's decode attends a group of G heads as two halves (the
 * wide kernel's conditions for G / 2 heads: attn_avx512_wide.c). */
static bool split_heads(const ks_context *c, int G) {
    const ks_hparams *hp = &c->model->hp;
    return c->kv_type == KS_KV_F16 && ks_simd_current() == KS_SIMD_AVX512 && G >= 16 && G % 2 == 0 &&
           hp->head_dim % 32 == 0 && hp->head_dim <= 1024;
}

/* Heads [a, b) of the group over the runs. */
static void attend_heads(const ks_context *c, const ks_kv_seg *segs, int nseg, int total, int G, int a, int b,
                         const float *q, float *o, float *scores, float *tmp, float *w, const float *sinks) {
    int hd = c->model->hp.head_dim;
    ks_attention_segs_sinks(c->kv_type, segs, nseg, total, hd, b - a, q + (size_t)a * hd, scores, o + (size_t)a * hd,
                            tmp, w, true, sinks ? sinks + a : NULL);
    (void)G;
}

static void split_pause(int *spins) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if ((++*spins & 63) == 0) sched_yield(); /* let a descheduled peer run */
}

/* The second task of a split (row, KV head): the upper half, if the first
 * published runs and has not taken it itself. */
static void split_upper(ks_context *c, ks_attn_scratch *s, attn_split *sp) {
    if (atomic_exchange_explicit(&sp->claimed, 1, memory_order_acq_rel)) return;
    int st, spins = 0;
    while ((st = atomic_load_explicit(&sp->state, memory_order_acquire)) == 0) split_pause(&spins);
    if (st == 1) {
        int G = c->model->hp.n_head / c->model->hp.n_head_kv;
        attend_heads(c, sp->segs, sp->nseg, sp->total, G, G / 2, G, sp->q, sp->o, s->scores, s->tmp, NULL, sp->sinks);
    }
    atomic_store_explicit(&sp->done, 1, memory_order_release);
}

/* One (row, KV head): selection (decode, sparse layers), segments, kernel. */
static ks_status attend_one(ks_context *c, attn_job *j, ks_attn_scratch *s, int r, int h, attn_split *sp) {
    const ks_hparams *hp = &c->model->hp;
    int G = hp->n_head / hp->n_head_kv, hd = hp->head_dim;
    int32_t seq = j->seq[r], n = c->n_att[(size_t)r * hp->n_head_kv + h];
    const float *q = c->q + ((size_t)r * hp->n_head + (size_t)h * G) * hd;
    float *o = c->att + ((size_t)r * hp->n_head + (size_t)h * G) * hd;
    ks_select_req req = {.row = r, .seq = seq, .layer = j->il, .head = h, .pos = j->pos[r], .n_entries = n, .q = q};
    ks_selection sel = {0};
    bool all = true; /* the policy still sees the weights when everything is attended */
    ks_policy *pol = ks_infer_policy_of(c, seq); /* this row's own policy */
    bool sparse = j->sparse && ks_infer_seq_sparse(c, seq, j->il);
    bool slow = ks_kv_layer_tier(c->kv, j->il) == KS_TIER_SLOW;
    const uint64_t *mask = s->mask;
    const int32_t *first = s->first, *pages = s->pages;
    ks_step_plan *plan = NULL; /* the step's plan of (seq, h), made by an earlier layer or to be made here */
    bool planned = false;
    if (sparse && ks_infer_budget_binds(c, seq, n)) {
        plan = shared_plan(c, pol, seq, h, n, j->pos[r]);
        if (!plan && c->decoding && !c->plan_per_layer && n == j->pos[r] + 1 && ks_policy_same_every_layer(pol))
            return KS_FAIL(KS_ERR_NOMEM, "the step's plan of sequence %d head %d", seq, h);
        if (plan && plan->step == c->step_serial && plan->n == n) {
            planned = true;
            all = plan->all;
            mask = plan->mask;
        } else {
            KS_TRY(ks_infer_select(c, s, &req, &sel, slow, &s->select_seconds));
            all = sel.all;
        }
    }
    /* a real selection of a resident head that holds every position (no prefill eviction);
     * it leaves the dense weights in s->weights for the recall probe */
    bool turn = c->turnover_probe && c->decoding && sparse && !all && !slow && n == j->pos[r] + 1 &&
                c->model->layers[j->il].window == 0;
    if (turn) turnover_of(c, s, seq, j->il, h, n, q, mask);
    /* after a prefill eviction the evicted entries are gone: no dense mass to compare with */
    if (c->recall_probe && c->decoding && n == j->pos[r] + 1 && (all || !slow)) {
        size_t slot = (size_t)j->il * hp->n_head_kv + (size_t)h;
        const double rec = all ? 1.0 : recall_of_mask(c, s, seq, j->il, h, n, q, mask, turn);
        s->recall_sum[slot] += (uint64_t)llround(rec * KS_RECALL_ONE);
        s->recall_n[slot]++;
    }
    int32_t npages, total, nseg;
    double tg = ks_time_sec(); /* the segment walk and any staging copy: the gather share */
    if (planned) { /* the runs of the first sparse layer; only the pointers are this layer's */
        nseg = plan->nseg;
        npages = plan->npages;
        total = plan->total;
        first = plan->first;
        pages = plan->pages;
        for (int32_t i = 0; i < nseg; i++) s->segs[i].len = plan->len[i];
    } else {
        /* a local layer never selects: its window, densely */
        nseg = ks_infer_segs_plan_from(all ? NULL : s->mask, ks_infer_window_lo(c, j->il, n), n, c->params.page, s->segs,
                                       s->first, s->pages, &npages, &total);
        if (plan) {
            plan->step = c->step_serial;
            plan->n = n;
            plan->all = all;
            plan->nseg = nseg;
            plan->npages = npages;
            plan->total = total;
            if (!all) memcpy(plan->mask, s->mask, sizeof(uint64_t) * ((size_t)n / 64 + 1));
            memcpy(plan->first, s->first, sizeof(int32_t) * (size_t)nseg);
            for (int32_t i = 0; i < nseg; i++) plan->len[i] = s->segs[i].len;
            memcpy(plan->pages, s->pages, sizeof(int32_t) * (size_t)npages);
        }
    }
    KS_ASSERT(total > 0 && total <= n);
    uint8_t *gather = NULL;
    bool buffered = false;
    if (slow) {
        /* prefill rows share their sequence's buffer, which forward_rows
         * loaded before the parallel section when every entry fits; a decode
         * row owns (seq, h) and fetches what it reads: the prefetch queued
         * most of it, the rest (the entry this step appended) loads here */
        int32_t need = c->decoding ? total : ks_kv_n_entries(c->kv, seq, j->il, h);
        if (!(gather = ks_infer_gather_buffer(c, s)))
            return KS_FAIL(KS_ERR_NOMEM, "gather buffer for a slow-tier layer refused");
        if (need > ks_kv_buffer_entries(c->kv)) {
            if (c->decoding) ks_kv_note_sync_fallback(c->kv);
        } else {
            if (c->decoding) {
                int32_t m = ks_infer_mask_entries(all ? NULL : mask, n, s->entries);
                double tf = ks_time_sec(); /* waiting on the slow tier is not gathering */
                KS_TRY(ks_kv_fetch(c->kv, seq, j->il, h, s->entries, m, false));
                tg += ks_time_sec() - tf;
            }
            buffered = true;
        }
    }
    if (buffered)
        KS_TRY(ks_infer_segs_resolve_buffered(c->kv, seq, j->il, h, s->segs, first, nseg, gather,
                                              ks_infer_gather_entries(c), &s->gather_bytes));
    else KS_TRY(ks_infer_segs_resolve(c->kv, seq, j->il, h, s->segs, first, nseg, pages, gather));
    values_from_keys(c, s->segs, nseg);
    s->gather_seconds += ks_time_sec() - tg;
    bool want_w = sparse && ks_policy_wants_weights(pol);
    float *w = NULL;
    if (want_w) { /* the entry of each attended row, for after_attention */
        for (int32_t i = 0, t = 0; i < nseg; i++)
            for (int32_t k = 0; k < s->segs[i].len; k++) s->entries[t++] = first[i] + k;
        w = s->weights;
        memset(w, 0, sizeof(float) * (size_t)total);
    }
    const float *sinks = c->model->layers[j->il].attn_sinks; /* gpt-oss: never selected away (attn.h) */
    if (sinks) sinks += (size_t)h * G;
    if (!split_heads(c, G)) {
        ks_attention_segs_sinks(c->kv_type, s->segs, nseg, total, hd, G, q, s->scores, o, s->tmp, w, true, sinks);
    } else if (sp && !want_w) { /* the upper half to another thread, if one takes it (attn_split) */
        sp->segs = s->segs; /* the second part reads them until it reports done */
        sp->nseg = nseg;
        sp->total = total;
        sp->q = q;
        sp->sinks = sinks;
        sp->o = o;
        atomic_store_explicit(&sp->state, 1, memory_order_release);
        for (int spins = 0; c->split_wait && !atomic_load_explicit(&sp->claimed, memory_order_acquire);)
            split_pause(&spins);
        attend_heads(c, s->segs, nseg, total, G, 0, G / 2, q, o, s->scores, s->tmp, NULL, sinks);
        if (!atomic_exchange_explicit(&sp->claimed, 1, memory_order_acq_rel))
            attend_heads(c, s->segs, nseg, total, G, G / 2, G, q, o, s->scores, s->tmp, NULL, sinks);
        else
            for (int spins = 0; !atomic_load_explicit(&sp->done, memory_order_acquire);) split_pause(&spins);
    } else { /* both halves here: the same calls, so the same bits */
        attend_heads(c, s->segs, nseg, total, G, 0, G / 2, q, o, s->scores, s->tmp, w, sinks);
        attend_heads(c, s->segs, nseg, total, G, G / 2, G, q, o, s->scores, s->tmp, w, sinks);
    }
    if (want_w) ks_policy_after_attention(pol, &req, s->entries, w, total);
    s->entries_attended += (uint64_t)total;
    if (slow && sel.n_next > 0) KS_TRY(prefetch_next(c, s, seq, j->il, h, &sel));
    return KS_OK;
}

/* The prefill block kernel for this KV type and head dim at the current
 * level; a property of the run (CPU, KV type, head dim, KS_ATTN), never of
 * the block, so every row of every chunk takes the same arithmetic.  The
 * x86 and ARM levels are told apart explicitly: the ARM levels compare
 * above the x86 ones (kvsieve_tools.h). */
typedef enum { BLK_NONE, BLK_BF16, BLK_AVX512, BLK_AVX2, BLK_NEON } blk_kernel;
static blk_kernel block_kernel(ks_kv_type kt, int hd) {
    const ks_simd_level lv = ks_simd_current();
    if (!(kt == KS_KV_F16 || hd % 32 == 0) || hd % 16) return BLK_NONE;
    if (lv >= KS_SIMD_NEON) return BLK_NEON;
    if (!ks_simd_x86(lv)) return BLK_NONE;
    /* AVX-512 BF16 hosts: the bf16 kernel with its online softmax (no score matrix); heads over 512
     * (MLA's latents) only when asked for (ks_attention_block_bf16_wide: their rounding costs more) */
    if (lv == KS_SIMD_AVX512 && hd % 32 == 0 && ks_attention_block_bf16_usable() &&
        (hd <= 512 || (hd <= KS_ATTN_BF16_MAX_HD && ks_attention_block_bf16_wide())))
        return BLK_BF16;
    return kt == KS_KV_F16 && lv == KS_SIMD_AVX512 ? BLK_AVX512 : BLK_AVX2;
}

const char *ks_attention_block_kernel_name(ks_kv_type kt, int hd) {
    static const char *const names[] = {NULL, "bf16", "avx512", "avx2", "neon"};
    return names[block_kernel(kt, hd)];
}

/* Prefill rows r0..r0+R-1 (one sequence, consecutive) of KV head h as one
 * block: every page is read once for the block.  false: use attend_one. */
static bool attend_block(ks_context *c, attn_job *j, ks_attn_scratch *s, int r0, int R, int h) {
    const ks_hparams *hp = &c->model->hp;
    int G = hp->n_head / hp->n_head_kv, hd = hp->head_dim, nkv = hp->n_head_kv;
    int32_t P = c->params.page, seq = j->seq[r0];
    int32_t n_att[KS_PREFILL_BLOCK];
    for (int r = 0; r < R; r++) n_att[r] = c->n_att[(size_t)(r0 + r) * nkv + h];
    const blk_kernel kern = block_kernel(c->kv_type, hd);
    const bool bf16 = kern == BLK_BF16;
    if (bf16 && !s->blk_bf16) s->blk_bf16 = ks_malloc(sizeof(float) * ks_attention_block_bf16_scratch(KS_PREFILL_BLOCK, G, hd));
    if (!bf16 && !s->blk_S) s->blk_S = ks_malloc(sizeof(float) * (size_t)KS_PREFILL_BLOCK * G * c->n_ctx);
    if (!bf16 && !s->blk_tile) s->blk_tile = ks_malloc(sizeof(float) * (size_t)(P + 16) * hd); /* + 16: a K page transposed, keys padded to 16 */
    if (bf16 ? !s->blk_bf16 : (!s->blk_S || !s->blk_tile)) { /* fail the rows rather than take attend_one's other arithmetic */
        record_failure(c, KS_FAIL(KS_ERR_NOMEM, "prefill block scores of %d entries", c->n_ctx));
        return true;
    }
    /* a slow-tier layer: its pages are in the slots (forward_rows loaded them) or gathered here */
    uint8_t *gather = NULL;
    bool slow = ks_kv_layer_tier(c->kv, j->il) == KS_TIER_SLOW;
    bool buffered = slow && ks_kv_n_entries(c->kv, seq, j->il, h) <= ks_kv_buffer_entries(c->kv);
    if (slow && !(gather = ks_infer_gather_buffer(c, s))) return false;
    const float *q = c->q + ((size_t)r0 * hp->n_head + (size_t)h * G) * hd;
    float *o = c->att + ((size_t)r0 * hp->n_head + (size_t)h * G) * hd;
    size_t qo_stride = (size_t)hp->n_head * hd;
    /* the opt-in sparse prefill (prefill_sparse.c): sinks, window and the top pages, counts within those runs */
    int32_t np, total, n_sparse[KS_PREFILL_BLOCK];
    int32_t nseg = ks_prefill_sparse_plan(c, s, seq, j->il, h, q, qo_stride, R, n_att, n_sparse, &np, &total);
    if (nseg >= 0) memcpy(n_att, n_sparse, sizeof(int32_t) * (size_t)R);
    else nseg = ks_infer_segs_plan(NULL, n_att[R - 1], P, s->segs, s->first, s->pages, &np, &total);
    if (buffered) {
        if (ks_infer_segs_resolve_buffered(c->kv, seq, j->il, h, s->segs, s->first, nseg, gather,
                                           ks_infer_gather_entries(c), &s->gather_bytes) != KS_OK)
            return false;
    } else if (ks_infer_segs_resolve(c->kv, seq, j->il, h, s->segs, s->first, nseg, s->pages, gather) != KS_OK)
        return false; /* attend_one reports it */
    values_from_keys(c, s->segs, nseg);
    float scale = 1.0f / sqrtf((float)hd);
    const float *sinks = c->model->layers[j->il].attn_sinks; /* gpt-oss: bf16 only (ks_infer_attend_layer) */
    bool done = bf16 ? ks_attention_block_bf16_sinks(c->kv_type, s->segs, nseg, n_att, R, hd, G, q, qo_stride, o,
                                                     qo_stride, s->blk_bf16, scale, sinks ? sinks + (size_t)h * G : NULL)
                : kern == BLK_AVX512
                    ? ks_attention_block_avx512((const ks_kv_seg16 *)s->segs, nseg, n_att, R, hd, G, q, qo_stride, o,
                                                qo_stride, s->blk_S, s->blk_tile, scale)
                : kern == BLK_NEON
                    ? ks_attention_block_neon(c->kv_type, s->segs, nseg, n_att, R, hd, G, q, qo_stride, o, qo_stride,
                                              s->blk_S, s->blk_tile, scale)
                    : ks_attention_block_avx2(c->kv_type, s->segs, nseg, n_att, R, hd, G, q, qo_stride, o, qo_stride,
                                              s->blk_S, s->blk_tile, scale);
    if (!done) return false;
    for (int r = 0; r < R; r++) s->entries_attended += (uint64_t)n_att[r];
    return true;
}

static void attn_worker(void *arg, int ith, int nth) {
    attn_job *j = arg;
    ks_context *c = j->c;
    int nkv = c->model->hp.n_head_kv;
    ks_attn_scratch *s = &c->scr[ith];
    /* tasks are (block of rows, KV head) when blocked, else (row, KV head), each in j->parts
     * consecutive parts (the first part of a pair is always handed out first) */
    int rows_per_task = j->blocked ? KS_PREFILL_BLOCK : 1;
    int total = (j->align + j->n + rows_per_task - 1) / rows_per_task * nkv * j->parts;
    for (;;) {
        int task = atomic_fetch_add(&j->next, 1);
        if (task >= total) break;
        int part = task % j->parts;
        attn_split *sp = j->parts > 1 ? &j->split[task / j->parts] : NULL;
        if (part == 1) {
            split_upper(c, s, sp);
            continue;
        }
        task /= j->parts;
        int g = task / nkv, h = task % nkv;
        int r0 = g * rows_per_task - j->align, r1 = r0 + rows_per_task;
        if (r0 < 0) r0 = 0;
        if (r1 > j->n) r1 = j->n;
        int R = r1 - r0;
        if (!(j->blocked && attend_block(c, j, s, r0, R, h)))
            for (int r = r0; r < r0 + R; r++) {
                ks_status st = attend_one(c, j, s, r, h, sp);
                if (st != KS_OK) record_failure(c, st);
            }
        if (sp) { /* a failed or unsplit row: release the second part */
            int zero = 0;
            atomic_compare_exchange_strong_explicit(&sp->state, &zero, 2, memory_order_release, memory_order_relaxed);
        }
        /* the rows' last head: whoever wrote it quantizes them for the next product while they
         * are in cache (the counter's acq_rel RMWs order the other heads' writes before it) */
        if (j->wnext && atomic_fetch_add_explicit(&c->att_heads_done[task / nkv], 1, memory_order_acq_rel) == nkv - 1) {
            size_t q_dim = (size_t)c->model->hp.n_head * c->model->hp.head_dim;
            for (int r = r0; r < r0 + R; r++) ks_matmul_quantize_x(j->wnext, c->att + (size_t)r * q_dim, r, c->mm_scratch);
        }
    }
    (void)nth;
}

ks_status ks_infer_attend_layer(ks_context *c, int il, int n, const int32_t *seq, const int32_t *pos, bool sparse,
                                const ks_weight *next) {
    int hd = c->model->hp.head_dim;
    attn_job job = {.c = c, .il = il, .n = n, .seq = seq, .pos = pos, .sparse = sparse, .wnext = next};
    /* prefill chunks of one sequence take the blocked kernel (f16, or 8-bit KV in whole Q8_0 blocks),
     * a chunk of one row too: a row's result then never depends on the chunk it falls in (a
     * one-row chunk through the decode kernel rounded differently), which a prefix-cache hit
     * that ends anywhere relies on (infer/prefix.c) */
    job.blocked = !c->decoding && seq[0] == seq[n - 1] && block_kernel(c->kv_type, hd) != BLK_NONE;
    /* a local layer's rows each start their own window, which the blocked kernels (a causal
     * bound per row only) do not take: every row goes through attend_one, at prefill and
     * decode alike, so a row's bits never depend on the chunk it falls in */
    if (c->model->layers[il].window > 0) job.blocked = false;
    /* of the blocked kernels only the bf16 one has attention sinks (gpt-oss): elsewhere those
     * layers' rows take attend_one too (the choice is the run's, as attend_block's bf16 one) */
    if (c->model->layers[il].attn_sinks && block_kernel(c->kv_type, hd) != BLK_BF16) job.blocked = false;
    /* a sparse prefill's blocks start at entries that are multiples of KS_PREFILL_BLOCK,
     * wherever the chunk starts: a block's selection is shared by its rows, so a row's
     * KV depends on the block it falls in, and with blocks on one grid it depends on the
     * tokens up to its block's end alone, whatever the chunking or a prefix-cache hit
     * (which the cache's sparse keys rely on: infer/prefix_context.c); the first
     * block may be short.  Dense rows do not depend on their block (no selection). */
    if (job.blocked && c->seq_prefill[seq[0]].on) job.align = (c->n_att[0] - 1) % KS_PREFILL_BLOCK;
    /* a decode step whose (row, KV head) tasks leave threads idle, on a wide group: halves (attn_split) */
    attn_split split[ATTN_SPLIT_MAX];
    int G = c->model->hp.n_head / c->model->hp.n_head_kv, nkv = c->model->hp.n_head_kv;
    job.parts = 1;
    if (c->decoding && !job.blocked && split_heads(c, G) && n * nkv < ks_pool_size(c->pool) &&
        n * nkv <= ATTN_SPLIT_MAX) {
        job.parts = 2;
        job.split = split;
        for (int i = 0; i < n * nkv; i++) {
            atomic_init(&split[i].state, 0);
            atomic_init(&split[i].claimed, 0);
            atomic_init(&split[i].done, 0);
        }
    }
    atomic_init(&job.next, 0);
    if (next) /* one counter per task row group (a block of rows, or a row) */
        for (int g = 0; g < n; g++) atomic_init(&c->att_heads_done[g], 0);
    atomic_flag_clear(&c->step_failed);
    ks_pool_run(c->pool, attn_worker, &job);
    if (atomic_flag_test_and_set(&c->step_failed)) return c->step_status;
    atomic_flag_clear(&c->step_failed);
    return KS_OK;
}
