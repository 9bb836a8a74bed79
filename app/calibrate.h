/*
 * calibrate.h — CHESS's reconstruction thresholds, derived and stored
 * beside the model.
 *
 * `kvsieve eval --calibrate` collects the entropy and varentropy of every
 * output distribution of the dense reference runs, averages them per KV page
 * of generated tokens (a token belongs to the page its entry lands in: the
 * unit CHESS judges, "CHESS: Context-aware Hierarchical Efficient Semantic
 * Selection for Long-Context LLM Inference", Section 3.3 and Figure 4),
 * takes the 99th percentiles of the page averages and writes them with
 * cJSON to MODEL.gguf.chess.json (for the bundled model:
 * models/kvsieve-default.gguf.chess.json, committed beside it).  The
 * commands that run policies read that file (app_policy_calibration in
 * policy_opts.c) and pass the values as h_max / v_max to chess when the user
 * gave none, so the policy itself never needs the model path.
 */
#ifndef KS_APP_CALIBRATE_H
#define KS_APP_CALIBRATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APP_CHESS_CALIB_SUFFIX ".chess.json"
#define APP_CHESS_CALIB_PERCENTILE 99.0

/* Entropy H = -sum p log p and varentropy sum p (log p + H)^2 (nats) of softmax(logits [n]). */
void app_entropy_of(const float *logits, int32_t n, float *H, float *Var);
/* Per-page averages of entropy and varentropy of n_gen output distributions
 * (logits [n_gen][n_vocab]); distribution g was sampled into entry
 * first_entry + g, page (first_entry + g) / page.  Appends one (H, Var) pair
 * per page touched to h_out / v_out (room for n_gen each) and returns how
 * many. */
size_t app_chess_page_means(const float *logits, int32_t n_gen, int32_t n_vocab, int32_t first_entry, int32_t page,
                            double *h_out, double *v_out);
/* pct-th percentile (0..100, linear interpolation) of x [n] (sorted in place); NAN when n == 0. */
double app_percentile(double *x, size_t n, double pct);
/* MODEL + ".chess.json" into out; false if it does not fit. */
bool app_chess_calib_path(const char *model, char *out, size_t cap);
/* Write the thresholds; false with a message on stderr. */
bool app_chess_calib_write(const char *cmd, const char *model, double h_max, double v_max, size_t n_tokens,
                           size_t n_pages, int32_t page);
/* 1: read (h_max, v_max), 0: no file, -1: unreadable or malformed (message on stderr). */
int app_chess_calib_read(const char *cmd, const char *model, double *h_max, double *v_max);

#endif
