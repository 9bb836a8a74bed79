/*
 * spec_head.c — SpeContext's retrieval head at work: its keys and queries,
 * its own K cache, and each step's selection; p_spec.c is the policy
 * around it (arguments, loading, the framework's hooks).
 *
 * Why apart: this is the part that costs time (the projections once a
 * step, the scoring of every cached key), so it is kept where its buffers,
 * kernels and threading can be read together, away from the policy glue.
 *
 * The head keeps its own full K cache (one layer) indexed by position, Q8_0
 * rows by default (`kcache=f16` for f16 rows): at long contexts that cache
 * is most of the bytes a selection reads (32K positions x 8 KV heads x 64
 * dims are 33.5 MB of f16 against the projections' 24.5 MB of Q8_0, 18.9 of Q6_K), and
 * 8-bit keys halve it at the cost of the keys' rounding in the scores, which
 * kvsieve eval measures as noise (docs/results/POLICIES.md, "Deviations").
 * Prompt keys are computed from the hidden states the framework captures
 * during prefill (on_hidden), batched through ks_matmul; a decode step's key
 * is computed in before_step together with its query.  Scores for each
 * (row, KV head) run in parallel on the context's pool, through the kernels
 * of spec_score.c (AVX-512 or AVX2 where the CPU has them: scoring and
 * softmax are nearly all of a step at long contexts, scalar code is ~30x
 * slower); at batch 1 the projections are spec_proj.c's (four rows'
 * FMA chains side by side, q and k in one dispatch, bit for bit
 * ks_matmul's), and the group reduction feeds the top-k's sampled filter
 * directly (ks_spec_group_topk: the same indices).  Positions map to
 * the target's entries directly unless a prefill evictor ran (dapq+spec),
 * in which case each layer/head translates positions through its page
 * metadata (p_spec.c, entry_of).
 */
#include "spec/spec_head.h"
#include "spec/spec_proj.h"
#include "spec/spec_score.h"

#include "core/simd.h"
#include "matmul/matmul.h"
#include "tensor/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

ks_status ks_spec_dtype_of(const ks_eagle3_mat *m, ks_dtype *out) {
    switch (m->dtype) {
    case KS_ST_F32: *out = KS_DTYPE_F32; return KS_OK;
    case KS_ST_F16: *out = KS_DTYPE_F16; return KS_OK;
    case KS_ST_BF16: *out = KS_DTYPE_BF16; return KS_OK;
    default: return KS_FAIL(KS_ERR_UNSUPPORTED, "DLM weights of type %s are not supported", ks_st_dtype_name(m->dtype));
    }
}

static bool grow_rows(spec_state *s, int32_t rows) {
    if (rows <= s->rows_cap) return true;
    ks_free_aligned(s->x);
    ks_free_aligned(s->f);
    ks_free_aligned(s->q);
    ks_free_aligned(s->k);
    ks_free_aligned(s->mm);
    s->rows_cap = rows;
    s->x = ks_malloc_aligned(sizeof(float) * (size_t)rows * 2 * s->H);
    s->f = ks_malloc_aligned(sizeof(float) * (size_t)rows * s->H);
    s->q = ks_malloc_aligned(sizeof(float) * (size_t)rows * s->Hq * s->hd);
    s->k = ks_malloc_aligned(sizeof(float) * (size_t)rows * s->Hkv * s->hd);
    size_t mm = ks_matmul_scratch_bytes(s->proj_q.type, 2 * s->H, rows);
    size_t m2 = ks_matmul_scratch_bytes(s->proj_k.type, 2 * s->H, rows);
    if (!s->embed_only) {
        size_t m3 = ks_matmul_scratch_bytes(s->proj_fc.type, (int64_t)s->n_aux * s->tH, rows);
        if (m3 > mm) mm = m3;
    }
    s->mm = ks_malloc_aligned((mm > m2 ? mm : m2) + 64);
    if (s->x && s->f && s->q && s->k && s->mm) return true;
    s->rows_cap = 0; /* refused: a later call tries again from nothing */
    return false;
}

static void embed(spec_state *s, int32_t tok, float *out) {
    if (s->dlm->has_embed && ks_eagle3_embed(s->dlm, tok, out) == KS_OK) return;
    const ks_weight *w = &s->env.tok_embd;
    ks_dequantize_row(w->type, (const uint8_t *)w->data + ks_dtype_row_bytes(w->type, s->H) * (size_t)tok, out, s->H);
}

/* Y[n][rows] = X[n][cols] W^T for one of the head's matrices, in its layout. */
static void project(spec_state *s, const ks_weight *w, const float *X, int32_t n, float *Y) {
    ks_matmul_weight(s->env.pool, w, X, n, Y, s->mm);
}

/* Rows: token, position, hidden of the previous position ([n_aux*tH] or
 * NULL = zeros).  Computes x for each row, then q (optional) and k in one
 * batched matmul each; q/k get norms and RoPE.  Results in s->q / s->k. */
static bool head_rows(spec_state *s, int32_t n, const int32_t *tok, const int32_t *pos, const float *const *h,
                      bool want_q) {
    float *cs = ks_scratch(KS_SCRATCH_POLICY2, sizeof(float) * (size_t)s->hd); /* [hd/2] cos, [hd/2] sin */
    if (!cs || !grow_rows(s, n)) return false;
    const ks_eagle3_config *c = &s->dlm->cfg;
    float *fin = NULL;
    if (!s->embed_only) {
        size_t w = (size_t)s->n_aux * s->tH;
        fin = ks_scratch(KS_SCRATCH_POLICY1, sizeof(float) * (size_t)n * w);
        if (!fin) return false;
        for (int32_t r = 0; r < n; r++) {
            if (h[r]) {
                memcpy(fin + r * w, h[r], sizeof(float) * w);
                ks_eagle3_fc_norm(s->dlm, fin + r * w); /* SpecForge's fc_norm (a no-op without) */
            } else {
                memset(fin + r * w, 0, sizeof(float) * w);
            }
        }
        if (n == 1 && ks_spec_proj_supported(s->proj_fc.type, (int64_t)w)) { /* a step: bit for bit ks_matmul's */
            ks_spec_proj_mat fc = {s->proj_fc.type, s->proj_fc.data, s->H, (int64_t)w, s->f};
            ks_spec_proj(s->env.pool, &fc, 1, fin);
        } else {
            project(s, &s->proj_fc, fin, n, s->f);
        }
    }
    for (int32_t r = 0; r < n; r++) {
        float *x = s->x + (size_t)r * 2 * s->H;
        embed(s, tok[r], s->emb);
        ks_rmsnorm(x, s->emb, s->dlm->input_norm, s->H, c->rms_eps);
        if (s->embed_only) {
            memset(x + s->H, 0, sizeof(float) * s->H);
        } else {
            float *f = s->f + (size_t)r * s->H;
            if (s->dlm->fc_bias)
                for (int i = 0; i < s->H; i++) f[i] += s->dlm->fc_bias[i];
            ks_rmsnorm(x + s->H, f, s->dlm->hidden_norm, s->H, c->rms_eps);
        }
    }
    if (n == 1 && ks_spec_proj_supported(s->proj_q.type, 2 * s->H) && ks_spec_proj_supported(s->proj_k.type, 2 * s->H)) {
        /* a step: q and k in one dispatch, bit for bit ks_matmul's (spec_proj.h) */
        ks_spec_proj_mat qk[2] = {{s->proj_k.type, s->proj_k.data, (int64_t)s->Hkv * s->hd, 2 * s->H, s->k},
                                  {s->proj_q.type, s->proj_q.data, (int64_t)s->Hq * s->hd, 2 * s->H, s->q}};
        ks_spec_proj(s->env.pool, qk, want_q ? 2 : 1, s->x);
    } else {
        if (want_q) project(s, &s->proj_q, s->x, n, s->q);
        project(s, &s->proj_k, s->x, n, s->k);
    }
    /* rotate_half RoPE (pairs (j, j + hd/2)), cos/sin scaled by mscale as in HF */
    float *sn = cs + s->hd / 2;
    for (int32_t r = 0; r < n; r++) {
        ks_rope_angles_freq(cs, sn, pos[r], s->hd, s->dlm->inv_freq, s->dlm->mscale);
        for (int g = 0; want_q && g < s->Hq; g++) {
            float *q = s->q + ((size_t)r * s->Hq + g) * s->hd;
            if (s->dlm->q_norm) ks_rmsnorm(q, q, s->dlm->q_norm, s->hd, c->rms_eps);
            ks_rope_apply(q, s->hd, true, cs, sn);
        }
        for (int g = 0; g < s->Hkv; g++) {
            float *k = s->k + ((size_t)r * s->Hkv + g) * s->hd;
            if (s->dlm->k_norm) ks_rmsnorm(k, k, s->dlm->k_norm, s->hd, c->rms_eps);
            ks_rope_apply(k, s->hd, true, cs, sn);
        }
    }
    return true;
}

static void store_keys(spec_state *s, int32_t n, const int32_t *seq, const int32_t *pos) {
    for (int32_t r = 0; r < n; r++) {
        for (int g = 0; g < s->Hkv; g++)
            ks_spec_kcache_store(s->kc_type, s->k + ((size_t)r * s->Hkv + g) * s->hd, s->hd, ks_spec_kc_at(s, seq[r], g, pos[r]));
        if (pos[r] + 1 > s->klen[seq[r]]) s->klen[seq[r]] = pos[r] + 1;
    }
}

void ks_spec_flush_pending(spec_state *s) {
    if (!s->n_pend) return;
    const float *h[SPEC_FLUSH];
    size_t w = (size_t)s->n_aux * s->tH;
    for (int32_t i = 0; i < s->n_pend; i++) h[i] = s->pend_pos[i] > 0 && w ? s->pend_h + i * w : NULL;
    if (!head_rows(s, s->n_pend, s->pend_tok, s->pend_pos, h, false)) {
        s->refused = true;
        s->n_pend = 0;
        return;
    }
    store_keys(s, s->n_pend, s->pend_seq, s->pend_pos);
    s->n_pend = 0;
}

const float *ks_spec_ring_get(spec_state *s, int32_t seq, int32_t pos) {
    if (pos < 0 || !s->n_aux) return NULL;
    int32_t slot = pos % SPEC_RING;
    if (s->ring_pos[(size_t)seq * SPEC_RING + slot] != pos) return NULL;
    return s->ring + ((size_t)seq * SPEC_RING + slot) * s->n_aux * s->tH;
}

/* The boundary slot of pos when pos ends a page (allocated on first use), else NULL. */
float *ks_spec_bnd_at(spec_state *s, int32_t seq, int32_t pos) {
    if (!s->n_aux || !s->env.kv) return NULL;
    if (!s->bnd_P) s->bnd_P = ks_kv_page_size(s->env.kv);
    int32_t P = s->bnd_P;
    if ((pos + 1) % P || pos >= s->env.n_ctx) return NULL;
    size_t w = (size_t)s->n_aux * s->tH, per = (size_t)s->env.n_ctx / P;
    if (!s->bnd) return NULL; /* allocated at create */
    return s->bnd + ((size_t)seq * per + (size_t)(pos / P)) * w;
}

/* weights=q8_0: fc, q_proj and k_proj as Q8_0 rows (the target's own
 * 8-bit format), so the once-a-step projections read about half the bytes
 * of bf16 / f16 weights (a quarter of f32).  weights=q6_k, q5_k, q4_k:
 * K-quant rows (0.82, 0.69, 0.56 bytes a weight against Q8_0's 1.06).
 * Each is then packed as the target's own weights of that type are
 * (ks_matmul_pack: Q8_0 panels on AVX-512, K-quant eight-row groups on
 * AVX-512 VNNI, Q4_K's on AVX2 too), so the head runs the kernels the
 * target's decode runs: the K-quants' one-row kernels are the slow ones
 * (a Q4_K_M 1B decode went from 20 to 39 tok/s with the groups,
 * docs/BENCHMARKS.md), while Q8_0's read at about the packed rate (perf
 * of a 32K spec step: the head's Q8_0 rows 1.8% of the CPU for 2.1% of
 * the bytes, its Q6_K groups 1.6% for 1.6%).  Every rounding moves the
 * projections, so the selection may differ slightly from the checkpoint's
 * precision; docs/results/EVAL.md has the measured effect. */
bool ks_spec_requantize_fits(const ks_eagle3 *dlm, bool embed_only, ks_dtype to) {
    int64_t b = ks_dtype_block_size(to);
    return b > 0 && dlm->wq.cols % b == 0 && dlm->wk.cols % b == 0 && (embed_only || dlm->fc.cols % b == 0);
}

ks_status ks_spec_requantize(spec_state *s, bool embed_only, ks_dtype to) {
    const ks_eagle3_mat *m[3] = {&s->dlm->wq, &s->dlm->wk, embed_only ? NULL : &s->dlm->fc};
    ks_weight *w[3] = {&s->proj_q, &s->proj_k, &s->proj_fc};
    const char *name = ks_dtype_name(to);
    KS_ASSERT(to == KS_DTYPE_Q8_0 || to == KS_DTYPE_Q6_K || to == KS_DTYPE_Q5_K || to == KS_DTYPE_Q4_K);
    if (!ks_spec_requantize_fits(s->dlm, embed_only, to))
        return KS_FAIL(KS_ERR_UNSUPPORTED, "spec weights=%s: a DLM matrix's columns are not whole %lld-column blocks",
                       name, (long long)ks_dtype_block_size(to));
    size_t total = 0, off[3] = {0};
    for (int i = 0; i < 3; i++) {
        if (!m[i]) continue;
        off[i] = total;
        total += ks_dtype_row_bytes(to, m[i]->cols) * (size_t)m[i]->rows;
    }
    s->own_w = ks_malloc(total);
    if (!s->own_w) return KS_FAIL(KS_ERR_NOMEM, "spec weights=%s: %zu bytes", name, total);
    float *row = NULL;
    size_t tiles = 0; /* the packed kernels' per-worker bytes */
    for (int i = 0; i < 3; i++) {
        if (!m[i]) continue;
        float *grown = ks_realloc(row, sizeof(float) * (size_t)m[i]->cols);
        if (!grown) {
            ks_free(row);
            return KS_FAIL(KS_ERR_NOMEM, "spec weights=%s: a row of %lld", name, (long long)m[i]->cols);
        }
        row = grown;
        size_t src_rb = ks_dtype_row_bytes(w[i]->type, m[i]->cols), dst_rb = ks_dtype_row_bytes(to, m[i]->cols);
        uint8_t *dst = (uint8_t *)s->own_w + off[i];
        for (int64_t r = 0; r < m[i]->rows; r++) {
            ks_dequantize_row(w[i]->type, (const uint8_t *)m[i]->data + (size_t)r * src_rb, row, m[i]->cols);
            ks_quantize_row(to, row, dst + (size_t)r * dst_rb, m[i]->cols);
        }
        ks_weight wt = {.type = to, .rows = m[i]->rows, .cols = m[i]->cols, .data = dst, .layout = KS_WEIGHT_ROWS};
        if (ks_matmul_can_pack(&wt)) { /* the target's decode layout: panels (Q8_0) or eight-row groups */
            ks_status st = ks_matmul_pack(&wt);
            if (st != KS_OK) {
                ks_free(row);
                return st;
            }
            size_t need = ks_matmul_worker_scratch_bytes(&wt);
            if (need > tiles) tiles = need;
        }
        *w[i] = wt;
    }
    ks_free(row);
    /* the groups' kernels take their tiles from every worker's kernel slot
     * and cannot report a refusal from inside the pool: grown here, on the
     * creating thread (which raises the process's mark) and on every worker */
    if (tiles) {
        if (!ks_scratch(KS_SCRATCH_KERNEL, tiles)) return KS_FAIL(KS_ERR_NOMEM, "spec weights=%s: %zu bytes of tiles", name, tiles);
        ks_pool_reserve_scratch(s->env.pool);
    }
    return KS_OK;
}

typedef struct {
    spec_state *s;
    const ks_step_info *step;
    int32_t n_select;
    ks_simd_level simd;
    _Atomic int next;
} spec_job;

static void select_worker(void *arg, int ith, int nth) {
    spec_job *j = arg;
    spec_state *s = j->s;
    int32_t n_ctx = s->env.n_ctx;
    float *sc = s->scr + (size_t)ith * (s->G + 1) * n_ctx, *w = sc + (size_t)s->G * n_ctx;
    int total = j->step->n * s->Hkv;
    for (;;) {
        int task = atomic_fetch_add(&j->next, 1);
        if (task >= total) break;
        int32_t r = task / s->Hkv, kvh = task % s->Hkv, seq = j->step->seq[r];
        int32_t n = s->klen[seq];
        const float *q = s->q + ((size_t)r * s->Hq + (size_t)kvh * s->G) * s->hd;
        float scale = 1.0f / sqrtf((float)s->hd);
        ks_spec_scores(q, ks_spec_kc_at(s, seq, kvh, 0), s->kc_type, n, s->hd, s->G, scale, sc, j->simd);
        /* per-head softmax, then the element-wise max over the group (as log
         * probabilities: the same ranking, a pass less), then the top-B
         * outside the framework's sinks and window (positions): a partial
         * selection (a radix select of the B-th value at long contexts,
         * O(n)); fused, so the weights are not written out first */
        int32_t lo = s->p.sink < n ? s->p.sink : n, hi = n - s->p.window > lo ? n - s->p.window : lo;
        int32_t *out = s->sel + ((size_t)seq * s->Hkv + kvh) * n_ctx;
        s->sel_n[(size_t)seq * s->Hkv + kvh] = ks_spec_group_topk(sc, s->G, n, lo, hi, j->n_select, out, w, j->simd);
    }
    (void)nth;
}

ks_status ks_spec_before_step(void *state, const ks_step_info *step) {
    spec_state *s = state;
    ks_spec_flush_pending(s);
    int32_t n = step->n;
    const float **h = ks_scratch(KS_SCRATCH_POLICY0, sizeof(float *) * (size_t)n);
    if (h)
        for (int32_t r = 0; r < n; r++) h[r] = ks_spec_ring_get(s, step->seq[r], step->pos[r] - 1);
    if (s->refused || !h || !head_rows(s, n, step->token, step->pos, h, true)) {
        s->refused = false;
        return KS_FAIL(KS_ERR_NOMEM, "spec: key rows of a step of %d refused", n);
    }
    store_keys(s, n, step->seq, step->pos);
    for (int32_t r = 0; r < n; r++) s->sel_pos[step->seq[r]] = step->pos[r];
    int32_t n_select = s->p.budget - s->p.sink - s->p.window;
    if (s->p.budget <= 0) n_select = s->env.n_ctx;
    if (n_select < 0) n_select = 0;
    ks_simd_level simd = ks_simd_current(); /* tests lower it with ks_simd_force */
    spec_job job = {.s = s, .step = step, .n_select = n_select, .simd = simd};
    atomic_init(&job.next, 0);
    ks_pool_run(s->env.pool, select_worker, &job);
    s->selections += (uint64_t)n * s->Hkv;
    s->bytes_read += s->step_weight_bytes;
    for (int32_t r = 0; r < n; r++)
        s->bytes_read += (uint64_t)s->klen[step->seq[r]] * s->Hkv * s->kc_rb;
    return KS_OK;
}
