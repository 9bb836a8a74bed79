/*
 * shapes.c — the table of model shapes and the random-weight GGUF generator.
 *
 * Shapes are copied from the models' published configs (hidden size, layers,
 * heads, KV heads, head_dim, intermediate size, rope theta, rms eps, context,
 * tie_word_embeddings, llama3 rope_scaling).  Metadata keys, tensor names and
 * ne orders follow what llama.cpp's converter writes, so the files load in
 * other GGUF readers too.  Mistral is stored as arch "llama", as llama.cpp
 * does.  For llama3 rope scaling llama.cpp writes no rope.scaling.* keys, only
 * the rope_freqs.weight tensor, and so do we.
 *
 * Weights.  Values are drawn per row from a stream seeded by (seed, hash of
 * the tensor name, row), so
 *   - any thread count gives the same bytes (rows are split across a pool);
 *   - blk.0 of a 2-layer file equals blk.0 of the full-depth file;
 *   - the generator never holds more than one tensor (the writer's buffer).
 * The "normal" deviate is an Irwin-Hall sum of four 16-bit uniforms taken from
 * one 64-bit draw, rescaled to unit variance: integer arithmetic plus one
 * float multiply, so it is bit-identical on every platform and cheap enough
 * for 8B parameters (Box-Muller's log/cos would dominate the run time and
 * depend on the libm).  Its tails stop at +-3.46 sigma, harmless here.
 *
 * Scales (chosen so activations stay O(1) through any depth with pre-norm):
 *   - every projection W [fan_in -> fan_out]: sigma = 1/sqrt(fan_in) (LeCun),
 *     so each projection of a unit-RMS input has unit RMS; attention scores
 *     q.k/sqrt(d) then have unit variance: neither uniform nor one-hot.  Each
 *     block adds O(1) to the residual, so it grows like sqrt(n_layer) (< 10
 *     for every shape here), which f16 and the norms absorb easily.
 *   - token_embd / output: sigma = 2/sqrt(n_embd): logits of a unit-RMS
 *     final state have std ~2 (sampling neither flat nor degenerate), and the
 *     embedding RMS (~0.03 at 4096) is that of real checkpoints.
 *   - norm weights 1 + 0.02 z, biases 0.1 z, qk-norm weights 1 + 0.02 z.
 */
#include "model/shapes.h"

#include <math.h>
#include <string.h>

/* The older rows give the first fields positionally and leave the newer
 * ones (rope_scaling onwards) zero, which -Wmissing-field-initializers would
 * flag on every row. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
/*  name            arch    embd layer head kv  hdim  n_ff   theta    eps   ctx    tied  bias  qkn   l3   fac lo  hi  orig */
static const ks_model_shape g_shapes[] = {
    {"llama-3.2-1b",  "llama", 2048, 16, 32,  8,  64,     8192, 500000.f, 1e-5f, 131072, true,  false, false, true, 32.f, 1.f, 4.f, 8192},
    {"llama-3.2-3b",  "llama", 3072, 28, 24,  8, 128,     8192, 500000.f, 1e-5f, 131072, true,  false, false, true, 32.f, 1.f, 4.f, 8192},
    {"llama-3.1-8b",  "llama", 4096, 32, 32,  8, 128,    14336, 500000.f, 1e-5f, 131072, false, false, false, true,  8.f, 1.f, 4.f, 8192},
    {"qwen3-8b",      "qwen3", 4096, 36, 32,  8, 128,    12288, 1000000.f, 1e-6f, 40960, false, false, true,  false, 0, 0, 0, 0},
    {"qwen3-0.6b",    "qwen3", 1024, 28, 16,  8, 128,     3072, 1000000.f, 1e-6f, 40960, true,  false, true,  false, 0, 0, 0, 0},
    /* Qwen3-30B-A3B: 128 experts of 768, 8 active; feed_forward_length is HF's
     * intermediate_size (6144), which no tensor uses */
    {"qwen3-30b-a3b", "qwen3moe", 2048, 48, 32, 4, 128,  6144, 1000000.f, 1e-6f, 40960, false, false, true,  false, 0, 0, 0, 0,
     .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768},
    {"qwen2.5-7b",    "qwen2", 3584, 28, 28,  4, 128,    18944, 1000000.f, 1e-6f, 32768, false, true,  false, false, 0, 0, 0, 0},
    /* Mistral 7B v0.3 (v0.1 differs only in theta 10000 and a 32000 vocab) */
    {"mistral-7b",    "llama", 4096, 32, 32,  8, 128,    14336, 1000000.f, 1e-5f, 32768, false, false, false, false, 0, 0, 0, 0},
    {"llama-2-7b",    "llama", 4096, 32, 32, 32, 128,    11008, 10000.f,   1e-5f,  4096, false, false, false, false, 0, 0, 0, 0},
    /* tiny test shapes: every dim a multiple of 256 so the K-quants apply */
    {"tiny-llama",    "llama",  256,  2,  4,  2,  64,      512, 10000.f,   1e-5f,  8192, false, false, false, false, 0, 0, 0, 0},
    {"tiny-llama3",   "llama",  256,  2,  4,  2,  64,      512, 500000.f,  1e-5f, 32768, true,  false, false, true,  8.f, 1.f, 4.f, 8192},
    {"tiny-qwen2",    "qwen2",  256,  2,  4,  2,  64,      512, 1000000.f, 1e-6f,  8192, false, true,  false, false, 0, 0, 0, 0},
    /* head_dim * n_head = 512 != n_embd, as in real qwen3 (key_length matters) */
    {"tiny-qwen3",    "qwen3",  256,  2,  8,  2,  64,      512, 1000000.f, 1e-6f,  8192, true,  false, true,  false, 0, 0, 0, 0},
    {"tiny-mistral",  "llama",  256,  2,  4,  2,  64,      512, 1000000.f, 1e-5f,  8192, false, false, false, false, 0, 0, 0, 0},
    {"tiny-mha",      "llama",  256,  2,  4,  4,  64,      512, 10000.f,   1e-5f,  8192, false, false, false, false, 0, 0, 0, 0},
    /* 8 experts of 256, top 2: every routing path (ties aside) in a few MB of experts */
    {"tiny-qwen3moe", "qwen3moe", 256, 2, 8,  2,  64,      512, 1000000.f, 1e-6f,  8192, false, false, true,  false, 0, 0, 0, 0,
     .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256},
    {"tiny-mqa",      "llama",  256,  2,  4,  1,  64,      512, 10000.f,   1e-5f,  8192, false, false, false, false, 0, 0, 0, 0},
    /* RoPE scaling stated by keys, and the architectures of their own files
     * (src/model/arch_<name>.c).  Phi-4-mini: LongRoPE over 96 of 128 dims
     * (partial_rotary_factor 0.75), attn_factor sqrt(1 + ln 32 / ln 4096);
     * Qwen3-4B with the YaRN rope_scaling its model card gives for 128K;
     * SmolLM3-3B: NoPE every 4th layer; Ministral 3 3B: YaRN (factor 16
     * over 16384, mscale_all_dim 1) and llama_4_scaling_beta 0.1 (its
     * config as recalled, not checked against the published file: the
     * layer count 26 is the one llama.cpp's mistral3 loader calls 3B). */
    {"phi-4-mini",    "phi3",  3072, 32, 24,  8, 128,     8192, 10000.f,   1e-5f, 131072, true,  false, false, false, 32.f, 0, 0, 4096,
     .rope_scaling = "longrope", .rope_attn_factor = 1.1902380714238083f, .n_rot = 96, .fused = true, .swa_window = 262144},
    {"qwen3-4b-yarn", "qwen3", 2560, 36, 32,  8, 128,     9728, 1000000.f, 1e-6f, 131072, true,  false, true,  false, 4.f, 0, 0, 32768,
     .rope_scaling = "yarn"},
    {"smollm3-3b",    "smollm3", 2048, 36, 16, 4, 128,   11008, 5000000.f, 1e-6f, 65536, true,  false, false, false, 0, 0, 0, 0},
    {"ministral-3-3b", "mistral3", 3072, 26, 32, 8, 128,  9216, 1000000.f, 1e-5f, 262144, true, false, false, false, 16.f, 0, 0, 16384,
     .rope_scaling = "yarn", .yarn_log_mul = 1.0f, .attn_temp_scale = 0.1f},
    /* tiny versions: tiny-phi3 rotates 48 of 64 dims and uses its short
     * factors up to a 4096-token context, its long ones above; tiny-mistral3's
     * original context of 32 makes the temperature step inside a test prompt */
    {"tiny-phi3",     "phi3",   256,  2,  4,  2,  64,      512, 10000.f,   1e-5f, 131072, true,  false, false, false, 32.f, 0, 0, 4096,
     .rope_scaling = "longrope", .rope_attn_factor = 1.1902380714238083f, .n_rot = 48, .fused = true, .swa_window = 262144},
    {"tiny-qwen3-yarn", "qwen3", 256, 2,  8,  2,  64,      512, 1000000.f, 1e-6f, 131072, true,  false, true,  false, 4.f, 0, 0, 32768,
     .rope_scaling = "yarn"},
    {"tiny-smollm3",  "smollm3", 256, 4,  4,  2,  64,      512, 5000000.f, 1e-6f, 65536, true,  false, false, false, 0, 0, 0, 0},
    {"tiny-mistral3", "mistral3", 256, 2, 4,  2,  64,      512, 1000000.f, 1e-5f,  8192, true,  false, false, false, 16.f, 0, 0, 32,
     .rope_scaling = "yarn", .yarn_log_mul = 1.0f, .attn_temp_scale = 0.1f},
    /* Gemma 3 (HF config.json): five local layers (sliding window) per global one; the 4B's
     * global layers scale RoPE linearly by 8.  Head dim 256 > n_embd / n_head, tied output. */
    {"gemma-3-1b",    "gemma3", 1152, 26, 4, 1, 256,     6912, 1000000.f, 1e-6f, 32768, true,  false, true,  false, 0, 0, 0, 0,
     .swa_window = 512},
    {"gemma-3-4b",    "gemma3", 2560, 34, 8, 4, 256,    10240, 1000000.f, 1e-6f, 131072, true, false, true,  false, 8.f, 0, 0, 0,
     .swa_window = 1024, .rope_scaling = "linear"},
    /* DeepSeek-V2-Lite (HF config.json): MLA with kv_lora_rank 512, no q
     * compression, qk_nope 128 + qk_rope 64, v_head 128; 64 routed experts of
     * 1408, 6 active, 2 shared, layer 0 dense (10944); YaRN factor 40 over
     * 4096 with mscale_all_dim 0.707, which the converter writes as
     * yarn_log_multiplier 0.1 x 0.707 */
    {"deepseek-v2-lite", "deepseek2", 2048, 27, 16, 1, 192, 10944, 10000.f, 1e-6f, 163840, false, false, false, false,
     40.f, 0, 0, 4096, .rope_scaling = "yarn", .yarn_log_mul = 0.0707f, .n_rot = 64,
     .n_expert = 64, .n_expert_used = 6, .n_ff_exp = 1408, .kv_lora_rank = 512, .qk_nope = 128, .v_head = 128,
     .n_expert_shared = 2, .n_dense_lead = 1, .expert_weights_scale = 1.0f},
    /* its tiny version: the real latent head (512 + 64 = 576 dims), 4 heads
     * of 64 + 64, 8 experts of 256 (2 active, 1 shared) after one dense
     * layer, the same YaRN; weights scale 2 so that the scaling is exercised */
    {"tiny-deepseek2", "deepseek2", 256, 3, 4, 1, 128,    512, 10000.f,   1e-6f, 163840, false, false, false, false,
     40.f, 0, 0, 4096, .rope_scaling = "yarn", .yarn_log_mul = 0.0707f, .n_rot = 64,
     .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .kv_lora_rank = 512, .qk_nope = 64, .v_head = 64,
     .n_expert_shared = 1, .n_dense_lead = 1, .expert_weights_scale = 2.0f},
    /* V2-Lite's 16 query heads on the tiny latent head: the decode kernel's
     * wide group (attn_avx512_wide.c) and the step's split of its heads
     * between threads (attend.c) */
    {"tiny-deepseek2-wide", "deepseek2", 256, 3, 16, 1, 128, 512, 10000.f, 1e-6f, 163840, false, false, false, false,
     40.f, 0, 0, 4096, .rope_scaling = "yarn", .yarn_log_mul = 0.0707f, .n_rot = 64,
     .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .kv_lora_rank = 512, .qk_nope = 64, .v_head = 64,
     .n_expert_shared = 1, .n_dense_lead = 1, .expert_weights_scale = 2.0f},
    /* experts of 352 = 11 x 32 (as V2-Lite's 1408 = 44 x 32, not a multiple of
     * the K-quant block of 256): the _K_M mix's fallback types for the
     * experts' and shared expert's down matrices (ks_gen_fallback) */
    {"tiny-deepseek2-odd", "deepseek2", 256, 3, 4, 1, 128, 512, 10000.f, 1e-6f, 163840, false, false, false, false,
     40.f, 0, 0, 4096, .rope_scaling = "yarn", .yarn_log_mul = 0.0707f, .n_rot = 64,
     .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 352, .kv_lora_rank = 512, .qk_nope = 64, .v_head = 64,
     .n_expert_shared = 1, .n_dense_lead = 1, .expert_weights_scale = 2.0f},
    /* the same with DeepSeek-V2's low-rank Q (attn_q_a, its norm, attn_q_b) */
    {"tiny-deepseek2-qlora", "deepseek2", 256, 3, 4, 1, 128, 512, 10000.f, 1e-6f, 163840, false, false, false, false,
     40.f, 0, 0, 4096, .rope_scaling = "yarn", .yarn_log_mul = 0.0707f, .n_rot = 64,
     .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .kv_lora_rank = 512, .q_lora_rank = 256, .qk_nope = 64,
     .v_head = 64, .n_expert_shared = 1, .n_dense_lead = 1, .expert_weights_scale = 2.0f},
    /* six layers: 0-4 local with a 16-entry window, 5 global (scaled by 8), so a 64-token prompt sees both */
    {"tiny-gemma3",   "gemma3",  256,  6,  4,  2,  64,      512, 1000000.f, 1e-6f,  8192, true,  false, true,  false, 8.f, 0, 0, 0,
     .swa_window = 16, .rope_scaling = "linear"},
    /* gpt-oss-20b (HF config.json): 24 layers alternating a 128-token sliding window and full attention,
     * 64/8 heads of 64 (q_dim 4096 > n_embd 2880), 32 experts of 2880, 4 active, q/k/v/o biases, sinks,
     * YaRN x32 over 4096 (beta fast/slow 32/1), theta 150000, untied output, vocabulary 201088 (o200k_harmony;
     * gen-model takes the --vocab-from file's) */
    {"gpt-oss-20b",   "gpt-oss", 2880, 24, 64, 8, 64,     2880, 150000.f,  1e-5f, 131072, false, true,  false, false, 32.f, 0, 0, 4096,
     .rope_scaling = "yarn", .swa_window = 128, .n_expert = 32, .n_expert_used = 4, .n_ff_exp = 2880},
    /* four layers (0 and 2 local with a 16-entry window, 1 and 3 global), 8 experts of 256, 4 active:
     * a 64-token prompt crosses the window */
    {"tiny-gptoss",   "gpt-oss",  256,  4,  8,  2,  64,      256, 150000.f,  1e-5f, 131072, false, true,  false, false, 32.f, 0, 0, 4096,
     .rope_scaling = "yarn", .swa_window = 16, .n_expert = 8, .n_expert_used = 4, .n_ff_exp = 256},
};
#pragma GCC diagnostic pop

int ks_shape_count(void) { return (int)(sizeof g_shapes / sizeof g_shapes[0]); }

const ks_model_shape *ks_shape_at(int i) {
    KS_ASSERT(i >= 0 && i < ks_shape_count());
    return &g_shapes[i];
}

const ks_model_shape *ks_shape_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < ks_shape_count(); i++)
        if (!strcmp(g_shapes[i].name, name)) return &g_shapes[i];
    return NULL;
}

void ks_shape_rope_factors(const ks_model_shape *s, float *out) {
    /* llama.cpp's converter: inverse frequencies in float32, wavelengths and
     * the smooth blend in double, the result stored as float32. */
    const int dim = s->head_dim;
    const double lo_wavelen = (double)s->rope_orig_ctx / s->rope_low_freq_factor;
    const double hi_wavelen = (double)s->rope_orig_ctx / s->rope_high_freq_factor;
    for (int i = 0; i < dim / 2; i++) {
        float freq = 1.0f / powf(s->rope_theta, (float)(2 * i) / (float)dim);
        double wavelen = 2.0 * 3.141592653589793 / (double)freq;
        double f;
        if (wavelen < hi_wavelen) {
            f = 1.0;
        } else if (wavelen > lo_wavelen) {
            f = s->rope_factor;
        } else {
            double smooth = ((double)s->rope_orig_ctx / wavelen - s->rope_low_freq_factor) /
                            ((double)s->rope_high_freq_factor - s->rope_low_freq_factor);
            f = 1.0 / ((1.0 - smooth) / s->rope_factor + smooth);
        }
        out[i] = (float)f;
    }
}

void ks_shape_longrope_factors(const ks_model_shape *s, bool long_factors, float *out) {
    const int half = (s->n_rot > 0 ? s->n_rot : s->head_dim) / 2;
    for (int i = 0; i < half; i++) {
        float t = half > 1 ? (float)i / (float)(half - 1) : 0.0f; /* 0 = highest frequency */
        out[i] = long_factors ? 1.0f + (s->rope_factor - 1.0f) * t * t : 1.0f + 0.5f * t * t * t;
    }
}

uint32_t ks_shape_file_type(ks_dtype type) {
    switch (type) {
    case KS_DTYPE_F32: return 0;   /* ALL_F32 */
    case KS_DTYPE_F16: return 1;   /* MOSTLY_F16 */
    case KS_DTYPE_Q4_0: return 2;  /* MOSTLY_Q4_0 */
    case KS_DTYPE_Q8_0: return 7;  /* MOSTLY_Q8_0 */
    case KS_DTYPE_Q4_K: return 14; /* MOSTLY_Q4_K_S: uniform Q4_K is the "small" mix */
    case KS_DTYPE_Q6_K: return 18; /* MOSTLY_Q6_K */
    case KS_DTYPE_Q4_1: return 3;  /* MOSTLY_Q4_1 */
    case KS_DTYPE_Q5_0: return 8;  /* MOSTLY_Q5_0 */
    case KS_DTYPE_Q5_1: return 9;  /* MOSTLY_Q5_1 */
    case KS_DTYPE_Q2_K: return 10; /* MOSTLY_Q2_K */
    case KS_DTYPE_Q3_K: return 11; /* MOSTLY_Q3_K_S: uniform, as Q4_K above */
    case KS_DTYPE_Q5_K: return 16; /* MOSTLY_Q5_K_S */
    case KS_DTYPE_IQ4_NL: return 25; /* MOSTLY_IQ4_NL */
    case KS_DTYPE_IQ4_XS: return 30; /* MOSTLY_IQ4_XS */
    case KS_DTYPE_BF16: return 32; /* MOSTLY_BF16 */
    case KS_DTYPE_MXFP4: return 38; /* MOSTLY_MXFP4_MOE: experts MXFP4, the rest Q8_0 here */
    default: return 1024;          /* GUESSED */
    }
}

/* llama.cpp's choice of the layers whose attn_v and ffn_down get more bits
 * in its _M mixes: the first and last eighth, and every third in between. */
static bool ks_gen_more_bits(int32_t i, int32_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* A type whose blocks do not tile a row of ne0 is replaced as llama.cpp's
 * quantizer replaces it (llama-quant.cpp, tensor_type_fallback): each
 * 256-block type by a 32-block type of about as many bits (Q4_K -> Q5_0,
 * Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K / Q3_K -> Q4_0, IQ4_XS -> IQ4_NL), and
 * f16 only when that still does not tile the row.  DeepSeek-V2-Lite's
 * ffn_down_exps (1408 columns) and attn_k_b (128) are the rows that need it:
 * a Q4_K_M download holds them in Q5_0 / Q8_0, not f16. */
static ks_dtype ks_gen_fallback(ks_dtype type, int64_t ne0) {
    int64_t bs = ks_dtype_block_size(type);
    if (bs > 0 && ne0 % bs == 0) return type;
    switch (type) {
    case KS_DTYPE_Q4_K: type = KS_DTYPE_Q5_0; break;
    case KS_DTYPE_Q5_K: type = KS_DTYPE_Q5_1; break;
    case KS_DTYPE_Q6_K: type = KS_DTYPE_Q8_0; break;
    case KS_DTYPE_Q2_K:
    case KS_DTYPE_Q3_K: type = KS_DTYPE_Q4_0; break;
    case KS_DTYPE_IQ4_XS: type = KS_DTYPE_IQ4_NL; break;
    default: return KS_DTYPE_F16;
    }
    bs = ks_dtype_block_size(type);
    return bs > 0 && ne0 % bs == 0 ? type : KS_DTYPE_F16;
}

/* ----------------------------------------------------------- generator -- */
typedef enum { KS_GEN_MATRIX, KS_GEN_ONES, KS_GEN_NOISE, KS_GEN_ROPE, KS_GEN_ROPE_SHORT, KS_GEN_ROPE_LONG } ks_gen_kind;

struct ks_gen;
typedef struct ks_gen_tensor {
    struct ks_gen *gen;
    char name[64];
    ks_gen_kind kind;
    ks_dtype type;
    int64_t ne0, ne1;    /* row length, rows (of one expert when stacked) */
    int64_t ne2;         /* experts stacked in a 3-D tensor (ne = {ne0, ne1, ne2}), else 1 */
    bool two_d;          /* a non-matrix kind written as 2-D (gpt-oss's per-expert bias tables) */
    float sigma;
    uint64_t stream;     /* hash of the name: the tensor's RNG stream */
    uint64_t nbytes;
} ks_gen_tensor;

typedef struct ks_gen {
    const ks_model_shape *shape;
    const ks_shape_gen_params *p;
    ks_pool *pool;
    ks_gen_tensor *ts;   /* [n_t] */
    int64_t n_t;
    uint64_t bytes_done, bytes_total;
    /* the job of the current ks_pool_run */
    const ks_gen_tensor *cur;
    uint8_t *dst;
    _Atomic int refused; /* a worker's row buffer was refused */
} ks_gen;

static uint64_t ks_gen_mix(uint64_t a, uint64_t b) {
    ks_rng r = {a ^ (b * 0xD6E8FEB86659FD93ull)};
    ks_rng_next(&r);
    return ks_rng_next(&r);
}

static uint64_t ks_gen_hash_name(const char *s) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001B3ull;
    return h;
}

/* Approximately N(0, 1): Irwin-Hall of four 16-bit uniforms, unit variance. */
static inline float ks_gen_normal(ks_rng *r) {
    uint64_t x = ks_rng_next(r);
    uint32_t sum = (uint32_t)(x & 0xFFFF) + (uint32_t)((x >> 16) & 0xFFFF) + (uint32_t)((x >> 32) & 0xFFFF) +
                   (uint32_t)(x >> 48);
    /* mean of the sum is 4 * 65535/2 = 131070; std of U(0,65536) ~ 65536/sqrt(12) */
    return ((float)sum - 131070.0f) * (float)(1.7320508075688772 / 65536.0);
}

static void ks_gen_row(const ks_gen_tensor *t, int64_t row, float *x /* [ne0] */) {
    if (t->kind == KS_GEN_ROPE) {
        ks_shape_rope_factors(t->gen->shape, x);
        return;
    }
    if (t->kind == KS_GEN_ROPE_SHORT || t->kind == KS_GEN_ROPE_LONG) {
        ks_shape_longrope_factors(t->gen->shape, t->kind == KS_GEN_ROPE_LONG, x);
        return;
    }
    ks_rng r = {ks_gen_mix(ks_gen_mix(t->gen->p->seed, t->stream), (uint64_t)row)};
    float base = t->kind == KS_GEN_ONES ? 1.0f : 0.0f;
    for (int64_t i = 0; i < t->ne0; i++) x[i] = base + t->sigma * ks_gen_normal(&r);
}

static void ks_gen_rows_worker(void *arg, int ith, int nth) {
    ks_gen *g = arg;
    const ks_gen_tensor *t = g->cur;
    int64_t r0, r1; /* each row depends only on its index: any split gives the same bytes */
    ks_pool_share(t->ne1 * t->ne2, ith, nth, &r0, &r1); /* a stacked tensor's rows: expert-major */
    if (r0 >= r1) return;
    size_t row_bytes = ks_dtype_row_bytes(t->type, t->ne0);
    float *x = ks_malloc((size_t)t->ne0 * sizeof(float)); /* [ne0] */
    if (!x) {
        g->refused = 1;
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        ks_gen_row(t, r, x);
        ks_quantize_row(t->type, x, g->dst + (size_t)r * row_bytes, t->ne0);
    }
    ks_free(x);
}

static ks_status ks_gen_fill(void *user, void *dst, size_t nbytes) {
    const ks_gen_tensor *t = user;
    ks_gen *g = t->gen;
    KS_ASSERT(nbytes == t->nbytes);
    if (g->p->progress)
        g->p->progress(g->p->progress_user, t - g->ts, g->n_t, t->name, g->bytes_done, g->bytes_total);
    g->cur = t;
    g->dst = dst;
    ks_pool_run(g->pool, ks_gen_rows_worker, g);
    if (g->refused) return KS_FAIL(KS_ERR_NOMEM, "row buffer for tensor '%s'", t->name);
    g->bytes_done += nbytes;
    return KS_OK;
}

static void ks_gen_add(ks_gen *g, int64_t *n, const char *name, ks_gen_kind kind, ks_dtype type,
                       int64_t ne0, int64_t ne1, float sigma) {
    ks_gen_tensor *t = &g->ts[(*n)++];
    memset(t, 0, sizeof *t);
    t->gen = g;
    KS_ASSERT(strlen(name) < sizeof t->name);
    strcpy(t->name, name);
    t->kind = kind;
    t->type = ks_gen_fallback(type, ne0);
    t->ne0 = ne0;
    t->ne1 = ne1;
    t->sigma = sigma;
    t->stream = ks_gen_hash_name(name);
    t->ne2 = 1;
    t->nbytes = (uint64_t)ks_dtype_row_bytes(t->type, ne0) * (uint64_t)ne1;
}

/* A stacked expert tensor: n_expert matrices of [ne1][ne0], one 3-D tensor
 * as llama.cpp's converter writes ffn_{gate,up,down}_exps. */
static void ks_gen_add_experts(ks_gen *g, int64_t *n, const char *name, ks_dtype type, int64_t ne0, int64_t ne1,
                               int64_t n_expert, float sigma) {
    ks_gen_add(g, n, name, KS_GEN_MATRIX, type, ne0, ne1, sigma);
    ks_gen_tensor *t = &g->ts[*n - 1];
    t->ne2 = n_expert;
    t->nbytes *= (uint64_t)n_expert;
}

/* The tensors of gpt-oss layer l (arch_gptoss.c names them): attention with
 * q/k/v/o biases and a sink logit per head (sigma 1: sinks take a visible
 * share of the softmax), post_attention_norm as the FFN's input norm, the
 * router with its bias and the experts with theirs.  Weight type mxfp4 puts
 * the experts in MXFP4 and the other matrices in Q8_0 (MXFP4 is an expert
 * format in llama.cpp's files, its MOSTLY_MXFP4_MOE); any other type
 * applies to every matrix. */
static void ks_gen_plan_gptoss_layer(ks_gen *g, int64_t *n, int32_t l) {
    const ks_model_shape *s = g->shape;
    const ks_dtype xt = g->p->type, wt = xt == KS_DTYPE_MXFP4 ? KS_DTYPE_Q8_0 : xt;
    const int64_t E = s->n_embd, D = s->head_dim, QD = (int64_t)s->n_head * D, KVD = (int64_t)s->n_head_kv * D;
    const int64_t X = s->n_expert, FX = s->n_ff_exp;
    const float sE = 1.0f / sqrtf((float)E);
    char nm[64];
#define KS_GEN_L(suffix) (snprintf(nm, sizeof nm, "blk.%d." suffix, (int)l), nm)
    ks_gen_add(g, n, KS_GEN_L("attn_norm.weight"), KS_GEN_ONES, KS_DTYPE_F32, E, 1, 0.02f);
    ks_gen_add(g, n, KS_GEN_L("attn_q.weight"), KS_GEN_MATRIX, wt, E, QD, sE);
    ks_gen_add(g, n, KS_GEN_L("attn_q.bias"), KS_GEN_NOISE, KS_DTYPE_F32, QD, 1, 0.1f);
    ks_gen_add(g, n, KS_GEN_L("attn_k.weight"), KS_GEN_MATRIX, wt, E, KVD, sE);
    ks_gen_add(g, n, KS_GEN_L("attn_k.bias"), KS_GEN_NOISE, KS_DTYPE_F32, KVD, 1, 0.1f);
    ks_gen_add(g, n, KS_GEN_L("attn_v.weight"), KS_GEN_MATRIX, wt, E, KVD, sE);
    ks_gen_add(g, n, KS_GEN_L("attn_v.bias"), KS_GEN_NOISE, KS_DTYPE_F32, KVD, 1, 0.1f);
    ks_gen_add(g, n, KS_GEN_L("attn_output.weight"), KS_GEN_MATRIX, wt, QD, E, 1.0f / sqrtf((float)QD));
    ks_gen_add(g, n, KS_GEN_L("attn_output.bias"), KS_GEN_NOISE, KS_DTYPE_F32, E, 1, 0.1f);
    ks_gen_add(g, n, KS_GEN_L("attn_sinks.weight"), KS_GEN_NOISE, KS_DTYPE_F32, s->n_head, 1, 1.0f);
    ks_gen_add(g, n, KS_GEN_L("post_attention_norm.weight"), KS_GEN_ONES, KS_DTYPE_F32, E, 1, 0.02f);
    /* router logits of std 4, not 1: with 4 of 8 experts kept, std-1 logits left some route of
     * every 64-token prompt within 0.008 of a tie, which either engine's roundings can flip
     * (tools/make_goldens.py, ROUTE_MARGIN) */
    ks_gen_add(g, n, KS_GEN_L("ffn_gate_inp.weight"), KS_GEN_MATRIX, KS_DTYPE_F32, E, X, 4.0f * sE);
    ks_gen_add(g, n, KS_GEN_L("ffn_gate_inp.bias"), KS_GEN_NOISE, KS_DTYPE_F32, X, 1, 0.1f);
    ks_gen_add_experts(g, n, KS_GEN_L("ffn_gate_exps.weight"), xt, E, FX, X, sE);
    ks_gen_add_experts(g, n, KS_GEN_L("ffn_down_exps.weight"), xt, FX, E, X, 1.0f / sqrtf((float)FX));
    ks_gen_add_experts(g, n, KS_GEN_L("ffn_up_exps.weight"), xt, E, FX, X, sE);
    ks_gen_add(g, n, KS_GEN_L("ffn_gate_exps.bias"), KS_GEN_NOISE, KS_DTYPE_F32, FX, X, 0.1f);
    g->ts[*n - 1].two_d = true;
    ks_gen_add(g, n, KS_GEN_L("ffn_down_exps.bias"), KS_GEN_NOISE, KS_DTYPE_F32, E, X, 0.1f);
    g->ts[*n - 1].two_d = true;
    ks_gen_add(g, n, KS_GEN_L("ffn_up_exps.bias"), KS_GEN_NOISE, KS_DTYPE_F32, FX, X, 0.1f);
    g->ts[*n - 1].two_d = true;
#undef KS_GEN_L
}

/* A deepseek2 layer after its attn_norm: latent attention (Q whole or low
 * rank, the latent + rope key projection and its norm, W_UK^T and W_UV per
 * head as the converter splits kv_b), then a dense FFN (the first
 * n_dense_lead layers) or the routed experts and the shared ones. */
static void ks_gen_plan_mla_layer(ks_gen *g, int64_t *n, int32_t l, int32_t n_layer) {
    const ks_model_shape *s = g->shape;
    const ks_dtype wt = g->p->type;
    const ks_dtype more = g->p->mix_k_m ? KS_DTYPE_Q6_K : wt;
    const int64_t E = s->n_embd, R = s->kv_lora_rank, rope = s->n_rot, nh = s->n_head;
    const int64_t QK = (int64_t)s->qk_nope + rope, VD = (int64_t)nh * s->v_head;
    const float sE = 1.0f / sqrtf((float)E);
    char nm[64];
#define KS_GEN_T(suffix, kind, type, ne0, ne1, sigma)                  \
    do {                                                               \
        snprintf(nm, sizeof nm, "blk.%d." suffix, (int)l);            \
        ks_gen_add(g, n, nm, kind, type, ne0, ne1, sigma);             \
    } while (0)
#define KS_GEN_X(suffix, type, ne0, ne1, ne2, sigma)                   \
    do {                                                               \
        snprintf(nm, sizeof nm, "blk.%d." suffix, (int)l);            \
        ks_gen_add_experts(g, n, nm, type, ne0, ne1, ne2, sigma);      \
    } while (0)
    if (s->q_lora_rank > 0) {
        KS_GEN_T("attn_q_a.weight", KS_GEN_MATRIX, wt, E, s->q_lora_rank, sE);
        KS_GEN_T("attn_q_a_norm.weight", KS_GEN_ONES, KS_DTYPE_F32, s->q_lora_rank, 1, 0.02f);
        KS_GEN_T("attn_q_b.weight", KS_GEN_MATRIX, wt, s->q_lora_rank, nh * QK, 1.0f / sqrtf((float)s->q_lora_rank));
    } else {
        KS_GEN_T("attn_q.weight", KS_GEN_MATRIX, wt, E, nh * QK, sE);
    }
    KS_GEN_T("attn_kv_a_mqa.weight", KS_GEN_MATRIX, wt, E, R + rope, sE);
    KS_GEN_T("attn_kv_a_norm.weight", KS_GEN_ONES, KS_DTYPE_F32, R, 1, 0.02f);
    KS_GEN_X("attn_k_b.weight", wt, s->qk_nope, R, nh, 1.0f / sqrtf((float)s->qk_nope));
    /* attn_v_b is not an attn_v tensor to llama.cpp's mix (its category
     * match is the exact "attn_v.weight"): plain type, no extra bits */
    KS_GEN_X("attn_v_b.weight", wt, R, s->v_head, nh, 1.0f / sqrtf((float)R));
    KS_GEN_T("attn_output.weight", KS_GEN_MATRIX, wt, VD, E, 1.0f / sqrtf((float)VD));
    KS_GEN_T("ffn_norm.weight", KS_GEN_ONES, KS_DTYPE_F32, E, 1, 0.02f);
    if (l < s->n_dense_lead || s->n_expert == 0) {
        KS_GEN_T("ffn_gate.weight", KS_GEN_MATRIX, wt, E, s->n_ff, sE);
        KS_GEN_T("ffn_up.weight", KS_GEN_MATRIX, wt, E, s->n_ff, sE);
        KS_GEN_T("ffn_down.weight", KS_GEN_MATRIX, ks_gen_more_bits(l, n_layer) ? more : wt, s->n_ff, E,
                 1.0f / sqrtf((float)s->n_ff));
    } else {
        const int64_t X = s->n_expert, FX = s->n_ff_exp, FS = (int64_t)s->n_ff_exp * s->n_expert_shared;
        /* every "ffn_down" tensor (dense, routed, shared) follows the _M rule by its layer */
        const ks_dtype down = ks_gen_more_bits(l, n_layer) ? more : wt;
        KS_GEN_T("ffn_gate_inp.weight", KS_GEN_MATRIX, KS_DTYPE_F32, E, X, sE);
        KS_GEN_X("ffn_gate_exps.weight", wt, E, FX, X, sE);
        KS_GEN_X("ffn_down_exps.weight", down, FX, E, X, 1.0f / sqrtf((float)FX));
        KS_GEN_X("ffn_up_exps.weight", wt, E, FX, X, sE);
        if (FS > 0) {
            KS_GEN_T("ffn_gate_shexp.weight", KS_GEN_MATRIX, wt, E, FS, sE);
            KS_GEN_T("ffn_up_shexp.weight", KS_GEN_MATRIX, wt, E, FS, sE);
            KS_GEN_T("ffn_down_shexp.weight", KS_GEN_MATRIX, down, FS, E, 1.0f / sqrtf((float)FS));
        }
    }
#undef KS_GEN_T
#undef KS_GEN_X
}

/* Lists every tensor of the model, in llama.cpp's converter order. */
static int64_t ks_gen_plan(ks_gen *g, int32_t n_layer, int64_t n_vocab) {
    const ks_model_shape *s = g->shape;
    /* MXFP4 is an expert type: the other matrices of an mxfp4 file are Q8_0 (ks_gen_plan_gptoss_layer) */
    const ks_dtype wt = g->p->type == KS_DTYPE_MXFP4 ? KS_DTYPE_Q8_0 : g->p->type;
    const ks_dtype more = g->p->mix_k_m ? KS_DTYPE_Q6_K : wt; /* attn_v, ffn_down, output of an _M mix */
    const int64_t E = s->n_embd, F = s->n_ff, D = s->head_dim;
    const int64_t QD = (int64_t)s->n_head * D, KVD = (int64_t)s->n_head_kv * D;
    const float se = 2.0f / sqrtf((float)E), sE = 1.0f / sqrtf((float)E);
    int64_t n = 0;
    char nm[64];
    const int64_t R = s->n_rot > 0 ? s->n_rot : D;
    const bool longrope = s->rope_scaling && !strcmp(s->rope_scaling, "longrope");
    if (s->rope_llama3) ks_gen_add(g, &n, "rope_freqs.weight", KS_GEN_ROPE, KS_DTYPE_F32, D / 2, 1, 0);
    ks_gen_add(g, &n, "token_embd.weight", KS_GEN_MATRIX, wt, E, n_vocab, se);
    for (int32_t l = 0; l < n_layer; l++) {
        if (!strcmp(s->arch, "gpt-oss")) {
            ks_gen_plan_gptoss_layer(g, &n, l);
            continue;
        }
#define KS_GEN_T(suffix, kind, type, ne0, ne1, sigma)                  \
    do {                                                               \
        snprintf(nm, sizeof nm, "blk.%d." suffix, (int)l);            \
        ks_gen_add(g, &n, nm, kind, type, ne0, ne1, sigma);            \
    } while (0)
        KS_GEN_T("attn_norm.weight", KS_GEN_ONES, KS_DTYPE_F32, E, 1, 0.02f);
        if (s->kv_lora_rank > 0) { /* deepseek2's latent attention, then its FFN */
            ks_gen_plan_mla_layer(g, &n, l, n_layer);
            continue;
        }
        if (s->fused) {
            KS_GEN_T("attn_qkv.weight", KS_GEN_MATRIX, wt, E, QD + 2 * KVD, sE);
        } else {
            KS_GEN_T("attn_q.weight", KS_GEN_MATRIX, wt, E, QD, sE);
            KS_GEN_T("attn_k.weight", KS_GEN_MATRIX, wt, E, KVD, sE);
            KS_GEN_T("attn_v.weight", KS_GEN_MATRIX, ks_gen_more_bits(l, n_layer) ? more : wt, E, KVD, sE);
        }
        if (s->qkv_bias) {
            KS_GEN_T("attn_q.bias", KS_GEN_NOISE, KS_DTYPE_F32, QD, 1, 0.1f);
            KS_GEN_T("attn_k.bias", KS_GEN_NOISE, KS_DTYPE_F32, KVD, 1, 0.1f);
            KS_GEN_T("attn_v.bias", KS_GEN_NOISE, KS_DTYPE_F32, KVD, 1, 0.1f);
        }
        if (s->qk_norm) {
            KS_GEN_T("attn_q_norm.weight", KS_GEN_ONES, KS_DTYPE_F32, D, 1, 0.02f);
            KS_GEN_T("attn_k_norm.weight", KS_GEN_ONES, KS_DTYPE_F32, D, 1, 0.02f);
        }
        KS_GEN_T("attn_output.weight", KS_GEN_MATRIX, wt, QD, E, 1.0f / sqrtf((float)QD));
        bool gemma = !strcmp(s->arch, "gemma3");
        if (gemma) KS_GEN_T("post_attention_norm.weight", KS_GEN_ONES, KS_DTYPE_F32, E, 1, 0.02f);
        KS_GEN_T("ffn_norm.weight", KS_GEN_ONES, KS_DTYPE_F32, E, 1, 0.02f);
        if (s->n_expert > 0) {
            /* the router stays f32 whatever the weight type, as the converter and llama-quantize keep it */
            const int64_t X = s->n_expert, FX = s->n_ff_exp;
            KS_GEN_T("ffn_gate_inp.weight", KS_GEN_MATRIX, KS_DTYPE_F32, E, X, sE);
            snprintf(nm, sizeof nm, "blk.%d.ffn_gate_exps.weight", (int)l);
            ks_gen_add_experts(g, &n, nm, wt, E, FX, X, sE);
            /* llama.cpp's mix gives ffn_down_exps the dense ffn_down's extra bits,
             * the layer read from the name (llama-quant.cpp, layer_info) */
            snprintf(nm, sizeof nm, "blk.%d.ffn_down_exps.weight", (int)l);
            ks_gen_add_experts(g, &n, nm, ks_gen_more_bits(l, n_layer) ? more : wt, FX, E, X,
                               1.0f / sqrtf((float)FX));
            snprintf(nm, sizeof nm, "blk.%d.ffn_up_exps.weight", (int)l);
            ks_gen_add_experts(g, &n, nm, wt, E, FX, X, sE);
            continue;
        }
        if (s->fused) { /* phi3: ffn_down, then gate and up in one ffn_up (the converter's order) */
            KS_GEN_T("ffn_down.weight", KS_GEN_MATRIX, wt, F, E, 1.0f / sqrtf((float)F));
            KS_GEN_T("ffn_up.weight", KS_GEN_MATRIX, wt, E, 2 * F, sE);
        } else {
            KS_GEN_T("ffn_gate.weight", KS_GEN_MATRIX, wt, E, F, sE);
            KS_GEN_T("ffn_up.weight", KS_GEN_MATRIX, wt, E, F, sE);
            KS_GEN_T("ffn_down.weight", KS_GEN_MATRIX, ks_gen_more_bits(l, n_layer) ? more : wt, F, E,
                     1.0f / sqrtf((float)F));
        }
        if (gemma) KS_GEN_T("post_ffw_norm.weight", KS_GEN_ONES, KS_DTYPE_F32, E, 1, 0.02f);
#undef KS_GEN_T
    }
    if (longrope) { /* phi3's generate_extra_tensors: model-level, after the layers */
        ks_gen_add(g, &n, "rope_factors_long.weight", KS_GEN_ROPE_LONG, KS_DTYPE_F32, R / 2, 1, 0);
        ks_gen_add(g, &n, "rope_factors_short.weight", KS_GEN_ROPE_SHORT, KS_DTYPE_F32, R / 2, 1, 0);
    }
    ks_gen_add(g, &n, "output_norm.weight", KS_GEN_ONES, KS_DTYPE_F32, E, 1, 0.02f);
    if (!s->tied_output) ks_gen_add(g, &n, "output.weight", KS_GEN_MATRIX, more, E, n_vocab, se);
    return n;
}

static void ks_gen_set_metadata(ks_gguf_writer *w, const ks_model_shape *s, const ks_shape_gen_params *p,
                                int32_t n_layer, int32_t n_ctx, int64_t n_vocab) {
    char key[128];
#define KS_GEN_KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, s->arch), key)
    ks_gguf_writer_set_str(w, "general.architecture", s->arch);
    ks_gguf_writer_set_str(w, "general.name", s->name);
    ks_gguf_writer_set_u32(w, "general.alignment", KS_GGUF_DEFAULT_ALIGNMENT);
    ks_gguf_writer_set_u32(w, "general.file_type",
                           p->mix_k_m && p->type == KS_DTYPE_Q4_K   ? 15u /* MOSTLY_Q4_K_M */
                           : p->mix_k_m && p->type == KS_DTYPE_Q5_K ? 17u /* MOSTLY_Q5_K_M */
                                                                    : ks_shape_file_type(p->type));
    ks_gguf_writer_set_u32(w, "general.quantization_version", 2);
    ks_gguf_writer_set_u32(w, KS_GEN_KEY("context_length"), (uint32_t)n_ctx);
    ks_gguf_writer_set_u32(w, KS_GEN_KEY("embedding_length"), (uint32_t)s->n_embd);
    ks_gguf_writer_set_u32(w, KS_GEN_KEY("block_count"), (uint32_t)n_layer);
    ks_gguf_writer_set_u32(w, KS_GEN_KEY("feed_forward_length"), (uint32_t)s->n_ff);
    ks_gguf_writer_set_u32(w, KS_GEN_KEY("attention.head_count"), (uint32_t)s->n_head);
    ks_gguf_writer_set_u32(w, KS_GEN_KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    /* latent attention: the store's head is the latent plus the rope key
     * (key) and the latent (value); the _mla keys give the decompressed sizes */
    const bool mla = s->kv_lora_rank > 0;
    ks_gguf_writer_set_u32(w, KS_GEN_KEY("attention.key_length"),
                           (uint32_t)(mla ? s->kv_lora_rank + s->n_rot : s->head_dim));
    ks_gguf_writer_set_u32(w, KS_GEN_KEY("attention.value_length"), (uint32_t)(mla ? s->kv_lora_rank : s->head_dim));
    if (mla) {
        /* written even when 0 (no Q compression; the converter omits it): llama.cpp's
         * deepseek2 loader requires it unless the layer count is a known Lite model's */
        ks_gguf_writer_set_u32(w, KS_GEN_KEY("attention.q_lora_rank"), (uint32_t)s->q_lora_rank);
        ks_gguf_writer_set_u32(w, KS_GEN_KEY("attention.kv_lora_rank"), (uint32_t)s->kv_lora_rank);
        ks_gguf_writer_set_u32(w, KS_GEN_KEY("attention.key_length_mla"), (uint32_t)s->head_dim);
        ks_gguf_writer_set_u32(w, KS_GEN_KEY("attention.value_length_mla"), (uint32_t)s->v_head);
        ks_gguf_writer_set_u32(w, KS_GEN_KEY("leading_dense_block_count"), (uint32_t)s->n_dense_lead);
        ks_gguf_writer_set_u32(w, KS_GEN_KEY("expert_shared_count"), (uint32_t)s->n_expert_shared);
        if (s->expert_weights_scale > 0)
            ks_gguf_writer_set_f32(w, KS_GEN_KEY("expert_weights_scale"), s->expert_weights_scale);
    }
    ks_gguf_writer_set_f32(w, KS_GEN_KEY("rope.freq_base"), s->rope_theta);
    ks_gguf_writer_set_u32(w, KS_GEN_KEY("rope.dimension_count"), (uint32_t)(s->n_rot > 0 ? s->n_rot : s->head_dim));
    ks_gguf_writer_set_f32(w, KS_GEN_KEY("attention.layer_norm_rms_epsilon"), s->rms_eps);
    /* scaling keys as the converter writes them (TextModel.set_gguf_parameters;
     * Phi3MiniModel writes the original context and attn_factor but no type) */
    if (s->rope_scaling && strcmp(s->rope_scaling, "longrope") != 0) {
        ks_gguf_writer_set_str(w, KS_GEN_KEY("rope.scaling.type"), s->rope_scaling);
        ks_gguf_writer_set_f32(w, KS_GEN_KEY("rope.scaling.factor"), s->rope_factor);
    }
    if (s->rope_scaling && s->rope_orig_ctx > 0)
        ks_gguf_writer_set_u32(w, KS_GEN_KEY("rope.scaling.original_context_length"), (uint32_t)s->rope_orig_ctx);
    if (s->rope_attn_factor > 0) ks_gguf_writer_set_f32(w, KS_GEN_KEY("rope.scaling.attn_factor"), s->rope_attn_factor);
    if (s->yarn_log_mul > 0) ks_gguf_writer_set_f32(w, KS_GEN_KEY("rope.scaling.yarn_log_multiplier"), s->yarn_log_mul);
    if (s->attn_temp_scale > 0) ks_gguf_writer_set_f32(w, KS_GEN_KEY("attention.temperature_scale"), s->attn_temp_scale);
    if (s->swa_window > 0) ks_gguf_writer_set_u32(w, KS_GEN_KEY("attention.sliding_window"), (uint32_t)s->swa_window);
    if (p->swa_layers)
        ks_gguf_writer_set_arr(w, KS_GEN_KEY("attention.sliding_window_pattern"), KS_GGUF_BOOL, p->swa_layers,
                               (uint64_t)(p->n_swa_layers > 0 ? p->n_swa_layers : 0));
    else if (s->swa_pattern > 0)
        ks_gguf_writer_set_u32(w, KS_GEN_KEY("attention.sliding_window_pattern"), (uint32_t)s->swa_pattern);
    ks_gguf_writer_set_u32(w, KS_GEN_KEY("vocab_size"), (uint32_t)n_vocab);
    if (s->n_expert > 0) {
        ks_gguf_writer_set_u32(w, KS_GEN_KEY("expert_count"), (uint32_t)s->n_expert);
        ks_gguf_writer_set_u32(w, KS_GEN_KEY("expert_used_count"), (uint32_t)s->n_expert_used);
        ks_gguf_writer_set_u32(w, KS_GEN_KEY("expert_feed_forward_length"), (uint32_t)s->n_ff_exp);
    }
#undef KS_GEN_KEY
    for (int64_t i = 0; i < ks_gguf_n_kv(p->vocab); i++) {
        const ks_gguf_kv *kv = ks_gguf_kv_at(p->vocab, i);
        if (kv->key.len >= 10 && !memcmp(kv->key.data, "tokenizer.", 10)) ks_gguf_writer_copy_kv(w, kv);
    }
}

ks_status ks_shape_generate(const ks_model_shape *s, const ks_shape_gen_params *p, const char *path,
                            uint64_t *out_bytes) {
    if (!s || !p || !path || !p->vocab) return KS_FAIL(KS_ERR_INVALID_ARG, "gen-model: NULL argument");
    if (!ks_dtype_is_weight_type((uint32_t)p->type))
        return KS_FAIL(KS_ERR_INVALID_ARG, "gen-model: %s is not a weight type", ks_dtype_name(p->type));
    if (p->n_layer < 0 || p->n_layer > 4096)
        return KS_FAIL(KS_ERR_INVALID_ARG, "gen-model: layer count %d out of range [1, 4096]", p->n_layer);
    if (p->n_ctx < 0) return KS_FAIL(KS_ERR_INVALID_ARG, "gen-model: context length %d is negative", p->n_ctx);
    const ks_gguf_kv *tokens = ks_gguf_find_kv(p->vocab, "tokenizer.ggml.tokens");
    if (!tokens || tokens->type != KS_GGUF_ARRAY || tokens->arr_type != KS_GGUF_STRING || tokens->arr_n == 0 ||
        tokens->arr_n > INT32_MAX)
        return KS_FAIL(KS_ERR_INVALID_ARG, "gen-model: the vocabulary file has no tokenizer.ggml.tokens string array");
    const int64_t n_vocab = (int64_t)tokens->arr_n;
    const int32_t n_layer = p->n_layer > 0 ? p->n_layer : s->n_layer;
    const int32_t n_ctx = p->n_ctx > 0 ? p->n_ctx : s->n_ctx;

    ks_gen g = {.shape = s, .p = p};
    int n_threads = p->n_threads > 0 ? p->n_threads : ks_cpu_count();
    if (n_threads > 64) n_threads = 64;
    KS_TRY(ks_pool_create(n_threads, &g.pool));
    /* upper bound: 2 + 21 per layer (gpt-oss; deepseek2 with q_lora: 17) + 3 */
    g.ts = ks_calloc((size_t)(24 * (int64_t)n_layer + 8), sizeof *g.ts);
    if (!g.ts) {
        ks_pool_destroy(g.pool);
        return KS_FAIL(KS_ERR_NOMEM, "gen-model: tensor plan of %d layers", n_layer);
    }
    g.n_t = ks_gen_plan(&g, n_layer, n_vocab);

    ks_gguf_writer *w = NULL;
    ks_status st = ks_gguf_writer_create(&w);
    if (st == KS_OK) {
        ks_gen_set_metadata(w, s, p, n_layer, n_ctx, n_vocab);
        for (int64_t i = 0; i < g.n_t && st == KS_OK; i++) {
            ks_gen_tensor *t = &g.ts[i];
            int64_t ne[3] = {t->ne0, t->ne1, t->ne2};
            uint32_t n_dims = t->kind != KS_GEN_MATRIX ? (t->two_d ? 2 : 1) : t->ne2 > 1 ? 3 : 2;
            st = ks_gguf_writer_add_tensor(w, t->name, t->type, n_dims, ne, NULL, ks_gen_fill, t);
            g.bytes_total += t->nbytes;
        }
    }
    if (st == KS_OK) st = ks_gguf_writer_write(w, path);
    if (st == KS_OK && out_bytes) {
        FILE *f = fopen(path, "rb");
        if (f && fseek(f, 0, SEEK_END) == 0) *out_bytes = (uint64_t)ftell(f);
        if (f) fclose(f);
    }
    ks_gguf_writer_destroy(w);
    ks_free(g.ts);
    ks_pool_destroy(g.pool);
    return st;
}
