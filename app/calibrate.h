/*
 * calibrate.h — CHESS's reconstruction thresholds, derived and stored
 * beside the model.
 *
 * `kvsieve eval --calibrate` collects the entropy and varentropy of every
 * output distribution of the dense reference runs, takes their 99th
 * percentiles and writes them with cJSON to MODEL.gguf.chess.json.  The
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
/* pct-th percentile (0..100, linear interpolation) of x [n] (sorted in place); NAN when n == 0. */
double app_percentile(double *x, size_t n, double pct);
/* MODEL + ".chess.json" into out; false if it does not fit. */
bool app_chess_calib_path(const char *model, char *out, size_t cap);
/* Write the thresholds; false with a message on stderr. */
bool app_chess_calib_write(const char *cmd, const char *model, double h_max, double v_max, size_t n_tokens);
/* 1: read (h_max, v_max), 0: no file, -1: unreadable or malformed (message on stderr). */
int app_chess_calib_read(const char *cmd, const char *model, double *h_max, double *v_max);

#endif
