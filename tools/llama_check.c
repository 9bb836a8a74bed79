/*
 * llama_check.c — llama.cpp's side of a greedy / perplexity comparison
 * through libllama's C API alone, for a llama.cpp build whose libllama is
 * done but whose tools (llama-completion, llama-perplexity: they need
 * common/) are not; not part of kvsieve's build.
 *
 *   cc -O2 -I$L/include -I$L/ggml/include tools/llama_check.c -o llama_check  *      -L$L/build/bin -lllama -lm -Wl,-rpath,$L/build/bin        (L: the llama.cpp tree)
 *   llama_check MODEL PROMPT N_GREEDY CTX TEXTFILE PPL_CTX CHUNKS
 *
 * Greedy: the prompt tokenized with BOS (as llama-completion), N_GREEDY
 * argmax steps, the pieces printed.  Perplexity: what llama-perplexity
 * computes: the text tokenized with BOS, chunks of PPL_CTX tokens, each
 * chunk's first token replaced by BOS, the second half scored (positions
 * PPL_CTX/2 .. PPL_CTX-2 predicting the next token), PPL = exp(mean NLL).
 */
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct llama_context *mk(struct llama_model *m, int n_ctx) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx; cp.n_batch = n_ctx; cp.n_ubatch = n_ctx; cp.n_threads = 2; cp.n_threads_batch = 2;
    return llama_init_from_model(m, cp);
}

int main(int argc, char **argv) {
    if (argc < 8) return 2;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    const struct llama_vocab *v = llama_model_get_vocab(m);
    int nv = llama_vocab_n_tokens(v), ng = atoi(argv[3]), ctx = atoi(argv[4]);
    llama_token toks[8192];
    int n = llama_tokenize(v, argv[2], (int)strlen(argv[2]), toks, 8192, true, false);
    struct llama_context *c = mk(m, ctx);
    if (llama_decode(c, llama_batch_get_one(toks, n))) return 1;
    for (int i = 0; i < ng; i++) {
        const float *lg = llama_get_logits_ith(c, -1);
        llama_token best = 0;
        for (int j = 1; j < nv; j++) if (lg[j] > lg[best]) best = j;
        char piece[256];
        int k = llama_token_to_piece(v, best, piece, sizeof piece, 0, false);
        if (k > 0) fwrite(piece, 1, (size_t)k, stdout);
        llama_token t = best;
        if (llama_decode(c, llama_batch_get_one(&t, 1))) return 1;
    }
    printf("\n");
    llama_free(c);
    /* perplexity as llama-perplexity: chunks of pc tokens, first replaced by BOS, second half scored */
    FILE *f = fopen(argv[5], "rb");
    if (!f) return 1;
    static char text[1 << 22];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    static llama_token all[1 << 20];
    int na = llama_tokenize(v, text, (int)len, all, 1 << 20, true, false);
    int pc = atoi(argv[6]), chunks = atoi(argv[7]);
    if (na / pc < chunks) chunks = na / pc;
    c = mk(m, pc);
    double nll = 0; int cnt = 0;
    for (int ch = 0; ch < chunks; ch++) {
        llama_memory_clear(llama_get_memory(c), true);
        llama_token b[4096];
        memcpy(b, all + ch * pc, sizeof(llama_token) * pc);
        b[0] = llama_vocab_bos(v);
        struct llama_batch bt = llama_batch_init(pc, 0, 1);
        for (int i = 0; i < pc; i++) {
            bt.token[i] = b[i]; bt.pos[i] = i; bt.n_seq_id[i] = 1; bt.seq_id[i][0] = 0; bt.logits[i] = 1;
        }
        bt.n_tokens = pc;
        if (llama_decode(c, bt)) return 1;
        for (int j = pc / 2; j < pc - 1; j++) {
            const float *lg = llama_get_logits_ith(c, j);
            double mx = lg[0], z = 0;
            for (int k = 1; k < nv; k++) if (lg[k] > mx) mx = lg[k];
            for (int k = 0; k < nv; k++) z += exp(lg[k] - mx);
            nll += -(lg[all[ch * pc + j + 1]] - mx - log(z));
            cnt++;
        }
        llama_batch_free(bt);
        printf("[%d]%.4f,", ch + 1, exp(nll / cnt)); /* the running value after each chunk, as llama-perplexity prints it */
    }
    printf("\nFinal estimate: PPL = %.4f (%d chunks, %d scored)\n", exp(nll / cnt), chunks, cnt);
    llama_free(c);
    llama_model_free(m);
    return 0;
}
