/*
 * cmd_gen_model.c — `kvsieve gen-model`: a GGUF with deterministic
 * pseudo-random weights of a real model shape (and, with --dlm-out, a random
 * EAGLE-3 retrieval head beside it), for tests and benchmarks at real sizes
 * without downloading weights.  The writer is the library's (ks_gen_model,
 * kvsieve_tools.h); this file checks the arguments and reports.
 */
#include "commands.h"
#include "kvsieve_tools.h"
#include "opts.h"

#include <stdio.h>

void app_gen_model_shapes(FILE *f) {
    fprintf(f, "\nshapes:\n");
    ks_gen_model_shapes(f);
}

int cmd_gen_model(int argc, char **argv) {
    app_options o;
    int rc = app_parse("gen-model", argc, argv, &o);
    if (rc >= 0) return rc;
    if (!o.shape || !o.type || !o.vocab_from || !o.out) {
        fprintf(stderr, "kvsieve gen-model: --shape, --type, --vocab-from and --out are required\n");
        app_usage("gen-model", stderr);
        return 2;
    }
    if (!ks_gen_model_shape_known(o.shape)) {
        fprintf(stderr, "kvsieve gen-model: unknown shape '%s' (see kvsieve gen-model --help)\n", o.shape);
        return 2;
    }
    if (!ks_gen_model_type_known(o.type)) {
        fprintf(stderr, "kvsieve gen-model: unknown weight type '%s' (q8_0 q6_k q5_k_m q5_k q5_1 q5_0 q4_k_m q4_k q4_1 q4_0 iq4_xs iq4_nl q3_k q2_k mxfp4 f16 bf16 f32)\n", o.type);
        return 2;
    }
    ks_gen_model_params p = ks_gen_model_default_params();
    p.shape = o.shape;
    p.type = o.type;
    p.vocab_path = o.vocab_from;
    p.seed = o.gen_seed;
    p.n_layer = (int32_t)o.gen_layers;
    p.n_ctx = (int32_t)o.gen_ctx;
    p.n_threads = (int32_t)o.gen_threads;
    double t0 = ks_time_sec();
    ks_gen_model_result r;
    const char *what = "writing the model";
    ks_status st = ks_gen_model(&p, o.out, &r, &what);
    if (st != KS_OK) {
        app_report("gen-model", what, st);
        return 1;
    }
    printf("gen-model: wrote %s: %s (%s) %s, %d layers, n_vocab %lld, seed %llu, %.1f MiB in %.1f s\n", o.out,
           r.shape_name, r.arch, r.type_name, r.n_layer, (long long)r.n_vocab, (unsigned long long)p.seed,
           (double)r.bytes / (1u << 20), ks_time_sec() - t0);
    if (o.dlm_out) {
        if ((st = ks_gen_model_dlm(&p, r.n_vocab, o.dlm_out)) != KS_OK) {
            app_report("gen-model", "writing the retrieval head", st);
            return 1;
        }
        printf("gen-model: wrote %s: random EAGLE-3 retrieval head (BF16, shares the target's embedding)\n", o.dlm_out);
    }
    return 0;
}
