/*
 * eagle3_gen.c — write EAGLE-3 checkpoints: a small safetensors writer and a
 * deterministic random retrieval-head generator for a target shape.
 *
 * Why random heads: throughput of SpeContext on a Llama-3.2-1B-shaped target
 * depends on the head's shapes (fc 3H -> H, q/k 2H -> heads x d), not on its
 * values, and no trained DLM of that size can be downloaded here.  The file
 * has the public EAGLE-3 layout (config.json + model.safetensors, tensor
 * names under "midlayer."), holds only the retrieval head (SpeContext prunes
 * the rest anyway), shares the target's embedding (no embed_tokens, as most
 * public checkpoints), and is BF16 like them.  The writer streams: header,
 * then each tensor's bytes; a failed write removes the partial file.
 */
#include "model/eagle3_gen.h"
#include "model/shapes.h"
#include "tensor/dtype.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

ks_status ks_safetensors_write(const char *path, const ks_st_write_tensor *t, int n, const char *metadata_json) {
    cJSON *hdr = cJSON_CreateObject();
    if (metadata_json) {
        cJSON *md = cJSON_Parse(metadata_json);
        if (!md) {
            cJSON_Delete(hdr);
            return KS_FAIL(KS_ERR_INVALID_ARG, "safetensors metadata is not JSON");
        }
        cJSON_AddItemToObject(hdr, "__metadata__", md);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "dtype", ks_st_dtype_name(t[i].dtype));
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        uint64_t elems = 1;
        for (int d = 0; d < t[i].n_dims; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
            elems *= (uint64_t)t[i].shape[d];
        }
        if (elems * ks_st_dtype_size(t[i].dtype) != t[i].nbytes) {
            cJSON_Delete(o);
            cJSON_Delete(hdr);
            return KS_FAIL(KS_ERR_INVALID_ARG, "tensor %s: %zu bytes for its shape", t[i].name, t[i].nbytes);
        }
        cJSON *offs = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + t[i].nbytes)));
        cJSON_AddItemToObject(hdr, t[i].name, o);
        off += t[i].nbytes;
    }
    char *text = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        cJSON_free(text);
        return KS_FAIL(KS_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    bool ok = fwrite(le, 1, 8, f) == 8 && fwrite(text, 1, len, f) == len;
    for (size_t i = len; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    cJSON_free(text);
    for (int i = 0; ok && i < n; i++) ok = fwrite(t[i].data, 1, t[i].nbytes, f) == t[i].nbytes;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        remove(path);
        return KS_FAIL(KS_ERR_IO, "writing %s failed (disk full?)", path);
    }
    return KS_OK;
}

static uint16_t bf16_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static uint16_t *random_bf16(size_t n, ks_rng *r, float scale, float offset) {
    uint16_t *x = ks_malloc(sizeof(uint16_t) * n);
    if (!x) return NULL;
    for (size_t i = 0; i < n; i++) x[i] = bf16_of(offset + scale * (float)(ks_rng_uniform(r) * 2 - 1));
    return x;
}

ks_status ks_eagle3_generate_head(const ks_model_shape *s, int32_t n_layer, int32_t n_vocab, int32_t max_pos,
                                  uint64_t seed, const char *dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return KS_FAIL(KS_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
    int32_t L = n_layer > 0 ? n_layer : s->n_layer, H = s->n_embd, hd = s->head_dim;
    int32_t aux[3] = {L >= 3 ? 2 : 0, L / 2, L >= 3 ? L - 3 : L - 1}; /* EAGLE-3's default [2, L/2, L-3] */
    char cfg[2048], p[4096];
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"LlamaForCausalLMEagle3\"],\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
             "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"num_hidden_layers\": 1,\n"
             "  \"vocab_size\": %d,\n  \"draft_vocab_size\": %d,\n  \"rms_norm_eps\": %g,\n  \"rope_theta\": %.1f,\n"
             "  \"max_position_embeddings\": %d,\n  \"hidden_act\": \"silu\",\n  \"torch_dtype\": \"bfloat16\",\n"
             "  \"eagle_aux_hidden_state_layer_ids\": [%d, %d, %d],\n  \"target_model\": \"%s (random, kvsieve gen-model --dlm-out)\"\n}\n",
             H, s->n_ff, s->n_head, s->n_head_kv, hd, n_vocab, n_vocab, (double)s->rms_eps, (double)s->rope_theta,
             max_pos, aux[0], aux[1], aux[2], s->name);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    if (!f) return KS_FAIL(KS_ERR_IO, "cannot create %s: %s", p, strerror(errno));
    bool ok = fputs(cfg, f) >= 0;
    if (fclose(f) != 0 || !ok) return KS_FAIL(KS_ERR_IO, "writing %s failed", p);
    ks_rng r = {seed};
    size_t nfc = (size_t)H * 3 * H, nq = (size_t)s->n_head * hd * 2 * H, nk = (size_t)s->n_head_kv * hd * 2 * H;
    uint16_t *fc = random_bf16(nfc, &r, 1.0f / sqrtf(3.0f * H), 0);
    uint16_t *hn = random_bf16((size_t)H, &r, 0.05f, 1), *in = random_bf16((size_t)H, &r, 0.05f, 1);
    uint16_t *q = random_bf16(nq, &r, 1.0f / sqrtf(2.0f * H), 0), *k = random_bf16(nk, &r, 1.0f / sqrtf(2.0f * H), 0);
    ks_st_write_tensor t[] = {
        {"fc.weight", KS_ST_BF16, 2, {H, 3 * H}, fc, nfc * 2},
        {"midlayer.hidden_norm.weight", KS_ST_BF16, 1, {H}, hn, (size_t)H * 2},
        {"midlayer.input_layernorm.weight", KS_ST_BF16, 1, {H}, in, (size_t)H * 2},
        {"midlayer.self_attn.q_proj.weight", KS_ST_BF16, 2, {(int64_t)s->n_head * hd, 2 * H}, q, nq * 2},
        {"midlayer.self_attn.k_proj.weight", KS_ST_BF16, 2, {(int64_t)s->n_head_kv * hd, 2 * H}, k, nk * 2},
    };
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    ks_status st = !fc || !hn || !in || !q || !k
                       ? KS_FAIL(KS_ERR_NOMEM, "random draft head of hidden size %d", H)
                       : ks_safetensors_write(p, t, 5, "{\"format\": \"pt\", \"kvsieve\": \"random retrieval head\"}");
    ks_free(fc);
    ks_free(hn);
    ks_free(in);
    ks_free(q);
    ks_free(k);
    return st;
}
