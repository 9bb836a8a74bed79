/*
 * p_chess.h — the pure parts of CHESS (p_chess.c), exposed for tests.
 *
 * The policy itself is registered as `ks_policy_chess`; these functions are
 * the math it runs once per (re)build, kept free of the KV store so tests
 * can drive them with hand-made page vectors: the scores of the three levels
 * of the hierarchy, and the coarse-to-fine masking.
 */
#ifndef KS_POLICIES_P_CHESS_H
#define KS_POLICIES_P_CHESS_H

#include "core/core.h"

#include <stdint.h>

typedef struct ks_chess_cfg {
    int32_t chunk;              /* Nc: pages per chunk (>= 1) */
    int32_t grid;               /* Ng: chunks per grid (>= 1) */
    double rho_g, rho_c, rho_p; /* retention ratios in (0, 1] */
} ks_chess_cfg;

/* Named presets of the paper: "conservative" (0.9, 0.9, 0.9), "moderate"
 * (0.8, 0.7, 0.7), "aggressive" (0.5, 0.2, 0.1).  KS_ERR_INVALID_ARG otherwise. */
ks_status ks_chess_preset(const char *name, double *rho_g, double *rho_c, double *rho_p);

/* Scores of every level for page vectors vecs [np][dim] and anchor [dim]:
 * page_s [np] = anchor . v_p; chunk_s [ceil(np/Nc)] = anchor . mean of the
 * chunk's page vectors; grid_s [ceil(np/(Nc*Ng))] = anchor . mean of its chunk
 * vectors.  By linearity the chunk (grid) score is the mean of its page (chunk)
 * scores, which is how it is computed: one pass over the vectors scores the
 * whole hierarchy, the batched product of the paper's Algorithm 1 without
 * materializing the stacked matrix.  Partial trailing chunks / grids average
 * over the members they have. */
void ks_chess_scores(const float *vecs, int32_t np, int32_t dim, const float *anchor, int32_t chunk, int32_t grid,
                     float *page_s, float *chunk_s, float *grid_s);

/* Chunk / grid scores from page scores (the averaging half of ks_chess_scores). */
void ks_chess_level_scores(const float *page_s, int32_t np, int32_t chunk, int32_t grid, float *chunk_s,
                           float *grid_s);

/* Coarse-to-fine masking over pages [0, np) with scores at every level:
 * keep ceil(rho_g * G) of the G grids by score, then ceil(rho_c * C') of the
 * C' chunks inside kept grids, then ceil(rho_p * P') of the P' pages inside
 * kept chunks (ties to the lower index).  Writes the kept pages to out [np]
 * in descending page score (ties: lower page first) and returns their count
 * (-1: its scratch was refused). */
int32_t ks_chess_mask(const float *page_s, const float *chunk_s, const float *grid_s, int32_t np,
                      const ks_chess_cfg *cfg, int32_t *out);

#endif
