/*
 * context.c — the forward pass: sequences, KV cache, prefill and batched decode.
 *
 * One function, forward_rows(), runs every case.  Its input is a list of rows
 * (sequence, position, token): a prefill chunk is rows of one sequence at
 * consecutive positions, a decode step is one row for each of several
 * sequences.  Each weight matrix is multiplied against all rows at once, so a
 * decode step of 16 sequences streams the weights once instead of 16 times —
 * the reason batching pays on memory-bound hardware.  K and V of every row are
 * written to the cache before attention runs, which makes causal attention
 * inside a prefill chunk fall out of "attend to positions 0..pos".
 *
 * The KV cache here is contiguous per (layer, sequence, KV head) —
 * [n_layer][n_seq][n_head_kv][n_ctx][head_dim] — so attention for one KV head
 * streams one contiguous range.  Attention processes a whole GQA group per KV
 * head: each K/V row is converted once and used by all G query heads, so
 * long-context decode reads the KV exactly once per step.
 *
 * Byte accounting (weights and KV actually read) is kept per call, so every
 * benchmark can print GB/s beside tok/s.
 */
#define _GNU_SOURCE
#include "infer/infer.h"

#include <math.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

ks_context_params ks_context_default_params(void) {
    return (ks_context_params){
        .n_ctx = 0, .n_seq = 1, .n_threads = 0, .n_batch = 256, .kv_type = KS_KV_F16};
}

/* ----------------------------------------------------------- small ops -- */
void ks_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void ks_rope_angles(float *cos_out, float *sin_out, int32_t pos, int n_rot, float base,
                    const float *freq_factors) {
    for (int j = 0; j < n_rot / 2; j++) {
        double freq = pow((double)base, -2.0 * j / n_rot);
        if (freq_factors) freq /= freq_factors[j];
        double a = (double)pos * freq;
        cos_out[j] = (float)cos(a);
        sin_out[j] = (float)sin(a);
    }
}

void ks_rope_apply(float *v, int n_rot, bool neox, const float *c, const float *s) {
    int half = n_rot / 2;
    for (int j = 0; j < half; j++) {
        int i0 = neox ? j : 2 * j, i1 = neox ? j + half : 2 * j + 1;
        float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * c[j] - x1 * s[j];
        v[i1] = x0 * s[j] + x1 * c[j];
    }
}

void ks_softmax(float *x, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

/* ------------------------------------------------------- KV row access -- */
static void kv_row_to_f32_scalar(ks_kv_type t, const void *row, float *dst, int hd) {
    if (t == KS_KV_F16) {
        const ks_f16 *h = row;
        for (int i = 0; i < hd; i++) dst[i] = ks_f16_to_f32(h[i]);
    } else {
        ks_dequantize_row(KS_DTYPE_Q8_0, row, dst, hd);
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) static void attn_group_avx2(
    const uint16_t *K, const uint16_t *V, int len, int hd, int G, const float *q, float *scores,
    float *out, float scale) {
    /* K, V: [len][hd] f16; q: [G][hd]; scores: [G][len]; out: [G][hd]; hd % 8 == 0 */
    for (int t = 0; t < len; t++) {
        const uint16_t *k = K + (size_t)t * hd;
        for (int g = 0; g < G; g++) {
            const float *qg = q + (size_t)g * hd;
            __m256 acc = _mm256_setzero_ps();
            for (int i = 0; i < hd; i += 8) {
                __m256 kf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i)));
                acc = _mm256_fmadd_ps(kf, _mm256_loadu_ps(qg + i), acc);
            }
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
            s = _mm_hadd_ps(s, s);
            s = _mm_hadd_ps(s, s);
            scores[(size_t)g * len + t] = _mm_cvtss_f32(s) * scale;
        }
    }
    for (int g = 0; g < G; g++) ks_softmax(scores + (size_t)g * len, len);
    for (int g = 0; g < G; g++) memset(out + (size_t)g * hd, 0, sizeof(float) * hd);
    for (int t = 0; t < len; t++) {
        const uint16_t *v = V + (size_t)t * hd;
        for (int i = 0; i < hd; i += 8) {
            __m256 vf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
            for (int g = 0; g < G; g++) {
                float *o = out + (size_t)g * hd + i;
                __m256 p = _mm256_set1_ps(scores[(size_t)g * len + t]);
                _mm256_storeu_ps(o, _mm256_fmadd_ps(p, vf, _mm256_loadu_ps(o)));
            }
        }
    }
}
#endif

/* Portable reference: any KV type, any head dim.  tmp: [hd]. */
static void attn_group_ref(ks_kv_type kt, const uint8_t *K, const uint8_t *V, size_t row_bytes, int len,
                           int hd, int G, const float *q, float *scores, float *out, float scale, float *tmp) {
    for (int t = 0; t < len; t++) {
        kv_row_to_f32_scalar(kt, K + (size_t)t * row_bytes, tmp, hd);
        for (int g = 0; g < G; g++) {
            const float *qg = q + (size_t)g * hd;
            float acc = 0;
            for (int i = 0; i < hd; i++) acc += qg[i] * tmp[i];
            scores[(size_t)g * len + t] = acc * scale;
        }
    }
    for (int g = 0; g < G; g++) ks_softmax(scores + (size_t)g * len, len);
    for (int g = 0; g < G; g++) memset(out + (size_t)g * hd, 0, sizeof(float) * hd);
    for (int t = 0; t < len; t++) {
        kv_row_to_f32_scalar(kt, V + (size_t)t * row_bytes, tmp, hd);
        for (int g = 0; g < G; g++) {
            float p = scores[(size_t)g * len + t];
            float *o = out + (size_t)g * hd;
            for (int i = 0; i < hd; i++) o[i] += p * tmp[i];
        }
    }
}

void ks_attention_group(ks_kv_type kt, const void *K, const void *V, int len, int hd, int G,
                        const float *q, float *scores, float *out, float *tmp, bool allow_simd) {
    float scale = 1.0f / sqrtf((float)hd);
#if defined(__x86_64__)
    if (allow_simd && kt == KS_KV_F16 && ks_simd_detect() >= KS_SIMD_AVX512 &&
        ks_attention_group_avx512(K, V, len, hd, G, q, scores, out, scale))
        return;
    if (allow_simd && kt == KS_KV_F16 && hd % 8 == 0 && ks_simd_detect() >= KS_SIMD_AVX2) {
        attn_group_avx2(K, V, len, hd, G, q, scores, out, scale);
        return;
    }
#endif
    attn_group_ref(kt, K, V, ks_kv_row_bytes(kt, hd), len, hd, G, q, scores, out, scale, tmp);
}

size_t ks_kv_row_bytes(ks_kv_type t, int hd) {
    return t == KS_KV_F16 ? (size_t)hd * 2 : ks_dtype_row_bytes(KS_DTYPE_Q8_0, hd);
}

/* ------------------------------------------------------------ context -- */
/* KV buffers are streamed end to end every step; backing them with huge pages
 * (where the kernel allows, THP "madvise" mode) removes a TLB miss per 4 KiB
 * of a multi-GB scan.  Caller-sized: NULL is reported, not aborted on. */
static uint8_t *kv_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (bytes >= huge) {
        if (posix_memalign(&p, huge, (bytes + huge - 1) / huge * huge) != 0) return NULL;
        madvise(p, (bytes + huge - 1) / huge * huge, MADV_HUGEPAGE);
        return p;
    }
    return malloc(bytes ? bytes : 1);
}

static uint8_t *kv_row(const ks_context *c, uint8_t *const *cache, int il, int seq, int h, int32_t pos) {
    const ks_hparams *hp = &c->model->hp;
    size_t idx = (((size_t)seq * hp->n_head_kv + h) * c->n_ctx + pos);
    return cache[il] + idx * c->kv_row_bytes;
}

void ks_context_destroy(ks_context *c) {
    if (!c) return;
    for (int il = 0; c->k && il < c->model->hp.n_layer; il++) {
        free(c->k[il]);
        free(c->v[il]);
    }
    ks_free(c->k);
    ks_free(c->v);
    ks_free(c->seq_len);
    ks_free_aligned(c->x);
    ks_free_aligned(c->xn);
    ks_free_aligned(c->q);
    ks_free_aligned(c->kk);
    ks_free_aligned(c->vv);
    ks_free_aligned(c->att);
    ks_free_aligned(c->gate);
    ks_free_aligned(c->up);
    ks_free_aligned(c->att_scratch);
    ks_free_aligned(c->mm_scratch);
    ks_free(c->rope_cos);
    ks_free(c->rope_sin);
    ks_pool_destroy(c->pool);
    ks_free(c);
}

ks_status ks_context_create(const ks_model *model, ks_context_params p, ks_context **out) {
    if (!model || !out) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL model or out");
    if (model->vocab_only) return KS_FAIL(KS_ERR_INVALID_ARG, "the model was loaded vocabulary-only");
    const ks_hparams *hp = &model->hp;
    if (p.n_ctx <= 0) p.n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p.n_threads <= 0) p.n_threads = ks_cpu_count();
    if (p.n_batch <= 0) p.n_batch = 256;
    if (p.n_seq <= 0 || p.n_seq > 4096) return KS_FAIL(KS_ERR_INVALID_ARG, "n_seq %d out of range [1, 4096]", p.n_seq);
    if (p.n_ctx > (1 << 24)) return KS_FAIL(KS_ERR_INVALID_ARG, "n_ctx %d is too large", p.n_ctx);
    if (p.kv_type != KS_KV_F16 && p.kv_type != KS_KV_Q8)
        return KS_FAIL(KS_ERR_INVALID_ARG, "unknown KV type %d", (int)p.kv_type);
    if (p.kv_type == KS_KV_Q8 && hp->head_dim % KS_QK8_0)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "8-bit KV needs a head dim multiple of 32 (have %d)", hp->head_dim);
    if (p.n_ctx > hp->n_ctx_train)
        KS_LOG(WARN, "context %d exceeds the model's trained context %d", p.n_ctx, hp->n_ctx_train);
    ks_context *c = ks_calloc(1, sizeof *c);
    c->model = model;
    c->params = p;
    c->n_ctx = p.n_ctx;
    c->n_seq = p.n_seq;
    c->kv_type = p.kv_type;
    c->kv_row_bytes = ks_kv_row_bytes(p.kv_type, hp->head_dim);
    ks_status st = ks_pool_create(p.n_threads, &c->pool);
    if (st != KS_OK) {
        ks_free(c);
        return st;
    }
    size_t layer_bytes = c->kv_row_bytes * (size_t)hp->n_head_kv * (size_t)c->n_ctx * (size_t)c->n_seq;
    c->k = ks_calloc((size_t)hp->n_layer, sizeof(uint8_t *));
    c->v = ks_calloc((size_t)hp->n_layer, sizeof(uint8_t *));
    for (int il = 0; il < hp->n_layer; il++) {
        /* caller-sized: a refusal is an error to report, not an abort */
        c->k[il] = kv_alloc(layer_bytes);
        c->v[il] = kv_alloc(layer_bytes);
        if (!c->k[il] || !c->v[il]) {
            ks_context_destroy(c);
            return KS_FAIL(KS_ERR_NOMEM, "KV cache of %.1f GiB (%d seqs x %d tokens) does not fit in memory",
                           2.0 * hp->n_layer * layer_bytes / 1073741824.0, p.n_seq, p.n_ctx);
        }
    }
    c->kv_bytes = 2 * (size_t)hp->n_layer * layer_bytes;
    c->seq_len = ks_calloc((size_t)c->n_seq, sizeof(int32_t));
    int rows = p.n_batch > c->n_seq ? p.n_batch : c->n_seq;
    c->max_rows = rows;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t wide = (size_t)hp->n_embd > q_dim ? (size_t)hp->n_embd : q_dim;
    c->x = ks_malloc_aligned(sizeof(float) * rows * hp->n_embd);
    c->xn = ks_malloc_aligned(sizeof(float) * rows * wide);
    c->q = ks_malloc_aligned(sizeof(float) * rows * q_dim);
    c->kk = ks_malloc_aligned(sizeof(float) * rows * kv_dim);
    c->vv = ks_malloc_aligned(sizeof(float) * rows * kv_dim);
    c->att = ks_malloc_aligned(sizeof(float) * rows * q_dim);
    c->gate = ks_malloc_aligned(sizeof(float) * rows * hp->n_ff);
    c->up = ks_malloc_aligned(sizeof(float) * rows * hp->n_ff);
    int G = hp->n_head / hp->n_head_kv;
    /* scores: [G][n_ctx] for the portable kernels, [n_ctx][4] for the AVX-512 one */
    c->att_stride = (size_t)(G > 4 ? G : 4) * c->n_ctx + (size_t)hp->head_dim + 16;
    c->att_scratch = ks_malloc_aligned(sizeof(float) * c->att_stride * p.n_threads);
    size_t mm = 0;
    const ks_weight *ws[] = {&model->layers[0].wq, &model->layers[0].wo, &model->layers[0].w_gate,
                             &model->layers[0].w_down, &model->output};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        size_t need = ks_matmul_scratch_bytes(ws[i]->type, ws[i]->cols, rows);
        if (need > mm) mm = need;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const ks_layer *L = &model->layers[il];
        const ks_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < 7; i++) {
            size_t need = ks_matmul_scratch_bytes(lw[i]->type, lw[i]->cols, rows);
            if (need > mm) mm = need;
        }
    }
    c->mm_scratch = ks_malloc_aligned(mm ? mm : 64);
    c->rope_cos = ks_malloc(sizeof(float) * rows * (hp->n_rot / 2));
    c->rope_sin = ks_malloc(sizeof(float) * rows * (hp->n_rot / 2));
    *out = c;
    return KS_OK;
}

void ks_seq_reset(ks_context *c, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < c->n_seq);
    c->seq_len[seq] = 0;
}
int32_t ks_seq_len(const ks_context *c, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < c->n_seq);
    return c->seq_len[seq];
}
void ks_context_stats(const ks_context *c, ks_stats *out) { *out = c->stats; }
void ks_stats_reset(ks_context *c) { memset(&c->stats, 0, sizeof c->stats); }
const ks_model *ks_context_model(const ks_context *c) { return c->model; }
ks_pool *ks_context_pool(ks_context *c) { return c->pool; }

/* ------------------------------------------------------------ forward -- */
typedef struct {
    ks_context *c;
    int il, n;
    const int32_t *seq, *pos;
    atomic_int next;
} attn_job;

static void attn_worker(void *arg, int ith, int nth) {
    attn_job *j = arg;
    ks_context *c = j->c;
    const ks_hparams *hp = &c->model->hp;
    int G = hp->n_head / hp->n_head_kv, hd = hp->head_dim;
    float *scr = c->att_scratch + c->att_stride * ith;
    int total = j->n * hp->n_head_kv;
    for (;;) {
        int task = atomic_fetch_add(&j->next, 1);
        if (task >= total) break;
        int r = task / hp->n_head_kv, h = task % hp->n_head_kv;
        int len = j->pos[r] + 1;
        const uint8_t *K = kv_row(c, c->k, j->il, j->seq[r], h, 0);
        const uint8_t *V = kv_row(c, c->v, j->il, j->seq[r], h, 0);
        const float *q = c->q + ((size_t)r * hp->n_head + (size_t)h * G) * hd;
        float *o = c->att + ((size_t)r * hp->n_head + (size_t)h * G) * hd;
        float *tmp = scr + (size_t)(G > 4 ? G : 4) * c->n_ctx;
        ks_attention_group(c->kv_type, K, V, len, hd, G, q, scr, o, tmp, true);
    }
    (void)nth;
}

static void store_kv_row(ks_context *c, uint8_t *dst, const float *src) {
    int hd = c->model->hp.head_dim;
    if (c->kv_type == KS_KV_F16) {
        ks_f16 *h = (ks_f16 *)dst;
        for (int i = 0; i < hd; i++) h[i] = ks_f32_to_f16(src[i]);
    } else {
        ks_quantize_row(KS_DTYPE_Q8_0, src, dst, hd);
    }
}

static void matmul_w(ks_context *c, const ks_weight *w, const float *X, int n, float *Y) {
    ks_matmul(c->pool, w->type, w->data, w->rows, w->cols, X, n, Y, c->mm_scratch);
    c->stats.weight_bytes_read += ks_weight_bytes(w);
}

/* rows: n entries (seq[i], pos[i], tok[i]); logits rows selected by want[i]
 * (NULL = none) are written consecutively to logits_out [n_want][n_vocab]. */
static void forward_rows(ks_context *c, int n, const int32_t *seq, const int32_t *pos, const int32_t *tok,
                         const bool *want, float *logits_out) {
    const ks_model *m = c->model;
    const ks_hparams *hp = &m->hp;
    int D = hp->n_embd, hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv, half = hp->n_rot / 2;
    size_t q_dim = (size_t)nh * hd, kv_dim = (size_t)nkv * hd;
    KS_ASSERT(n > 0 && n <= c->max_rows);
    for (int r = 0; r < n; r++) {
        ks_dequantize_row(m->tok_embd.type,
                          (const uint8_t *)m->tok_embd.data + ks_dtype_row_bytes(m->tok_embd.type, D) * (size_t)tok[r],
                          c->x + (size_t)r * D, D);
        ks_rope_angles(c->rope_cos + (size_t)r * half, c->rope_sin + (size_t)r * half, pos[r], hp->n_rot,
                       hp->rope_base, m->rope_freq_factors);
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const ks_layer *L = &m->layers[il];
        for (int r = 0; r < n; r++) ks_rmsnorm(c->xn + (size_t)r * D, c->x + (size_t)r * D, L->attn_norm, D, hp->rms_eps);
        matmul_w(c, &L->wq, c->xn, n, c->q);
        matmul_w(c, &L->wk, c->xn, n, c->kk);
        matmul_w(c, &L->wv, c->xn, n, c->vv);
        for (int r = 0; r < n; r++) {
            float *q = c->q + r * q_dim, *k = c->kk + r * kv_dim, *v = c->vv + r * kv_dim;
            if (L->bq) for (size_t i = 0; i < q_dim; i++) q[i] += L->bq[i];
            if (L->bk) for (size_t i = 0; i < kv_dim; i++) k[i] += L->bk[i];
            if (L->bv) for (size_t i = 0; i < kv_dim; i++) v[i] += L->bv[i];
            const float *cs = c->rope_cos + (size_t)r * half, *sn = c->rope_sin + (size_t)r * half;
            for (int h = 0; h < nh; h++) {
                if (L->q_norm) ks_rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm, hd, hp->rms_eps);
                ks_rope_apply(q + (size_t)h * hd, hp->n_rot, hp->rope_neox, cs, sn);
            }
            for (int h = 0; h < nkv; h++) {
                if (L->k_norm) ks_rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, L->k_norm, hd, hp->rms_eps);
                ks_rope_apply(k + (size_t)h * hd, hp->n_rot, hp->rope_neox, cs, sn);
                store_kv_row(c, kv_row(c, c->k, il, seq[r], h, pos[r]), k + (size_t)h * hd);
                store_kv_row(c, kv_row(c, c->v, il, seq[r], h, pos[r]), v + (size_t)h * hd);
            }
            c->stats.kv_bytes_read += 2 * (uint64_t)(pos[r] + 1) * nkv * c->kv_row_bytes;
        }
        attn_job job = {.c = c, .il = il, .n = n, .seq = seq, .pos = pos};
        atomic_init(&job.next, 0);
        ks_pool_run(c->pool, attn_worker, &job);
        matmul_w(c, &L->wo, c->att, n, c->xn);
        for (size_t i = 0; i < (size_t)n * D; i++) c->x[i] += c->xn[i];
        for (int r = 0; r < n; r++) ks_rmsnorm(c->xn + (size_t)r * D, c->x + (size_t)r * D, L->ffn_norm, D, hp->rms_eps);
        matmul_w(c, &L->w_gate, c->xn, n, c->gate);
        matmul_w(c, &L->w_up, c->xn, n, c->up);
        for (size_t i = 0; i < (size_t)n * hp->n_ff; i++) {
            float g = c->gate[i];
            c->gate[i] = g / (1.0f + expf(-g)) * c->up[i];
        }
        matmul_w(c, &L->w_down, c->gate, n, c->xn);
        for (size_t i = 0; i < (size_t)n * D; i++) c->x[i] += c->xn[i];
    }
    if (!want || !logits_out) return;
    int n_want = 0;
    for (int r = 0; r < n; r++)
        if (want[r]) ks_rmsnorm(c->xn + (size_t)(n_want++) * D, c->x + (size_t)r * D, m->output_norm, D, hp->rms_eps);
    if (n_want) matmul_w(c, &m->output, c->xn, n_want, logits_out);
}

static ks_status check_tokens(const ks_context *c, const int32_t *tokens, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->model->hp.n_vocab)
            return KS_FAIL(KS_ERR_INVALID_ARG, "token %d at index %d is outside the vocabulary [0, %d)", tokens[i], i,
                           c->model->hp.n_vocab);
    return KS_OK;
}

ks_status ks_prefill(ks_context *c, int32_t seq, const int32_t *tokens, int32_t n, float *logits,
                     float *all_logits) {
    if (!c || !tokens) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL context or tokens");
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, c->n_seq);
    if (n <= 0) return KS_FAIL(KS_ERR_INVALID_ARG, "empty prompt (%d tokens)", n);
    if ((int64_t)c->seq_len[seq] + n > c->n_ctx)
        return KS_FAIL(KS_ERR_CONTEXT_FULL, "%d tokens + %d already in sequence %d exceed the context of %d", n,
                       c->seq_len[seq], seq, c->n_ctx);
    KS_TRY(check_tokens(c, tokens, n));
    double t0 = ks_time_sec();
    int chunk = c->params.n_batch;
    int32_t *sq = ks_malloc(sizeof(int32_t) * chunk), *ps = ks_malloc(sizeof(int32_t) * chunk);
    bool *want = ks_calloc((size_t)chunk, sizeof(bool));
    size_t V = (size_t)c->model->hp.n_vocab;
    for (int32_t off = 0; off < n; off += chunk) {
        int m = n - off < chunk ? n - off : chunk;
        bool last_chunk = off + m == n;
        for (int i = 0; i < m; i++) {
            sq[i] = seq;
            ps[i] = c->seq_len[seq] + i;
            want[i] = all_logits != NULL || (logits != NULL && last_chunk && i == m - 1);
        }
        float *dst = all_logits ? all_logits + (size_t)off * V : logits;
        forward_rows(c, m, sq, ps, tokens + off, want, dst);
        c->seq_len[seq] += m;
    }
    if (all_logits && logits) memcpy(logits, all_logits + (size_t)(n - 1) * V, V * sizeof(float));
    ks_free(sq);
    ks_free(ps);
    ks_free(want);
    c->stats.tokens_prefilled += (uint64_t)n;
    c->stats.prefill_seconds += ks_time_sec() - t0;
    return KS_OK;
}

ks_status ks_decode(ks_context *c, const int32_t *seqs, const int32_t *tokens, int32_t n, float *logits) {
    if (!c || !seqs || !tokens) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL argument");
    if (n <= 0 || n > c->max_rows) return KS_FAIL(KS_ERR_INVALID_ARG, "batch of %d sequences (1..%d allowed)", n, c->max_rows);
    for (int32_t i = 0; i < n; i++) {
        if (seqs[i] < 0 || seqs[i] >= c->n_seq)
            return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seqs[i], c->n_seq);
        for (int32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d appears twice in one step", seqs[i]);
        if (c->seq_len[seqs[i]] + 1 > c->n_ctx)
            return KS_FAIL(KS_ERR_CONTEXT_FULL, "sequence %d is full (%d tokens)", seqs[i], c->n_ctx);
    }
    KS_TRY(check_tokens(c, tokens, n));
    double t0 = ks_time_sec();
    int32_t *ps = ks_malloc(sizeof(int32_t) * (size_t)n);
    bool *want = ks_malloc(sizeof(bool) * (size_t)n);
    for (int32_t i = 0; i < n; i++) {
        ps[i] = c->seq_len[seqs[i]];
        want[i] = true;
    }
    forward_rows(c, n, seqs, ps, tokens, logits ? want : NULL, logits);
    for (int32_t i = 0; i < n; i++) c->seq_len[seqs[i]]++;
    ks_free(ps);
    ks_free(want);
    c->stats.tokens_decoded += (uint64_t)n;
    c->stats.decode_seconds += ks_time_sec() - t0;
    return KS_OK;
}

typedef struct {
    ks_context *c;
    int32_t seq, n;
    const float *noise; /* [n_noise] */
    size_t n_noise;
} fill_job;

static void fill_worker(void *arg, int ith, int nth) {
    fill_job *j = arg;
    ks_context *c = j->c;
    const ks_hparams *hp = &c->model->hp;
    int hd = hp->head_dim;
    size_t units = (size_t)hp->n_layer * hp->n_head_kv * 2;
    for (size_t u = (size_t)ith; u < units; u += (size_t)nth) {
        int il = (int)(u / (hp->n_head_kv * 2)), h = (int)(u / 2 % hp->n_head_kv);
        uint8_t *const *cache = (u % 2) ? c->v : c->k;
        for (int32_t p = 0; p < j->n; p++) {
            size_t off = ((size_t)p * 7919 + u * 104729) % (j->n_noise - (size_t)hd);
            store_kv_row(c, kv_row(c, cache, il, j->seq, h, p), j->noise + off);
        }
    }
}

ks_status ks_seq_fill_synthetic(ks_context *c, int32_t seq, int32_t n, uint64_t seed) {
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range", seq);
    if (n < 0 || n > c->n_ctx) return KS_FAIL(KS_ERR_CONTEXT_FULL, "depth %d exceeds the context of %d", n, c->n_ctx);
    /* values are Gaussian noise: only the bytes matter for bandwidth benchmarks */
    size_t n_noise = 1 << 16;
    float *noise = ks_malloc(sizeof(float) * n_noise);
    ks_rng rng = {seed};
    for (size_t i = 0; i < n_noise; i++) noise[i] = ks_rng_normal(&rng);
    fill_job j = {.c = c, .seq = seq, .n = n, .noise = noise, .n_noise = n_noise};
    ks_pool_run(c->pool, fill_worker, &j);
    ks_free(noise);
    c->seq_len[seq] = n;
    return KS_OK;
}
