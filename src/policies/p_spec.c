/*
 * p_spec.c — `spec`: SpeContext's lightweight retrieval head.
 *
 * The distilled draft model (an EAGLE-3 DLM of the target) is loaded pruned
 * to what computes attention weights — embedding (or the target's), fc over
 * three fused target hidden states, the two norms, q_proj and k_proj — and
 * runs once per decode step, *before* the target, to choose the tokens every
 * layer of the target will read:
 *
 *   x_t = [input_norm(e(tok_t)); hidden_norm(fc([h_lo; h_mid; h_hi]_{t-1}))]
 *   q_t = RoPE(q_proj x_t),  k_t = RoPE(k_proj x_t)    (EAGLE's one-token shift)
 *   p_g = softmax(q_t,g . K / sqrt(d)) per DLM query head g
 *   w   = max over the query heads of a KV head's group of p_g  (GQA / MQA;
 *         MHA: G = 1, per head)
 *   top-B tokens per KV head, the same set for every layer (plus the
 *   framework's sinks and recent window).
 *
 * The head itself (its keys and queries, K cache and each step's
 * selection) is spec_head.c's, with the design notes on its cost.
 *
 * Long contexts: when the context exceeds the DLM's trained length the head's
 * RoPE gets YaRN scaling (training-free; `yarn=auto` default, `off`, or an
 * explicit factor), composed with the checkpoint's own rope_scaling
 * (ks_eagle3_add_yarn: YaRN's per-dimension ratio applied to the linear /
 * llama3 / yarn frequencies of config.json, not in their place).
 *
 * Loading and memory (engine side, src/infer/tiers.c and src/kv): the
 * selection is global, so the engine hands it to the store for every
 * offloaded layer before the layers run; each layer keeps a fixed buffer of
 * B + P - 1 entry slots per sequence and KV head (the paper's B; the P - 1
 * are for page-granular policies' rounding and stay unused by spec) and
 * copies only S_now - S_last (Section 5.4).  The memory model (kv/memplan.c)
 * counts B per offloaded layer and head as M_part does; its alpha is the
 * per-token scratch kvsieve's workers really allocate, not the paper's GQA
 * group count (its repeat_kv buffer, which kvsieve's kernels never
 * materialise): docs/results/POLICIES.md, "Deviations".  `variant=embed` is the embedding-only head (no fused
 * states) the paper describes as the cheaper option.
 *
 * Arguments: dlm=DIR (required: an EAGLE-3 checkpoint directory),
 * variant=fused|embed, yarn=auto|off|FACTOR,
 * weights=auto|q8_0|q6_k|q5_k|q4_k|native (the projections requantised at
 * load, or in the checkpoint's precision; auto, the default, is q6_k where
 * the rows are whole Q6_K blocks and the host packs Q6_K, else q8_0 where
 * they are whole Q8_0 blocks),
 * kcache=q8_0|f16 (the head's K cache rows; q8_0 by default),
 * aux_ids=[in:|out:]A:B:C (the fused states' layers, overriding the checkpoint's).
 */
#include "spec/spec_head.h"
#include "spec/spec_score.h"

#include "matmul/matmul.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const spec_args[] = {"dlm", "variant", "yarn", "weights", "kcache", "aux_ids", NULL};

/* aux_ids=[in:|out:]A:B:C — the fused states' layers, overriding the
 * checkpoint's: "in" (the default) counts the residual streams entering
 * layers A, B, C (EAGLE, vLLM), "out" the outputs of layers A, B, C
 * (SpecForge, SGLang). */
static ks_status parse_aux_ids(const char *arg, int32_t ids[3], bool *outputs) {
    const char *v = arg;
    *outputs = false;
    if (!strncmp(v, "out:", 4)) { *outputs = true; v += 4; }
    else if (!strncmp(v, "in:", 3)) v += 3;
    for (int i = 0; i < 3; i++) {
        char *end;
        long x = strtol(v, &end, 10);
        if (end == v || x < 0 || x > 100000 || (i < 2 ? *end != ':' : *end != 0))
            return KS_FAIL(KS_ERR_INVALID_ARG, "spec aux_ids=%s: expected [in:|out:]A:B:C (three layer ids)", arg);
        ids[i] = (int32_t)x;
        v = end + 1;
    }
    return KS_OK;
}

/* ------------------------------------------------------------- hooks -- */
static void spec_destroy(void *state) {
    spec_state *s = state;
    if (!s) return;
    ks_eagle3_destroy(s->dlm);
    ks_free(s->own_w);
    ks_free(s->kc);
    ks_free(s->klen);
    ks_free(s->ring);
    ks_free(s->ring_pos);
    ks_free(s->bnd);
    ks_free(s->pend_h);
    ks_free_aligned(s->x);
    ks_free_aligned(s->f);
    ks_free_aligned(s->q);
    ks_free_aligned(s->k);
    ks_free_aligned(s->mm);
    ks_free(s->emb);
    ks_free(s->sel);
    ks_free(s->sel_n);
    ks_free(s->sel_pos);
    ks_free(s->scr);
    ks_free(s);
}


static ks_status spec_create(const ks_policy_env *env, const ks_policy_spec *p, void **state) {
    char dir[1024], variant[16], yarn[32], wtype[16], kctype[16], auxs[64];
    KS_TRY(ks_args_str(p->args, "dlm", "", dir, sizeof dir));
    KS_TRY(ks_args_str(p->args, "weights", "auto", wtype, sizeof wtype));
    bool weights_auto = !strcmp(wtype, "auto");
    ks_dtype requant_to = !strcmp(wtype, "q6_k")   ? KS_DTYPE_Q6_K
                          : !strcmp(wtype, "q5_k") ? KS_DTYPE_Q5_K
                          : !strcmp(wtype, "q4_k") ? KS_DTYPE_Q4_K
                                                   : KS_DTYPE_Q8_0;
    bool requant = weights_auto || !strcmp(wtype, "q8_0") || requant_to != KS_DTYPE_Q8_0;
    if (!requant && strcmp(wtype, "native"))
        return KS_FAIL(KS_ERR_INVALID_ARG, "spec weights=%s: expected auto, q8_0, q6_k, q5_k, q4_k or native", wtype);
    KS_TRY(ks_args_str(p->args, "kcache", "q8_0", kctype, sizeof kctype));
    bool kc_q8 = !strcmp(kctype, "q8_0");
    if (!kc_q8 && strcmp(kctype, "f16"))
        return KS_FAIL(KS_ERR_INVALID_ARG, "spec kcache=%s: expected f16 or q8_0", kctype);
    KS_TRY(ks_args_str(p->args, "variant", "fused", variant, sizeof variant));
    KS_TRY(ks_args_str(p->args, "yarn", "auto", yarn, sizeof yarn));
    KS_TRY(ks_args_str(p->args, "aux_ids", "", auxs, sizeof auxs));
    int32_t aux_override[3];
    bool aux_out = false;
    if (auxs[0]) KS_TRY(parse_aux_ids(auxs, aux_override, &aux_out));
    if (!dir[0])
        return KS_FAIL(KS_ERR_INVALID_ARG,
                       "policy spec found no draft model for this model: it looks for MODEL-dlm/ beside MODEL.gguf. Pass "
                       "--policy-arg spec.dlm=DIR (an EAGLE-3 draft: config.json with model.safetensors or pytorch_model.bin; "
                       "docs/DLM.md lists the published drafts and their models), or distil one for a llama GGUF from your own text: "
                       "/usr/bin/python3 tools/make_dlm.py --target MODEL.gguf --text FILE... (writes MODEL-dlm/; resumable; "
                       "docs/DLM.md); kvsieve gen-model --dlm-out DIR writes a random head of the right shape (speed runs only)");
    bool embed_only = !strcmp(variant, "embed");
    if (!embed_only && strcmp(variant, "fused"))
        return KS_FAIL(KS_ERR_INVALID_ARG, "spec variant=%s: expected fused or embed", variant);
    if (!env->tok_embd.data || !env->pool) return KS_FAIL(KS_ERR_INVALID_ARG, "spec needs the target model and a thread pool");
    ks_eagle3_params ep = ks_eagle3_default_params();
    ep.head_only = true;
    ep.embed_only = embed_only;
    ks_eagle3 *dlm = NULL;
    KS_TRY(ks_eagle3_load(dir, ep, &dlm));
    if (auxs[0]) ks_eagle3_set_aux_layers(dlm, aux_override, aux_out, "spec aux_ids=");
    spec_state *s = ks_calloc(1, sizeof *s);
    if (!s) {
        ks_eagle3_destroy(dlm);
        return KS_FAIL(KS_ERR_NOMEM, "spec policy");
    }
    s->dlm = dlm;
    s->env = *env;
    s->p = *p;
    s->embed_only = embed_only;
    ks_eagle3_target target = {.n_vocab = env->n_vocab,
                               .n_embd = env->n_embd,
                               .n_layer = env->n_layer,
                               .n_head = env->n_head,
                               .n_head_kv = env->n_head_kv,
                               .head_dim = env->head_dim};
    ks_status st = ks_eagle3_check_target(dlm, &target);
    const ks_eagle3_config *c = &dlm->cfg;
    if (st == KS_OK && c->head_dim % 2)
        st = KS_FAIL(KS_ERR_UNSUPPORTED, "DLM head dim %d is odd", c->head_dim);
    if (st == KS_OK && c->n_head_kv > 0 && c->n_head / c->n_head_kv > KS_SPEC_GROUP_MAX)
        st = KS_FAIL(KS_ERR_UNSUPPORTED, "DLM has %d query heads per KV head, over the %d spec's group reduction takes",
                     c->n_head / c->n_head_kv, KS_SPEC_GROUP_MAX);
    if (st == KS_OK && c->head_dim > KS_SPEC_HD_MAX)
        st = KS_FAIL(KS_ERR_UNSUPPORTED, "DLM head dim %d is over the %d the scoring kernels take", c->head_dim,
                     KS_SPEC_HD_MAX);
    if (st == KS_OK && !dlm->has_embed && c->hidden_size != env->n_embd)
        st = KS_FAIL(KS_ERR_INVALID_ARG, "DLM without embed_tokens needs the target's hidden size %d (has %d)",
                     env->n_embd, c->hidden_size);
    const ks_eagle3_mat *mats[3] = {&dlm->wq, &dlm->wk, embed_only ? NULL : &dlm->fc};
    ks_weight *projs[3] = {&s->proj_q, &s->proj_k, &s->proj_fc};
    for (int i = 0; i < 3 && st == KS_OK; i++) /* the checkpoint's rows, as ks_matmul reads them */
        if (mats[i]) {
            *projs[i] = (ks_weight){.rows = mats[i]->rows, .cols = mats[i]->cols, .data = mats[i]->data,
                                    .layout = KS_WEIGHT_ROWS};
            st = ks_spec_dtype_of(mats[i], &projs[i]->type);
        }
    /* auto: Q6_K where its 256-column blocks tile the rows and the host
     * reads Q6_K in eight-row groups (AVX-512 VNNI), else Q8_0 wherever its
     * 32-column blocks do, else native.  Each was measured within noise of
     * the one before at fewer bytes a step (docs/results/EVAL.md, "spec's
     * projections in Q8_0" and "... in Q6_K"). */
    if (st == KS_OK && weights_auto) {
        static const uint8_t no_bytes[1]; /* can_pack asks for bound data, never reads it */
        ks_weight probe = {.type = KS_DTYPE_Q6_K, .rows = 8, .cols = KS_QK_K, .data = no_bytes, .layout = KS_WEIGHT_ROWS};
        if (ks_matmul_can_pack(&probe) && ks_spec_requantize_fits(dlm, embed_only, KS_DTYPE_Q6_K))
            requant_to = KS_DTYPE_Q6_K;
        else if (!ks_spec_requantize_fits(dlm, embed_only, requant_to)) requant = false;
    }
    if (st == KS_OK && requant) st = ks_spec_requantize(s, embed_only, requant_to);
    /* YaRN when the context outgrows the DLM's training length */
    if (st == KS_OK && strcmp(yarn, "off")) {
        double factor = 0;
        if (!strcmp(yarn, "auto")) {
            if (c->max_pos > 0 && env->n_ctx > c->max_pos) factor = (double)env->n_ctx / c->max_pos;
        } else {
            char *end;
            factor = strtod(yarn, &end);
            if (*end || !(factor >= 1.0 && factor <= 1024))
                st = KS_FAIL(KS_ERR_INVALID_ARG, "spec yarn=%s: expected auto, off or a factor >= 1", yarn);
        }
        if (st == KS_OK && factor > 1.0) {
            /* on top of the checkpoint's own scaling, whose max_position_embeddings is the length it reaches */
            st = ks_eagle3_add_yarn(dlm, (float)factor, c->max_pos > 0 ? c->max_pos : env->n_ctx);
            if (st == KS_OK)
                KS_LOG(INFO, "spec: YaRN x%.2f on the retrieval head, over its own RoPE scaling (%s; trained %d, "
                       "context %d)", factor, c->rope.type == KS_ROPE_SCALING_NONE ? "none" : "from config.json",
                       c->max_pos, env->n_ctx);
        }
    }
    if (st != KS_OK) {
        spec_destroy(s);
        return st;
    }
    s->H = c->hidden_size;
    s->tH = env->n_embd;
    s->Hq = c->n_head;
    s->Hkv = c->n_head_kv;
    s->hd = c->head_dim;
    s->G = s->Hq / s->Hkv;
    if (!embed_only) {
        s->n_aux = 3;
        ks_eagle3_aux_layers(dlm, env->n_layer, s->aux);
        KS_LOG(INFO, "spec: fusing the residual streams entering target layers %d, %d, %d (%s%s)%s", s->aux[0], s->aux[1],
               s->aux[2], c->aux_source, auxs[0] ? auxs : "", dlm->fc_norm[0] ? ", fc_norm on each" : "");
    }
    size_t n_seq = (size_t)env->n_seq, n_ctx = (size_t)env->n_ctx;
    s->kc_type = kc_q8 ? KS_DTYPE_Q8_0 : KS_DTYPE_F16;
    s->kc_rb = ks_spec_kcache_row_bytes(s->kc_type, s->hd);
    s->kc = ks_malloc(s->kc_rb * n_seq * s->Hkv * n_ctx);
    s->klen = ks_calloc(n_seq, sizeof(int32_t));
    if (s->n_aux) {
        s->ring = ks_malloc(sizeof(float) * n_seq * SPEC_RING * s->n_aux * s->tH);
        s->pend_h = ks_malloc(sizeof(float) * SPEC_FLUSH * s->n_aux * s->tH);
    }
    s->ring_pos = ks_malloc(sizeof(int32_t) * n_seq * SPEC_RING);
    s->emb = ks_malloc(sizeof(float) * (size_t)(s->H > s->tH ? s->H : s->tH));
    s->sel = ks_malloc(sizeof(int32_t) * n_seq * s->Hkv * n_ctx);
    s->sel_n = ks_calloc(n_seq * s->Hkv, sizeof(int32_t));
    s->sel_pos = ks_malloc(sizeof(int32_t) * n_seq);
    s->step_weight_bytes = ks_weight_bytes(&s->proj_q) + ks_weight_bytes(&s->proj_k);
    if (!embed_only) s->step_weight_bytes += ks_weight_bytes(&s->proj_fc);
    s->n_scr_threads = ks_pool_size(env->pool);
    s->scr = ks_malloc(sizeof(float) * (size_t)s->n_scr_threads * (s->G + 1) * n_ctx);
    if (s->n_aux && env->kv) /* the hidden states at page boundaries (prefix caching) */
        s->bnd = ks_calloc(n_seq * (n_ctx / (size_t)ks_kv_page_size(env->kv)), sizeof(float) * s->n_aux * s->tH);
    if (!s->kc || !s->klen || (s->n_aux && (!s->ring || !s->pend_h)) || !s->ring_pos || !s->emb || !s->sel ||
        !s->sel_n || !s->sel_pos || !s->scr || (s->n_aux && env->kv && !s->bnd)) {
        spec_destroy(s);
        return KS_FAIL(KS_ERR_NOMEM, "spec: key cache of %zu x %zu", n_seq, n_ctx);
    }
    for (size_t i = 0; i < n_seq * SPEC_RING; i++) s->ring_pos[i] = -1;
    for (size_t i = 0; i < n_seq; i++) s->sel_pos[i] = -1;
    char desc[512];
    if (ks_eagle3_describe(dlm, desc, sizeof desc) == KS_OK) KS_LOG(DEBUG, "spec: %s", desc);
    KS_LOG(INFO, "spec: retrieval head %.2fM params of %.2fM (%.1f%% fewer)%s", dlm->n_params_head / 1e6,
           dlm->n_params_ckpt / 1e6, dlm->n_params_ckpt ? 100.0 * (1 - (double)dlm->n_params_head / dlm->n_params_ckpt) : 0,
           embed_only ? ", embedding-only variant" : "");
    *state = s;
    return KS_OK;
}

static void spec_seq_reset(void *state, int32_t seq) {
    spec_state *s = state;
    s->klen[seq] = 0;
    s->sel_pos[seq] = -1;
    for (int i = 0; i < SPEC_RING; i++) s->ring_pos[(size_t)seq * SPEC_RING + i] = -1;
    for (int32_t k = 0; k < s->Hkv; k++) s->sel_n[(size_t)seq * s->Hkv + k] = 0;
    int32_t w = 0;
    for (int32_t i = 0; i < s->n_pend; i++)
        if (s->pend_seq[i] != seq) { /* keep other sequences' pending rows */
            s->pend_seq[w] = s->pend_seq[i];
            s->pend_pos[w] = s->pend_pos[i];
            s->pend_tok[w] = s->pend_tok[i];
            if (s->n_aux)
                memmove(s->pend_h + (size_t)w * s->n_aux * s->tH, s->pend_h + (size_t)i * s->n_aux * s->tH,
                        sizeof(float) * s->n_aux * s->tH);
            w++;
        }
    s->n_pend = w;
}

static int32_t spec_hidden_layers(void *state, int32_t out[3]) {
    spec_state *s = state;
    for (int i = 0; i < s->n_aux; i++) out[i] = s->aux[i];
    return s->n_aux;
}

static void spec_on_hidden(void *state, int32_t seq, int32_t pos, int32_t token, const float *h) {
    spec_state *s = state;
    size_t w = (size_t)s->n_aux * s->tH;
    if (pos >= s->env.n_ctx) return; /* pseudo tokens past the context: nothing to keep */
    if (pos >= s->klen[seq] || s->sel_pos[seq] != pos) {
        /* a prompt row: its key needs the previous position's states */
        if (s->n_pend == SPEC_FLUSH) ks_spec_flush_pending(s);
        int32_t i = s->n_pend++;
        s->pend_seq[i] = seq;
        s->pend_pos[i] = pos;
        s->pend_tok[i] = token;
        const float *prev = ks_spec_ring_get(s, seq, pos - 1);
        if (w) {
            if (prev) memcpy(s->pend_h + i * w, prev, sizeof(float) * w);
            else memset(s->pend_h + i * w, 0, sizeof(float) * w);
        }
    }
    if (w) {
        int32_t slot = pos % SPEC_RING;
        memcpy(s->ring + ((size_t)seq * SPEC_RING + slot) * w, h, sizeof(float) * w);
        s->ring_pos[(size_t)seq * SPEC_RING + slot] = pos;
        float *b = ks_spec_bnd_at(s, seq, pos);
        if (b) memcpy(b, h, sizeof(float) * w);
    }
}

/* Prefix caching: per position, each KV head's K cache row; per block, the
 * hidden states of its last position (the next position's key reads them). */
static size_t spec_prefix_bytes(void *state, int32_t n) {
    spec_state *s = state;
    return (size_t)n * s->Hkv * s->kc_rb + sizeof(float) * (size_t)s->n_aux * s->tH;
}

static ks_status spec_prefix_save(void *state, int32_t seq, int32_t first, int32_t n, uint8_t *out) {
    spec_state *s = state;
    if (first + n > s->klen[seq]) return KS_FAIL(KS_ERR_INVALID_ARG, "spec: no keys for positions [%d, %d)", first, first + n);
    size_t w = (size_t)s->n_aux * s->tH;
    const float *h = w ? ks_spec_bnd_at(s, seq, first + n - 1) : NULL;
    if (w && !h) return KS_FAIL(KS_ERR_INVALID_ARG, "spec: blocks must end at a page boundary");
    for (int32_t p = first; p < first + n; p++)
        for (int32_t g = 0; g < s->Hkv; g++, out += s->kc_rb) memcpy(out, ks_spec_kc_at(s, seq, g, p), s->kc_rb);
    if (w) memcpy(out, h, sizeof(float) * w);
    return KS_OK;
}

static ks_status spec_prefix_load(void *state, int32_t seq, int32_t first, int32_t n, const uint8_t *in) {
    spec_state *s = state;
    if (first + n > s->env.n_ctx) return KS_FAIL(KS_ERR_CONTEXT_FULL, "spec: restore past the context");
    for (int32_t p = first; p < first + n; p++)
        for (int32_t g = 0; g < s->Hkv; g++, in += s->kc_rb) memcpy(ks_spec_kc_at(s, seq, g, p), in, s->kc_rb);
    if (first + n > s->klen[seq]) s->klen[seq] = first + n;
    size_t w = (size_t)s->n_aux * s->tH;
    if (w) {
        int32_t pos = first + n - 1, slot = pos % SPEC_RING;
        memcpy(s->ring + ((size_t)seq * SPEC_RING + slot) * w, in, sizeof(float) * w);
        s->ring_pos[(size_t)seq * SPEC_RING + slot] = pos;
        float *b = ks_spec_bnd_at(s, seq, pos);
        if (b) memcpy(b, in, sizeof(float) * w);
    }
    return KS_OK;
}

static ks_status spec_prefill(void *state, const ks_prefill_info *info) {
    spec_state *s = state;
    if (s->embed_only) { /* no hidden states: keys from the prompt tokens alone */
        for (int32_t i = 0; i < info->n_prompt; i++) {
            if (s->n_pend == SPEC_FLUSH) ks_spec_flush_pending(s);
            int32_t j = s->n_pend++;
            s->pend_seq[j] = info->seq;
            s->pend_pos[j] = info->first_pos + i;
            s->pend_tok[j] = info->prompt[i];
        }
    }
    ks_spec_flush_pending(s);
    if (s->refused) {
        s->refused = false;
        return KS_FAIL(KS_ERR_NOMEM, "spec: key rows of the prompt refused");
    }
    /* a longer earlier history (pseudo tokens) must not count as keys */
    int32_t end = info->first_pos + info->n_prompt;
    if (s->klen[info->seq] > end) s->klen[info->seq] = end;
    return KS_OK;
}

/* entry index of position pos in (seq, layer, head), or -1 (binary search over
 * the increasing positions of the entries) */
static int32_t entry_of(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head, int32_t pos, int32_t n) {
    int32_t P = ks_policy_kv_page_size(env), lo = 0, hi = n - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        ks_kv_page_meta m;
        ks_policy_kv_page_meta(env, seq, layer, head, mid / P, &m);
        int32_t p = m.pos[mid % P];
        if (p == pos) return mid;
        if (p < pos) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static ks_status spec_select(void *state, const ks_select_req *req, ks_selection *out) {
    spec_state *s = state;
    out->pages = false;
    out->n = 0;
    if (s->sel_pos[req->seq] != req->pos) return KS_OK; /* no selection for this step: sinks + window */
    int32_t kvh = req->head; /* DLM KV heads map one to one to the target's */
    const int32_t *sel = s->sel + ((size_t)req->seq * s->Hkv + kvh) * s->env.n_ctx;
    int32_t k = s->sel_n[(size_t)req->seq * s->Hkv + kvh];
    bool evicted = req->n_entries != req->pos + 1;
    for (int32_t i = 0; i < k && out->n < out->cap; i++) {
        int32_t e = evicted ? entry_of(&s->env, req->seq, req->layer, req->head, sel[i], req->n_entries) : sel[i];
        if (e >= 0) out->idx[out->n++] = e;
    }
    return KS_OK;
}

static size_t spec_weight_bytes(void *state) {
    const ks_eagle3 *d = ((spec_state *)state)->dlm;
    size_t b = (size_t)(d->n_params_head - d->n_params_embed) * 4; /* f32 as used */
    return d->has_embed ? b + (size_t)d->n_params_embed * ks_st_dtype_size(d->embed.dtype) : b;
}

/* benchmarks: a K cache of noise, as deep as the synthetic KV */
static void spec_fill_synthetic(void *state, int32_t seq, int32_t n, uint64_t seed) {
    spec_state *s = state;
    ks_rng r = {seed ^ 0x5eedull};
    for (int32_t kvh = 0; kvh < s->Hkv; kvh++)
        for (int32_t p = 0; p < n && p < s->env.n_ctx; p++) {
            float k[KS_SPEC_HD_MAX];
            for (int i = 0; i < s->hd; i++) k[i] = ks_rng_normal(&r);
            ks_spec_kcache_store(s->kc_type, k, s->hd, ks_spec_kc_at(s, seq, kvh, p));
        }
    s->klen[seq] = n;
}

static void spec_counters(void *state, ks_policy_counters *out) {
    out->selections += ((spec_state *)state)->selections;
    out->bytes_read += ((spec_state *)state)->bytes_read;
}

static const ks_policy_select_i spec_select_i = {
    .global = true,
    .same_every_layer = true,
    .seq_reset = spec_seq_reset,
    .before_step = ks_spec_before_step,
    .select_layer = spec_select,
    .counters = spec_counters,
    .seq_fill_synthetic = spec_fill_synthetic,
};

static const ks_policy_prefill_i spec_prefill_i = {
    .on_prefill = spec_prefill,
};

static const ks_policy_hidden_i spec_hidden_i = {
    .weight_bytes = spec_weight_bytes,
    .own_kcache = true,
    .hidden_layers = spec_hidden_layers,
    .on_hidden = spec_on_hidden,
    .needs_dlm = true,
};

static const ks_policy_prefix_i spec_prefix_i = {
    .state_bytes = spec_prefix_bytes,
    .state_save = spec_prefix_save,
    .state_load = spec_prefix_load,
};

const ks_policy_i ks_policy_specontext = { /* `spec`: the type ks_policy_spec is the parsed choice */
    .name = "spec",
    .summary = "SpeContext: a distilled retrieval head picks the top tokens per KV head once per step for all layers",
    .prefix_why = "the retrieval head's keys of the restored positions, and the hidden states of a block's last position, are saved and restored with the blocks",
    .create = spec_create,
    .destroy = spec_destroy,
    .arg_names = spec_args,
    .select = &spec_select_i,
    .prefill = &spec_prefill_i,
    .hidden = &spec_hidden_i,
    .prefix = &spec_prefix_i,
};

