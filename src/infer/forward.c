/*
 * forward.c — the transformer over a list of rows: one function serves
 * prefill and batched decode.
 *
 * A row is (sequence, position, token).  A prefill chunk is rows of one
 * sequence at consecutive positions, a decode step is one row for each of
 * several sequences.  Each weight matrix is multiplied against all rows at
 * once, so a decode step of 16 sequences streams the weights once instead of
 * 16 times — the reason batching pays on memory-bound hardware.  K and V of
 * every row are appended to the store before attention runs, and each row
 * remembers how many entries its head held right after its own append, which
 * makes causal attention inside a prefill chunk fall out of "attend to
 * entries 0..n_att".
 *
 * Byte accounting (weights and KV actually read, tier traffic) is kept per
 * call, so every benchmark prints GB/s beside tok/s.
 */
#include "infer/internal.h"
#include "infer/moe.h"
#include "tensor/act.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------- row-parallel elementwise --
 * Between the products a prefill chunk does per-row work: the RMSNorms, the
 * SwiGLU gate (an expf per element of n_ff: 4M of them per layer at 512
 * rows, about a tenth of a 512-token prefill on one core) and the residual
 * adds.  These run on the pool, rows split between the threads; each row's
 * arithmetic is the serial loop's, element for element, so the bits do not
 * depend on the thread count and decode still equals prefill.  Small calls
 * (a decode step) stay on the caller: a dispatch costs more than the work. */
typedef enum { ROWS_NORM, ROWS_SWIGLU, ROWS_GEGLU, ROWS_ADD } rows_op;

typedef struct rows_job {
    rows_op op;
    int n, width;    /* rows, elements a row */
    float *out;      /* NORM: xn, SWIGLU: gate (in place), ADD: x (in place) */
    const float *in; /* NORM: x, SWIGLU: up, ADD: the addend */
    const float *w;  /* NORM: the norm's weight */
    float eps;
    const ks_weight *next; /* or NULL: the product that reads out next, whose input each row is */
    void *next_scratch;    /* quantized into, while still in cache (ks_matmul_quantize_x) */
} rows_job;

static void rows_range(const rows_job *j, int r0, int r1) {
    const size_t W = (size_t)j->width;
    for (int r = r0; r < r1; r++) {
        float *o = j->out + (size_t)r * W;
        const float *x = j->in + (size_t)r * W;
        switch (j->op) {
        case ROWS_NORM: ks_rmsnorm(o, x, j->w, j->width, j->eps); break;
        case ROWS_SWIGLU:
            for (size_t i = 0; i < W; i++) {
                float g = o[i];
                o[i] = g / (1.0f + expf(-g)) * x[i];
            }
            break;
        case ROWS_GEGLU: ks_geglu_tanh(o, x, (int64_t)W); break; /* gemma: GELU, tanh approximation */
        case ROWS_ADD:
            for (size_t i = 0; i < W; i++) o[i] += x[i];
            break;
        }
        if (j->next) ks_matmul_quantize_x(j->next, o, r, j->next_scratch);
    }
}

static void rows_worker(void *arg, int ith, int nth) {
    const rows_job *j = arg;
    int64_t r0, r1;
    ks_pool_share(j->n, ith, nth, &r0, &r1);
    rows_range(j, (int)r0, (int)r1);
}

#define ROWS_PARALLEL_MIN (1 << 15) /* elements: below, one thread (a dispatch is a few microseconds) */

/* next (or NULL): the weight that multiplies the rows next; each row is
 * then also quantized for it as soon as it is made (ks_matmul_quantize_x),
 * so the product does not read the n x width floats back from memory (at
 * 512 rows the SwiGLU's 16 MB, the norms' 4 MB) and runs with x_ready.  The
 * bytes are those the product would have made itself. */
static void rows_run_into(ks_context *c, rows_op op, int n, int width, float *out, const float *in, const float *w,
                          float eps, const ks_weight *next) {
    rows_job j = {op, n, width, out, in, w, eps, next, c->mm_scratch};
    if (n > 1 && c->params.n_threads > 1 && (size_t)n * (size_t)width >= ROWS_PARALLEL_MIN)
        ks_pool_run(c->pool, rows_worker, &j);
    else rows_range(&j, 0, n);
}

static void rows_run(ks_context *c, rows_op op, int n, int width, float *out, const float *in, const float *w, float eps) {
    rows_run_into(c, op, n, width, out, in, w, eps, NULL);
}

/* Whether a product with b can reuse the quantized X that a product with a
 * (or a quantizing rows_run_into for a) left in the scratch: the same
 * partner layout. */
static bool same_partner(const ks_weight *a, const ks_weight *b) {
    return a->type == b->type && a->cols == b->cols && a->layout == b->layout;
}

/* x_ready: the scratch already holds X quantized for w (same_partner). */
static void matmul_w(ks_context *c, const ks_weight *w, const float *X, int n, float *Y, bool x_ready) {
    double t0 = ks_time_sec();
    ks_matmul_weight_ex(c->pool, w, X, n, Y, c->mm_scratch, x_ready);
    c->stats.matmul_seconds += ks_time_sec() - t0;
    c->stats.matmul_macs += (uint64_t)w->rows * (uint64_t)w->cols * (uint64_t)n;
    c->stats.weight_bytes_read += ks_weight_bytes(w);
}

/* Copy the residual stream entering layer il (n_layer: after the last) of
 * every row, when the policy asked for it (SpeContext's fused states). */
static void capture_hidden(ks_context *c, int il, int n) {
    int D = c->model->hp.n_embd;
    for (int k = 0; k < c->n_aux; k++)
        if (c->aux_layer[k] == il)
            for (int r = 0; r < n; r++)
                memcpy(c->aux_h + ((size_t)r * c->n_aux + k) * D, c->x + (size_t)r * D, sizeof(float) * D);
}

/* Q, K, V of every row at layer il: projections, biases, q/k norms, RoPE;
 * K and V appended to the store. */
static ks_status qkv_rows(ks_context *c, const ks_layer *L, int il, int n, const int32_t *seq, const int32_t *pos,
                          const int32_t *obs_slot) {
    const ks_hparams *hp = &c->model->hp;
    int D = hp->n_embd, hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv, half = hp->n_rot / 2;
    size_t q_dim = (size_t)nh * hd, kv_dim = (size_t)nkv * hd;
    const bool rope = !(hp->rope_skip_every > 0 && (il + 1) % hp->rope_skip_every == 0); /* smollm3's NoPE layers */
    rows_run_into(c, ROWS_NORM, n, D, c->xn, c->x, L->attn_norm, hp->rms_eps, &L->wq);
    matmul_w(c, &L->wq, c->xn, n, c->q, true);
    matmul_w(c, &L->wk, c->xn, n, c->kk, same_partner(&L->wq, &L->wk));
    matmul_w(c, &L->wv, c->xn, n, c->vv, same_partner(&L->wk, &L->wv));
    for (int r = 0; r < n; r++) {
        float *q = c->q + r * q_dim, *k = c->kk + r * kv_dim, *v = c->vv + r * kv_dim;
        if (L->bq) for (size_t i = 0; i < q_dim; i++) q[i] += L->bq[i];
        if (L->bk) for (size_t i = 0; i < kv_dim; i++) k[i] += L->bk[i];
        if (L->bv) for (size_t i = 0; i < kv_dim; i++) v[i] += L->bv[i];
        /* a local layer rotates with its own base when the model has one (gemma3) */
        bool local_rope = L->window > 0 && c->rope_cos_swa;
        const float *cs = (local_rope ? c->rope_cos_swa : c->rope_cos) + (size_t)r * half;
        const float *sn = (local_rope ? c->rope_sin_swa : c->rope_sin) + (size_t)r * half;
        for (int h = 0; h < nh; h++) {
            if (L->q_norm) ks_rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm, hd, hp->rms_eps);
            if (rope) ks_rope_apply(q + (size_t)h * hd, hp->n_rot, hp->rope_neox, cs, sn);
        }
        if (hp->attn_temp_scale > 0) { /* mistral3 (llama 4's temperature tuning): after RoPE, on q only */
            float t = (float)(log(floor((double)pos[r] / hp->attn_temp_floor) + 1.0) * hp->attn_temp_scale + 1.0);
            for (size_t i = 0; i < q_dim; i++) q[i] *= t;
        }
        if (hp->attn_q_scale != 0)
            for (size_t i = 0; i < q_dim; i++) q[i] *= hp->attn_q_scale;
        if (obs_slot && obs_slot[r] >= 0)
            memcpy(c->obs_q + ((size_t)il * c->obs_cap + obs_slot[r]) * q_dim, q, sizeof(float) * q_dim);
        for (int h = 0; h < nkv; h++) {
            if (L->k_norm) ks_rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, L->k_norm, hd, hp->rms_eps);
            if (rope) ks_rope_apply(k + (size_t)h * hd, hp->n_rot, hp->rope_neox, cs, sn);
            KS_TRY(ks_kv_append(c->kv, seq[r], il, h, pos[r], k + (size_t)h * hd, v + (size_t)h * hd));
            c->n_att[(size_t)r * nkv + h] = ks_kv_n_entries(c->kv, seq[r], il, h);
            /* policies select on global layers only: local ones are not theirs to track */
            if (c->decoding && L->window == 0)
                ks_policy_on_append(ks_infer_policy_of(c, seq[r]), seq[r], il, h, pos[r], k + (size_t)h * hd);
        }
    }
    return KS_OK;
}

/* x += W_down (silu(W_gate xn) * W_up xn), xn = RMSNorm(x); gemma: GELU for
 * SiLU, and the product normed (ffn_post_norm) before the add; or the MoE FFN
 * of xn (infer/moe.c). */
static void mlp_rows(ks_context *c, const ks_layer *L, int n) {
    const ks_hparams *hp = &c->model->hp;
    int D = hp->n_embd;
    if (L->moe) { /* routed experts instead of the dense SwiGLU (infer/moe.c) */
        rows_run(c, ROWS_NORM, n, D, c->xn, c->x, L->ffn_norm, hp->rms_eps);
        ks_moe_counters mc = {0};
        ks_moe_ffn(c->pool, hp, L->moe, n, c->xn, c->moe, c->mm_scratch, &mc);
        c->stats.matmul_seconds += mc.matmul_seconds;
        c->stats.matmul_macs += mc.macs;
        c->stats.weight_bytes_read += mc.weight_bytes;
        rows_run(c, ROWS_ADD, n, D, c->x, c->moe->out, NULL, 0);
        return;
    }
    rows_run_into(c, ROWS_NORM, n, D, c->xn, c->x, L->ffn_norm, hp->rms_eps, &L->w_gate);
    matmul_w(c, &L->w_gate, c->xn, n, c->gate, true);
    matmul_w(c, &L->w_up, c->xn, n, c->up, same_partner(&L->w_gate, &L->w_up));
    rows_run_into(c, hp->ffn_gelu ? ROWS_GEGLU : ROWS_SWIGLU, n, hp->n_ff, c->gate, c->up, NULL, 0, &L->w_down);
    matmul_w(c, &L->w_down, c->gate, n, c->xn, true);
    if (L->ffn_post_norm) rows_run(c, ROWS_NORM, n, D, c->xn, c->xn, L->ffn_post_norm, hp->rms_eps);
    rows_run(c, ROWS_ADD, n, D, c->x, c->xn, NULL, 0);
}

/* Fold the workers' and the store's counters of this call into c->stats. */
static void take_counters(ks_context *c, int n, const int32_t *seq) {
    const ks_hparams *hp = &c->model->hp;
    uint64_t attended = 0;
    for (int i = 0; i < c->params.n_threads; i++) {
        attended += c->scr[i].entries_attended;
        c->stats.select_seconds += c->scr[i].select_seconds;
        if (c->decoding) {
            c->stats.gather_seconds += c->scr[i].gather_seconds;
            c->stats.gather_bytes += c->scr[i].gather_bytes;
        }
        c->scr[i].entries_attended = 0;
        c->scr[i].select_seconds = 0;
        c->scr[i].gather_seconds = 0;
        c->scr[i].gather_bytes = 0;
    }
    /* K and V rows; latent attention reads its values from the key rows (attend.c) */
    c->stats.kv_bytes_read += (hp->kv_lora_rank > 0 ? 1 : 2) * attended * c->kv_row_bytes;
    if (c->decoding) {
        c->stats.kv_entries_attended += attended;
        for (int il = 0; il < hp->n_layer; il++)
            for (int r = 0; r < n; r++)
                for (int h = 0; h < hp->n_head_kv; h++)
                    c->stats.kv_entries_total += (uint64_t)ks_kv_n_entries(c->kv, seq[r], il, h);
    }
    ks_kv_traffic tr;
    ks_kv_take_traffic(c->kv, &tr);
    c->stats.kv_bytes_loaded += tr.bytes_loaded;
    c->stats.kv_bytes_stored += tr.bytes_stored;
    c->stats.kv_pages_loaded += tr.pages_loaded;
    c->stats.kv_pages_hit += tr.pages_hit;
    c->stats.kv_entries_loaded += tr.entries_loaded;
    c->stats.kv_entries_hit += tr.entries_hit;
    c->stats.kv_sync_fallbacks += tr.sync_fallbacks;
    c->stats.kv_wait_seconds += tr.wait_seconds;
    c->stats.kv_copy_seconds += tr.copy_seconds;
}

ks_status ks_infer_forward_rows(ks_context *c, int n, const int32_t *seq, const int32_t *pos, const int32_t *tok,
                                const bool *want, float *logits_out, const int32_t *obs_slot) {
    const ks_model *m = c->model;
    const ks_hparams *hp = &m->hp;
    int D = hp->n_embd, half = hp->n_rot / 2;
    KS_ASSERT(n > 0 && n <= c->max_rows);
    for (int r = 0; r < n; r++) {
        ks_dequantize_row(m->tok_embd.type,
                          (const uint8_t *)m->tok_embd.data + ks_dtype_row_bytes(m->tok_embd.type, D) * (size_t)tok[r],
                          c->x + (size_t)r * D, D);
        ks_rope_angles_inv(c->rope_cos + (size_t)r * half, c->rope_sin + (size_t)r * half, pos[r], hp->n_rot,
                           c->rope_inv_freq, c->rope_mscale);
        if (hp->embd_scale) { /* gemma: the embedding times sqrt(n_embd) */
            float *x = c->x + (size_t)r * D, sc = sqrtf((float)D);
            for (int i = 0; i < D; i++) x[i] *= sc;
        }
        if (c->rope_cos_swa) /* local layers: their own base, unscaled */
            ks_rope_angles(c->rope_cos_swa + (size_t)r * half, c->rope_sin_swa + (size_t)r * half, pos[r], hp->n_rot,
                           hp->rope_base_swa, NULL);
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const ks_layer *L = &m->layers[il];
        capture_hidden(c, il, n);
        if (L->mla) KS_TRY(ks_infer_mla_qkv(c, L, il, n, seq, pos, obs_slot)); /* latent attention (infer/mla.c) */
        else KS_TRY(qkv_rows(c, L, il, n, seq, pos, obs_slot));
        if (!c->decoding && ks_kv_layer_tier(c->kv, il) == KS_TIER_SLOW) KS_TRY(ks_infer_load_prefill_slots(c, il, n, seq));
        /* at decode each row's own policy decides whether this layer selects */
        double t_att = ks_time_sec();
        KS_TRY(ks_infer_attend_layer(c, il, n, seq, pos, c->decoding, L->mla ? NULL : &L->wo));
        c->stats.attention_seconds += ks_time_sec() - t_att;
        if (L->mla) { /* the weighted latents through W_UV, then the output projection */
            ks_infer_mla_out(c, L, n);
            matmul_w(c, &L->wo, c->q, n, c->xn, false);
        } else {
            matmul_w(c, &L->wo, c->att, n, c->xn, true);
        }
        if (L->bo)
            for (int r = 0; r < n; r++)
                for (int i = 0; i < D; i++) c->xn[(size_t)r * D + i] += L->bo[i];
        if (L->attn_post_norm) rows_run(c, ROWS_NORM, n, D, c->xn, c->xn, L->attn_post_norm, hp->rms_eps);
        rows_run(c, ROWS_ADD, n, D, c->x, c->xn, NULL, 0);
        mlp_rows(c, L, n);
    }
    capture_hidden(c, hp->n_layer, n);
    for (int r = 0; c->n_aux && r < n; r++)
        ks_policy_on_hidden(ks_infer_policy_of(c, seq[r]), seq[r], pos[r], tok[r], c->aux_h + (size_t)r * c->n_aux * D);
    take_counters(c, n, seq);
    /* a decode step is where a local layer's oldest pages leave (a prefill
     * trims between its chunks, step.c) */
    for (int r = 0; c->decoding && hp->n_swa > 0 && r < n; r++)
        if (r == 0 || seq[r] != seq[r - 1]) KS_TRY(ks_infer_swa_trim(c, seq[r]));
    if (!want || !logits_out) return KS_OK;
    int n_want = 0;
    for (int r = 0; r < n; r++)
        if (want[r]) ks_rmsnorm(c->xn + (size_t)(n_want++) * D, c->x + (size_t)r * D, m->output_norm, D, hp->rms_eps);
    if (n_want) matmul_w(c, &m->output, c->xn, n_want, logits_out, false);
    if (hp->logit_softcap > 0)
        for (size_t i = 0; i < (size_t)n_want * hp->n_vocab; i++)
            logits_out[i] = hp->logit_softcap * tanhf(logits_out[i] / hp->logit_softcap);
    return KS_OK;
}
