/*
 * spec_head.h — the seams between the files of the `spec` policy: its
 * state, and what the policy's hooks (p_spec.c) need from the retrieval
 * head (spec_head.c).
 */
#ifndef KS_SPEC_SPEC_HEAD_H
#define KS_SPEC_SPEC_HEAD_H

#include "policy/policy.h"

#include "draft/eagle3.h"
#include "tensor/dtype.h"

enum { SPEC_RING = 64, SPEC_FLUSH = 256 };

typedef struct {
    ks_policy_env env;
    ks_policy_spec p;
    ks_eagle3 *dlm;
    bool embed_only;
    int32_t n_aux, aux[3];
    int32_t H, Hq, Hkv, hd, G, tH;        /* DLM hidden, heads, kv heads, head dim, group, target hidden */
    /* fc, q_proj and k_proj as the matmuls read them: the checkpoint's rows, or own_w's (requantised,
     * packed where the host packs the type: ks_spec_requantize) */
    ks_weight proj_fc, proj_q, proj_k;
    void *own_w;                          /* weights= a quantised type: fc, q_proj, k_proj requantised (owned), else NULL */
    uint8_t *kc;                          /* [n_seq][Hkv][n_ctx] rows of kc_rb bytes: head K cache by position */
    ks_dtype kc_type;                     /* KS_DTYPE_F16 or KS_DTYPE_Q8_0 (kcache=) */
    size_t kc_rb;                         /* bytes of one K cache row */
    int32_t *klen;                        /* [n_seq] positions with a key */
    float *ring;                          /* [n_seq][SPEC_RING][n_aux * tH] hidden states by position */
    int32_t *ring_pos;                    /* [n_seq][SPEC_RING] position held, -1 */
    /* prefix caching: the hidden states of each page's last position (the
     * next position's key needs them after a restore), allocated on first use */
    float *bnd;                           /* [n_seq][n_ctx / P][n_aux * tH] */
    int32_t bnd_P;
    /* pending prompt rows (keys to compute) */
    int32_t n_pend, pend_seq[SPEC_FLUSH], pend_pos[SPEC_FLUSH], pend_tok[SPEC_FLUSH];
    bool refused; /* a flush from a void hook lost its buffers: the next prefill or step reports KS_ERR_NOMEM */
    float *pend_h;                        /* [SPEC_FLUSH][n_aux * tH] hidden of pos-1 */
    /* batched scratch */
    float *x, *f, *q, *k, *emb;           /* [rows][2H], [rows][H], [rows][Hq*hd], [rows][Hkv*hd], [H] */
    void *mm;
    int32_t rows_cap;
    /* selections of the current step */
    int32_t *sel;                         /* [n_seq][Hkv][n_ctx] positions */
    int32_t *sel_n;                       /* [n_seq][Hkv] */
    int32_t *sel_pos;                     /* [n_seq] position the selection was made for */
    float *scr;                           /* [n_threads][Hq_group(G) * n_ctx + n_ctx] score scratch */
    int32_t n_scr_threads;
    uint64_t selections;
    uint64_t step_weight_bytes;           /* fc, q_proj, k_proj as the matmuls read them, once per step */
    uint64_t bytes_read;                  /* those per step plus the K cache each selection scored */
} spec_state;

static inline uint8_t *ks_spec_kc_at(spec_state *s, int32_t seq, int32_t kvh, int32_t pos) {
    return s->kc + (((size_t)seq * s->Hkv + kvh) * s->env.n_ctx + pos) * s->kc_rb;
}

/* The type ks_matmul reads a DLM matrix as (F32, F16 or BF16). */
ks_status ks_spec_dtype_of(const ks_eagle3_mat *m, ks_dtype *out);
/* weights=q8_0, q6_k, q5_k or q4_k (to: that type): fc, q_proj and k_proj
 * requantised into s->own_w, then packed where the host packs the
 * target's weights of that type (ks_matmul_can_pack). */
ks_status ks_spec_requantize(spec_state *s, bool embed_only, ks_dtype to);
/* Whether every projection's rows are whole blocks of type to. */
bool ks_spec_requantize_fits(const ks_eagle3 *dlm, bool embed_only, ks_dtype to);
/* Compute and store the keys of the pending prompt rows (s->refused when
 * the buffers are refused). */
void ks_spec_flush_pending(spec_state *s);
/* The hidden states kept for (seq, pos), or NULL. */
const float *ks_spec_ring_get(spec_state *s, int32_t seq, int32_t pos);
/* The boundary slot of pos when pos ends a page, else NULL. */
float *ks_spec_bnd_at(spec_state *s, int32_t seq, int32_t pos);
/* The before_step hook: the step's keys and queries, then each (row, KV
 * head)'s selection on the pool. */
ks_status ks_spec_before_step(void *state, const ks_step_info *step);

#endif
