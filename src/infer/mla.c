/*
 * mla.c — multi-head latent attention (deepseek2) in the absorbed form: the
 * store holds latents, attention runs in latent space.
 *
 * The paper's form ("DeepSeek-V2", Section 2.1) caches c = RMSNorm(W_DKV x)
 * [kv_lora_rank] and the rope key k_R [qk_rope] per token, and attends per
 * head h with k_h = [W_UK_h c ; k_R] and v_h = W_UV_h c.  Its Section 2.1.2
 * observes that W_UK_h can be absorbed into the query:
 *     q_h . k_h = (W_UK_h^T q_nope_h) . c + q_rope_h . k_R,
 * so with the query q'_h = [W_UK_h^T q_nope_h ; q_rope_h] (kv_lora_rank +
 * qk_rope dims) and the key [c ; k_R] every head scores the same stored
 * row: multi-query attention with one KV head of kv_lora_rank + qk_rope
 * dims (576 for V2-Lite), which is what the store, the kernels and every
 * selection policy see (hp.head_dim, n_head_kv 1).  The value side is
 * linear too: sum_t p_t W_UV_h c_t = W_UV_h (sum_t p_t c_t), so attention
 * returns the weighted latent per head and W_UV_h runs once per head and
 * row afterwards, never per token.  That is what makes sparse selection
 * cheap here: only the selected latents are read, and none is ever
 * up-projected (SpeContext's MLA design, "SpeContext: Enabling Efficient
 * Long-context Reasoning with Speculative Context Sparsity in LLMs",
 * Section 4, "Support for MLA": select on the latent cache, expand only the
 * selected entries; absorbed, no entry is expanded at all).
 *
 * Store rows.  The K row is [c ; k_R] as llama.cpp's Kcur (latent first).
 * Attention reads the values from the same K row (attend.c points each run's
 * V at its K), so a step reads each attended latent once and its output per
 * head is [sum p c ; sum p k_R], of which the first kv_lora_rank values feed
 * W_UV.  The store is k_only (kv.h): no V row is written or reserved, an
 * entry occupies its 576 elements, as llama.cpp's view of K (docs/DESIGN.md).
 *
 * Scale.  The kernels scale logits by 1/sqrt(head_dim) of the latent head;
 * llama.cpp's kq_scale is mscale^2 / sqrt(qk_nope + qk_rope), so Q is
 * multiplied by hp.mla_q_scale, their ratio (arch_deepseek2.c).
 *
 * Products.  W_UK_h^T and W_UV_h are per-head views (attn_k_b, attn_v_b);
 * each runs once per layer over all rows of the call, on gathered rows (a
 * prefill chunk streams each head's matrix once, a decode step reads it
 * once per step, as any other weight).  The rows' arithmetic does not depend
 * on the batch (ks_matmul's contract), so decode equals prefill.
 *
 * One row (a decode step of one sequence).  Run per head, the absorption
 * and the value projection are 2 x n_head products a layer, each its own
 * parallel-for over a 512 x 128 matrix (V2-Lite: 64 KiB of Q8_0), so 32
 * wake-ups and barriers a layer, 864 a token, for a few microseconds of work
 * each.  With one row every head's input is one contiguous slice (q_nope_h
 * in the raw query, the weighted latent in the attention output) and its
 * output one slice too, so all heads' rows are one list split between the
 * threads in one run (mla_heads_run), as moe.c does for the active experts:
 * 2 runs a layer.  Each output is the same one-row kernel over the same
 * quantized input, only the thread that computes it changes, so the bits
 * are the per-head loop's (tests/test_mla.c, test_one_row_heads_equal_loop).
 */
#include "infer/internal.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

static void mla_matmul(ks_context *c, const ks_weight *w, const float *X, int n, float *Y) {
    double t0 = ks_time_sec();
    ks_matmul_weight_ex(c->pool, w, X, n, Y, c->mm_scratch, false);
    c->stats.matmul_seconds += ks_time_sec() - t0;
    c->stats.matmul_macs += (uint64_t)w->rows * (uint64_t)w->cols * (uint64_t)n;
    c->stats.weight_bytes_read += ks_weight_bytes(w);
}

/* ---------------------------------------------- one row: one run for all heads -- */
typedef struct {
    const ks_weight *w; /* [nh] the heads' matrices */
    int nh;
    const float *x;     /* head h's input at x + h * x_step */
    size_t x_step;
    float *y;           /* head h's output at y + h * y_step */
    size_t y_step;
    uint8_t *scratch;   /* head h's quantized input at scratch + h * slot */
    size_t slot;
    atomic_llong next;  /* the next unclaimed unit */
} mla_heads_job;

#define MLA_UNIT 16 /* rows: the products' own split alignment (matmul.c) */
#define MLA_CLAIM 8 /* units a thread claims at a time (a shared cursor, as moe.c's fast_worker) */

static void mla_heads_worker(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    mla_heads_job *j = arg;
    const int64_t per = j->w[0].rows, units_per = (per + MLA_UNIT - 1) / MLA_UNIT, total = units_per * j->nh;
    const size_t rb = ks_dtype_row_bytes(j->w[0].type, j->w[0].cols);
    for (int64_t u0; (u0 = atomic_fetch_add(&j->next, MLA_CLAIM)) < total;) {
        const int64_t u1 = u0 + MLA_CLAIM < total ? u0 + MLA_CLAIM : total;
        for (int64_t u = u0; u < u1;) {
            const int h = (int)(u / units_per);
            const int64_t uend = (int64_t)(h + 1) * units_per < u1 ? (int64_t)(h + 1) * units_per : u1;
            const int64_t r0 = (u % units_per) * MLA_UNIT;
            int64_t r1 = (uend - (int64_t)h * units_per) * MLA_UNIT;
            if (r1 > per) r1 = per;
            u = uend;
            ks_weight view = j->w[h];
            view.data = (const uint8_t *)view.data + (size_t)r0 * rb;
            view.rows = r1 - r0;
            ks_matmul_weight_ex(NULL, &view, j->x + (size_t)h * j->x_step, 1, j->y + (size_t)h * j->y_step + r0,
                                j->scratch + (size_t)h * j->slot, true);
        }
    }
}

/* Y_h = W_h x_h for every head h in one pool run, or false (nothing done)
 * where the heads cannot take it: a packed layout (a row range of a panel is
 * not a matrix), heads of different types or sizes, or per-head quantized
 * inputs that would not fit the scratch the context sized for this matrix
 * over max_rows vectors (context.c). */
static bool mla_heads_run(ks_context *c, const ks_weight *w, int nh, const float *x, size_t x_step, float *y,
                          size_t y_step) {
    for (int h = 0; h < nh; h++)
        if (w[h].layout != KS_WEIGHT_ROWS || w[h].type != w[0].type || w[h].rows != w[0].rows ||
            w[h].cols != w[0].cols)
            return false;
    const size_t slot = (ks_matmul_scratch_bytes(w[0].type, w[0].cols, 1) + 63) & ~(size_t)63;
    if (slot * (size_t)nh > ks_matmul_scratch_bytes(w[0].type, w[0].cols, c->max_rows)) return false;
    double t0 = ks_time_sec();
    mla_heads_job j = {w, nh, x, x_step, y, y_step, c->mm_scratch, slot, 0};
    atomic_init(&j.next, 0);
    for (int h = 0; h < nh; h++) ks_matmul_quantize_x(&w[h], x + (size_t)h * x_step, 0, j.scratch + (size_t)h * slot);
    if (c->pool) ks_pool_run(c->pool, mla_heads_worker, &j);
    else mla_heads_worker(&j, 0, 1);
    c->stats.matmul_seconds += ks_time_sec() - t0;
    c->stats.matmul_macs += (uint64_t)w[0].rows * (uint64_t)w[0].cols * (uint64_t)nh;
    c->stats.weight_bytes_read += ks_weight_bytes(&w[0]) * (size_t)nh;
    return true;
}

ks_status ks_infer_mla_qkv(ks_context *c, const ks_layer *L, int il, int n, const int32_t *seq, const int32_t *pos,
                           const int32_t *obs_slot) {
    const ks_hparams *hp = &c->model->hp;
    const ks_mla_layer *a = L->mla;
    const int D = hp->n_embd, nh = hp->n_head, hd = hp->head_dim, R = hp->kv_lora_rank, rope = hp->n_rot;
    const int nope = hp->qk_nope, qk = nope + rope, half = rope / 2;
    const size_t q_dim = (size_t)nh * hd; /* the absorbed queries: nh latent-space heads */
    for (int r = 0; r < n; r++)
        ks_rmsnorm(c->xn + (size_t)r * D, c->x + (size_t)r * D, L->attn_norm, D, hp->rms_eps);
    /* raw Q [n][nh * qk] into c->att (free until attention writes it) */
    float *qraw = c->att;
    if (a->wq_a.data) { /* low rank (V2): W_UQ RMSNorm(W_DQ x), the [n][q_lora] middle in c->q (rewritten below) */
        mla_matmul(c, &a->wq_a, c->xn, n, c->q);
        for (int r = 0; r < n; r++)
            ks_rmsnorm(c->q + (size_t)r * hp->q_lora_rank, c->q + (size_t)r * hp->q_lora_rank, a->q_a_norm,
                       hp->q_lora_rank, hp->rms_eps);
        mla_matmul(c, &a->wq_b, c->q, n, qraw);
    } else {
        mla_matmul(c, &L->wq, c->xn, n, qraw);
    }
    /* the latent and rope key [n][R + rope] into c->kk: normed latent, rotated key */
    mla_matmul(c, &a->wkv_a, c->xn, n, c->kk);
    for (int r = 0; r < n; r++) {
        float *k = c->kk + (size_t)r * hd;
        ks_rmsnorm(k, k, a->kv_a_norm, R, hp->rms_eps);
        ks_rope_apply(k + R, rope, hp->rope_neox, c->rope_cos + (size_t)r * half, c->rope_sin + (size_t)r * half);
    }
    /* absorb: q'_h[0, R) = W_UK_h^T q_nope_h, one product per head over the rows
     * (gathered into c->vv, results through c->xn, which the projections above no longer need) */
    /* one row: every head's q_nope_h is a slice of qraw, its result goes to xn + h R */
    const bool one = n == 1 && mla_heads_run(c, a->k_b, nh, qraw, (size_t)qk, c->xn, (size_t)R);
    for (int h = 0; h < nh; h++) {
        if (!one) {
            for (int r = 0; r < n; r++)
                memcpy(c->vv + (size_t)r * nope, qraw + (size_t)r * nh * qk + (size_t)h * qk, sizeof(float) * nope);
            mla_matmul(c, &a->k_b[h], c->vv, n, c->xn);
        }
        const float *qa = one ? c->xn + (size_t)h * R : c->xn; /* the absorbed head's rows */
        for (int r = 0; r < n; r++) {
            float *q = c->q + (size_t)r * q_dim + (size_t)h * hd;
            memcpy(q, qa + (size_t)r * R, sizeof(float) * R);
            memcpy(q + R, qraw + (size_t)r * nh * qk + (size_t)h * qk + nope, sizeof(float) * rope);
            ks_rope_apply(q + R, rope, hp->rope_neox, c->rope_cos + (size_t)r * half, c->rope_sin + (size_t)r * half);
            for (int i = 0; i < hd; i++) q[i] *= hp->mla_q_scale;
        }
    }
    for (int r = 0; r < n; r++) {
        const float *k = c->kk + (size_t)r * hd;
        if (obs_slot && obs_slot[r] >= 0)
            memcpy(c->obs_q + ((size_t)il * c->obs_cap + obs_slot[r]) * q_dim, c->q + (size_t)r * q_dim,
                   sizeof(float) * q_dim);
        /* one latent head; the k_only store keeps no V row (its values are k) */
        KS_TRY(ks_kv_append(c->kv, seq[r], il, 0, pos[r], k, k));
        c->n_att[r] = ks_kv_n_entries(c->kv, seq[r], il, 0);
        if (c->decoding) ks_policy_on_append(ks_infer_policy_of(c, seq[r]), seq[r], il, 0, pos[r], k);
    }
    return KS_OK;
}

void ks_infer_mla_out(ks_context *c, const ks_layer *L, int n) {
    const ks_hparams *hp = &c->model->hp;
    const int nh = hp->n_head, hd = hp->head_dim, R = hp->kv_lora_rank, V = hp->v_head_mla;
    /* per head: the weighted latent (first R values of the head's output) through W_UV_h, into c->q;
     * one row: head h reads att + h hd and writes q + h V, all heads in one run */
    if (n == 1 && mla_heads_run(c, L->mla->v_b, nh, c->att, (size_t)hd, c->q, (size_t)V)) return;
    for (int h = 0; h < nh; h++) {
        for (int r = 0; r < n; r++)
            memcpy(c->xn + (size_t)r * R, c->att + (size_t)r * nh * hd + (size_t)h * hd, sizeof(float) * R);
        mla_matmul(c, &L->mla->v_b[h], c->xn, n, c->vv);
        for (int r = 0; r < n; r++)
            memcpy(c->q + (size_t)r * nh * V + (size_t)h * V, c->vv + (size_t)r * V, sizeof(float) * V);
    }
}
