/*
 * matmul_packed.c — weights repacked at load for the prefill GEMM: the
 * layouts (ks_matmul_pack, in place, the same size as the file's rows; the
 * K-quants' eight-row groups described as data in matmul_packed_x8q.c),
 * their drivers (which tile runs where, how the threads share a product),
 * and ks_matmul_weight, the product of a bound weight in whatever layout it
 * has.  The tiles themselves are matmul_x86_panel.c (Q8_0 / Q4_0) and
 * matmul_x86_q4k.c (the K-quants' eight-row groups, whose one kernel also
 * serves decode: the layout is chosen for both regimes).
 *
 * Why apart from matmul.c: matmul.c is the product as the file stores the
 * weights, tuned for decode (stream W once from DRAM); this file is the
 * other regime, prefill, where weights are reused from cache and the cost
 * is instructions per MAC and the two cores' balance.  It shares matmul.c's
 * driver (ks_mm_job, ks_mm_run, the activation partners), so it is a part
 * of that translation unit: matmul.c includes it after the driver with
 * KS_MM_PACKED_PART defined; compiled on its own it is empty.
 */
#ifndef KS_MM_PACKED_PART
typedef int ks_matmul_packed_is_included_by_matmul_c; /* standalone: nothing to compile */
#else
#include "matmul/matmul_packed_x8q.h"

/* ------------------------------------ packed Q8_0 / Q4_0 (prefill GEMM) --
 * (Q8_0 matrices whose rows are a multiple of 16 take the transposed
 * 16-row panels instead: ks_mm_pack_p16 below, matmul_x86_panel.c.)
 * Layout (KS_WEIGHT_Q8_0_P4): four rows form a panel of ng = nb / 4 groups;
 * panel p sits where rows 4p..4p+3 sat (4 * nb * 34 = ng * 544 bytes):
 *   u8  q[ng][512]   per group: LO of rows 0..3 (64 B each), then HI of rows 0..3
 *   f16 d[ng][4][4]  per group and row: the scales of its four blocks
 * LO/HI are the grouped kernel's lane order (128-bit lane k: elements 0-15 /
 * 16-31 of block 4g+k) as u8 w + 128 (matmul_x86_panel.c, "Q8_0 packed panels").
 * KS_WEIGHT_Q4_0_P4 is the same with q[ng][256]: per group and row 64 bytes,
 * 128-bit lane k holding block 4g+k's 16 packed nibble bytes as in the file
 * (ng * 288 = 4 * nb * 18 bytes).
 *
 * Why these products are shaped as they are: prefill multiplies hundreds of
 * vectors by each matrix, so weights are reused from cache and the cost is
 * instructions per MAC.  The packed tile takes 4 rows x 4 vectors per call
 * (each load serves 4 products), row panels in blocks that stay in L2 while
 * every 4-vector tile of activations (in L1 at 2048 columns) passes over
 * them, and the threads split the panels evenly, so both cores work on every
 * matmul of a chunk and finish together. */
#define KS_MM_P4_BLOCK_BYTES (256 * 1024) /* weight bytes of a row block kept in L2 */
#define KS_MM_P4_KGROUPS 16 /* groups (128 columns each) per K block */

bool ks_matmul_can_pack(const ks_weight *w) {
    if (w->layout == KS_WEIGHT_ROWS && w->type == KS_DTYPE_Q4_K && w->data) /* eight-row groups, AVX2 and AVX-512 */
        return w->rows > 0 && w->rows % 8 == 0 && w->cols > 0 && w->cols % KS_QK_K == 0 &&
               (ks_simd_detect() == KS_SIMD_AVX2 || ks_simd_detect() == KS_SIMD_AVX512);
    if (w->layout == KS_WEIGHT_ROWS && (w->type == KS_DTYPE_Q6_K || w->type == KS_DTYPE_IQ4_XS || w->type == KS_DTYPE_Q5_K) &&
        w->data) /* eight-row groups, AVX-512 only */
        return w->rows > 0 && w->rows % 8 == 0 && w->cols > 0 && w->cols % KS_QK_K == 0 &&
               ks_simd_detect() == KS_SIMD_AVX512;
    if (w->layout != KS_WEIGHT_ROWS || (w->type != KS_DTYPE_Q8_0 && w->type != KS_DTYPE_Q4_0) || !w->data) return false;
    if (w->type == KS_DTYPE_Q8_0 && w->rows > 0 && w->rows % 16 == 0 && w->cols > 0 && w->cols % KS_QK8_0 == 0)
        return ks_simd_detect() == KS_SIMD_AVX512; /* transposed 16-row panels */
    if (w->rows <= 0 || w->rows % 4 || w->cols <= 0 || w->cols % (4 * KS_QK8_0)) return false;
    return ks_simd_detect() == KS_SIMD_AVX512;
}

/* Bytes of a packed panel's quants per group (4 rows x 4 blocks) and of a
 * block in the file, by type. */
static size_t ks_mm_p4_gbytes(ks_dtype t) { return t == KS_DTYPE_Q8_0 ? 512 : 256; }

/* Q8_0 into transposed 16-row panels (KS_WEIGHT_Q8_0_P16), in place:
 * panel p (rows 16p..16p+15, 16 * nb * 34 = nb * 544 bytes) holds per block
 * b eight 64-byte groups (group k, lane r: bytes 4k..4k+3 of row r's block
 * b, xor 0x80), then the f16 scales [nb][16]. */
static ks_status ks_mm_pack_p16(ks_weight *w) {
    const int64_t nb = w->cols / KS_QK8_0;
    const size_t panel_bytes = (size_t)nb * 544;
    /* The panels scale by adding the activations' power-of-two exponent to
     * the bits of each block scale (matmul_x86_panel.c, ks_mm_scale_pow2),
     * which is the product only for finite scales: a matrix with an infinite
     * or NaN scale keeps the file layout, whose products carry it through. */
    const ks_block_q8_0 *blocks = w->data;
    for (int64_t i = 0; i < w->rows * nb; i++)
        if ((blocks[i].d & 0x7C00) == 0x7C00) return KS_OK;
    ks_block_q8_0 *rows = ks_malloc(panel_bytes);
    if (!rows) return KS_FAIL(KS_ERR_NOMEM, "repacking a %lld-column matrix", (long long)w->cols);
    uint8_t *base = (uint8_t *)(uintptr_t)w->data;
    for (int64_t p = 0; p < w->rows / 16; p++) {
        uint8_t *panel = base + (size_t)p * panel_bytes;
        memcpy(rows, panel, panel_bytes);
        ks_f16 *d = (ks_f16 *)(panel + (size_t)nb * 512);
        for (int64_t b = 0; b < nb; b++)
            for (int r = 0; r < 16; r++) {
                const ks_block_q8_0 *blk = &rows[(size_t)r * nb + b];
                /* a zero scale: its quants count for nothing, and zeroed they give the sum 0 that the
                 * tiny stand-in for dw * dx multiplies (ks_mm_scale_pow2) */
                const bool zero = (blk->d & 0x7FFF) == 0;
                for (int k = 0; k < 8; k++)
                    for (int i = 0; i < 4; i++)
                        panel[(size_t)b * 512 + 64 * k + 4 * r + i] = zero ? 0x80 : (uint8_t)(blk->qs[4 * k + i] ^ 0x80);
                memcpy(&d[b * 16 + r], &blk->d, sizeof(ks_f16));
            }
    }
    ks_free(rows);
    w->layout = KS_WEIGHT_Q8_0_P16;
    return KS_OK;
}

static void ks_mm_unpack_p16(const uint8_t *panel, int64_t nb, ks_block_q8_0 *rows) {
    const ks_f16 *d = (const ks_f16 *)(panel + (size_t)nb * 512);
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < 16; r++) {
            ks_block_q8_0 *blk = &rows[(size_t)r * nb + b];
            for (int k = 0; k < 8; k++)
                for (int i = 0; i < 4; i++) blk->qs[4 * k + i] = (int8_t)(panel[(size_t)b * 512 + 64 * k + 4 * r + i] ^ 0x80);
            memcpy(&blk->d, &d[b * 16 + r], sizeof(ks_f16));
        }
}

#define KS_MM_P16_NC 8 /* vectors per transposed-panel tile */
#ifndef KS_MM_T2_BLOCK_BYTES
#define KS_MM_T2_BLOCK_BYTES (256 * 1024)
#endif

#if KS_MM_HAVE_X86
/* Rows b0..b1-1 of panels (a row block, its weights kept in L2) times
 * vectors c0..c1-1, KS_MM_T2_NP panels at a time through the multi-panel
 * tile (an odd panel left over through the one-panel kernel: same bits). */
/* Whether a tile may prefetch the next tile's activations into L1: only
 * when they fit beside the weights streaming through it (half of a 48 KiB
 * L1).  At 8192 columns (the down projection) a 6-vector tile is 60 KiB:
 * prefetched during a tile that streams 278 KiB of weights, the lines were
 * evicted before use, and leaving them out measured +3% on that shape
 * (2048 x 8192 x 256, 1 thread, 4 of 4 alternated runs, 2026-11-27). */
#ifndef KS_MM_XNEXT_OK
#define KS_MM_XNEXT_OK(xs) ((size_t)KS_MM_T2_NC * (xs) <= 24 * 1024)
#endif
static void ks_mm_p16_unit(const ks_mm_job *job, int64_t b0, int64_t b1, int64_t c0, int64_t c1) {
    const int64_t nb = job->cols / KS_QK8_0;
    const size_t panel_bytes = (size_t)nb * 544;
    for (int64_t c = c0; c < c1; c += KS_MM_T2_NC) {
        const int nc = (int)(c1 - c < KS_MM_T2_NC ? c1 - c : KS_MM_T2_NC);
        const uint8_t *xq = job->xq + (size_t)c * job->xs;
        float *y = job->Y + c * job->rows;
        int64_t p = b0;
        for (; p + KS_MM_T2_NP <= b1; p += KS_MM_T2_NP) {
            /* the block's last tile pulls the next vectors' activations into L1 (past the unit's
             * last vector too: the owner's next unit is mostly the next vectors of this block) */
            const uint8_t *xnext = KS_MM_XNEXT_OK(job->xs) && p + 2 * KS_MM_T2_NP > b1 && c + 2 * KS_MM_T2_NC <= job->n
                                       ? xq + (size_t)KS_MM_T2_NC * job->xs
                                       : NULL;
            ks_mm_q8_0t2_avx512(job->W + (size_t)p * panel_bytes, panel_bytes, nb, xq, job->xs, xnext, nc, y + 16 * p,
                                job->rows);
        }
        for (; p < b1; p++)
            ks_mm_q8_0t_avx512(job->W + (size_t)p * panel_bytes, nb, xq, job->xs, nc, y + 16 * p, job->rows);
    }
}

/* Spin (politely) until *v reaches want. */
static void ks_mm_wait_at_least(atomic_llong *v, long long want) {
    for (int spins = 1; atomic_load_explicit(v, memory_order_acquire) < want; spins++) {
        __builtin_ia32_pause();
        if ((spins & 63) == 0) sched_yield(); /* a descheduled peer holds the rest */
    }
}

#define KS_MM_QGRAB 4 /* activation vectors claimed at a time */
#define KS_MM_SEG (8 * KS_MM_T2_NC) /* vectors per unit of work */

/* The prefill product over transposed panels (n > KS_MM_P16_NC, AVX-512),
 * balanced so that neither core waits for the other (and, through
 * ks_mm_balanced, the AVX-512 K-quant groups' prefill).
 *
 * Why: a static half each (what decode does) made every matmul as slow as
 * its later thread, and a thread is often late: the worker wakes from the
 * pool's futex while the caller already runs, and on a shared host either
 * may be descheduled for a while.  Measured on the 1B model's 512-token
 * prefill (host loaded), the worker started its half ~1/4 of the GEMM time
 * late in total.  So the work is cut into units (a row block of panels that
 * stays in L2 x KS_MM_SEG vectors) and claimed through atomic cursors:
 * the panels are split into one contiguous share per thread as before, each
 * thread runs its own share's units in order (the row block stays in its
 * L2 across the vector segments) and then helps with the others' remaining
 * units.  The activations are quantized the same way, by whoever comes
 * first, and the product starts once every vector is done, so there is one
 * hand-off per matmul instead of two.  Which thread computes an output
 * changes nothing in its arithmetic (one tile call over all of K, the same
 * bits for every nc), so the result is the static split's, bit for bit. */
typedef void (*ks_mm_unit_fn)(const ks_mm_job *job, int64_t b0, int64_t b1, int64_t c0, int64_t c1);

/* The balanced product over n_panels panels of panel_bytes each, row blocks
 * a multiple of np panels, unit() running one unit: the transposed Q8_0
 * panels (below) and the AVX-512 Q4_K groups (ks_mm_x8q_prefill_worker). */
static void ks_mm_balanced(const ks_mm_job *job, int ith, int nth, int64_t n_panels, size_t panel_bytes, int64_t np,
                           ks_mm_unit_fn unit) {
    ks_mm_share *sh = job->share;
    const int64_t n = job->n;
    if (job->x_todo) {
        for (;;) {
            const long long c0 = atomic_fetch_add_explicit(&sh->qnext, KS_MM_QGRAB, memory_order_relaxed);
            if (c0 >= n) break;
            const long long c1 = c0 + KS_MM_QGRAB < n ? c0 + KS_MM_QGRAB : n;
            for (long long c = c0; c < c1; c++) ks_mm_quantize_one(job, c);
            atomic_fetch_add_explicit(&sh->qdone, c1 - c0, memory_order_release);
        }
        ks_mm_wait_at_least(&sh->qdone, n);
    }
    int64_t block = (int64_t)(KS_MM_T2_BLOCK_BYTES / panel_bytes) / np * np;
    if (block < np) block = np;
    const int64_t nseg = (n + KS_MM_SEG - 1) / KS_MM_SEG;
    const int shares = nth < KS_MM_SHARES ? nth : KS_MM_SHARES;
    for (int k = 0; k < shares; k++) {
        const int t = (ith + k) % shares; /* own share first, then the others' */
        int64_t p0, p1;
        ks_pool_share(n_panels, t, shares, &p0, &p1);
        const long long units = (p1 - p0 + block - 1) / block * nseg;
        for (;;) {
            const long long u = atomic_fetch_add_explicit(&sh->unit[t].next, 1, memory_order_relaxed);
            if (u >= units) break;
            const int64_t b0 = p0 + (u / nseg) * block, c0 = (u % nseg) * KS_MM_SEG;
            unit(job, b0, b0 + block < p1 ? b0 + block : p1, c0, c0 + KS_MM_SEG < n ? c0 + KS_MM_SEG : n);
        }
    }
}

static void ks_mm_p16_prefill_worker(void *arg, int ith, int nth) {
    const ks_mm_job *job = arg;
    ks_mm_balanced(job, ith, nth, job->rows / 16, (size_t)(job->cols / KS_QK8_0) * 544, KS_MM_T2_NP, ks_mm_p16_unit);
}
#endif

/* Transposed panels for decode at AVX-512 (n <= KS_MM_P16_NC: each thread
 * streams its half of the panels once) and for every n below AVX-512 (the
 * panels unpacked into rows for the level's kernel); prefill at AVX-512 is
 * ks_mm_p16_prefill_worker above. */
static void ks_mm_p16_worker(void *arg, int ith, int nth) {
    const ks_mm_job *job = arg;
    const int64_t nb = job->cols / KS_QK8_0, n_panels = job->rows / 16;
    const size_t panel_bytes = (size_t)nb * 544;
    int64_t p0, p1;
    ks_pool_share(n_panels, ith, nth, &p0, &p1);
    if (p0 >= p1) return;
#if KS_MM_HAVE_X86
    if (job->level == KS_SIMD_AVX512) {
        /* row block: weights kept in L2 while every 8-vector tile passes */
        int64_t block = (int64_t)(KS_MM_P4_BLOCK_BYTES / panel_bytes);
        if (block < 1) block = 1;
        if (job->n <= KS_MM_P16_NC) block = p1 - p0;
        for (int64_t b0 = p0; b0 < p1; b0 += block) {
            const int64_t b1 = b0 + block < p1 ? b0 + block : p1;
            for (int64_t c = 0; c < job->n; c += KS_MM_P16_NC) {
                const int nc = (int)(job->n - c < KS_MM_P16_NC ? job->n - c : KS_MM_P16_NC);
                for (int64_t p = b0; p < b1; p++)
                    ks_mm_q8_0t_avx512(job->W + (size_t)p * panel_bytes, nb, job->xq + (size_t)c * job->xs, job->xs,
                                       nc, job->Y + c * job->rows + 16 * p, job->rows);
            }
        }
        return;
    }
#endif
    ks_block_q8_0 *rows = ks_scratch(KS_SCRATCH_KERNEL, panel_bytes);
    KS_ASSERT(rows); /* reserved before the run (ks_matmul_worker_scratch_bytes) */
    for (int64_t p = p0; p < p1; p++) {
        ks_mm_unpack_p16(job->W + (size_t)p * panel_bytes, nb, rows);
        for (int r = 0; r < 16; r++)
            for (int64_t c = 0; c < job->n; c += KS_MM_NC) {
                const int nc = (int)(job->n - c < KS_MM_NC ? job->n - c : KS_MM_NC);
                job->kern((const uint8_t *)(rows + (size_t)r * nb), job->xq + (size_t)c * job->xs, job->xs, nc,
                          job->cols, job->Y + c * job->rows + 16 * p + r, job->rows);
            }
    }
}

/* ------------------ K-quants in eight-row groups (X8: AVX2, X8Q: AVX-512) --
 * Q4_K (lane width 4 at AVX2, 8 at AVX-512 VNNI) and Q6_K, IQ4_XS, Q5_K
 * (AVX-512 VNNI) repacked into groups of eight rows whose one kernel per
 * type and level serves decode and prefill (matmul_x86_q4k.c).  The layouts
 * themselves, their pack and their unpack: matmul_packed_x8q.c. */

/* The group layout of a type at lane width lw (4: X8, 8: X8Q). */
static ks_weight_layout ks_mm_x8_layout(ks_dtype t, int lw) {
    return lw == 4                  ? KS_WEIGHT_Q4_K_X8
           : t == KS_DTYPE_Q6_K     ? KS_WEIGHT_Q6_K_X8Q
           : t == KS_DTYPE_IQ4_XS   ? KS_WEIGHT_IQ4_XS_X8Q
           : t == KS_DTYPE_Q5_K     ? KS_WEIGHT_Q5_K_X8Q
                                    : KS_WEIGHT_Q4_K_X8Q;
}

/* The product over eight-row groups: the rows split between the threads and
 * blocked for L2 / L1 exactly as ks_mm_worker does for the file's rows, every
 * eight rows one call of the layout's group kernel where the level has it
 * (X8 at AVX2, X8Q at AVX-512); at any other level (tests forcing one) each
 * group is unpacked into rows for the level's kernel, the same bits as the
 * unpacked matrix at that level.  X8Q prefill at AVX-512 is
 * ks_mm_x8q_prefill_worker below. */
static void ks_mm_x8_rows_work(const ks_mm_job *job, int ith, int nth, int lw) {
    const int64_t units = (job->rows + KS_MM_ROWS - 1) / KS_MM_ROWS;
    int64_t u0, u1;
    ks_pool_share(units, ith, nth, &u0, &u1);
    const int64_t r_begin = u0 * KS_MM_ROWS, r_end = u1 * KS_MM_ROWS < job->rows ? u1 * KS_MM_ROWS : job->rows;
    if (r_begin >= r_end) return;
#if KS_MM_HAVE_X86
    if ((lw == 4 && job->level == KS_SIMD_AVX2) || (lw == 8 && job->level == KS_SIMD_AVX512)) {
        const int tile = lw == 4 ? KS_MM_T8_NC : KS_MM_X8Q_NC;
        int64_t chunk = (int64_t)(KS_MM_CHUNK_BYTES / job->wrow) / KS_MM_ROWS * KS_MM_ROWS;
        if (chunk < KS_MM_ROWS) chunk = KS_MM_ROWS;
        int64_t vg = (int64_t)(KS_MM_GROUP_L1 / job->xs) / KS_MM_NC * KS_MM_NC;
        if (vg < KS_MM_NC) vg = KS_MM_NC;
        if (vg > KS_MM_VG) vg = KS_MM_VG;
        /* up to KS_MM_T8_NC vectors a call, as the eight-row tiles over the
         * file's rows: each pass over a group's weights serves more vectors */
        if (vg < KS_MM_T8_NC) vg = KS_MM_T8_NC;
        if (job->n <= vg) chunk = r_end - r_begin; /* one pass: W streams once regardless */
        for (int64_t r0 = r_begin; r0 < r_end; r0 += chunk) {
            const int64_t r1 = r0 + chunk < r_end ? r0 + chunk : r_end;
            for (int64_t c0 = 0; c0 < job->n; c0 += vg) {
                const int64_t c1 = c0 + vg < job->n ? c0 + vg : job->n;
                for (int64_t r = r0; r < r1; r += 8)
                    for (int64_t c = c0; c < c1; c += tile) {
                        const int nc = (int)(c1 - c < tile ? c1 - c : tile);
                        (lw == 4                              ? ks_mm_q4_kx8_avx2
                         : job->wtype == KS_DTYPE_Q6_K   ? ks_mm_q6_kx8q_avx512
                         : job->wtype == KS_DTYPE_IQ4_XS ? ks_mm_iq4_xsx8q_avx512
                         : job->wtype == KS_DTYPE_Q5_K   ? ks_mm_q5_kx8q_avx512
                                                         : ks_mm_q4_kx8q_avx512)(
                            job->W + (size_t)r * job->wrow, job->xq + (size_t)c * job->xs, job->xs, nc, job->cols,
                            job->Y + c * job->rows + r, job->rows);
                    }
            }
        }
        return;
    }
#endif
    uint8_t *rows = ks_scratch(KS_SCRATCH_KERNEL, 8 * job->wrow);
    KS_ASSERT(rows); /* reserved before the run (ks_matmul_worker_scratch_bytes) */
    const ks_matmul_group_layout *g = ks_matmul_group_layout_of(ks_mm_x8_layout(job->wtype, lw));
    for (int64_t r = r_begin; r < r_end; r += 8) {
        ks_matmul_group_unpack(g, job->W + (size_t)r * job->wrow, job->cols / KS_QK_K, rows);
        for (int i = 0; i < 8; i++)
            for (int64_t c = 0; c < job->n; c += KS_MM_NC) {
                const int nc = (int)(job->n - c < KS_MM_NC ? job->n - c : KS_MM_NC);
                job->kern(rows + (size_t)i * job->wrow, job->xq + (size_t)c * job->xs, job->xs, nc, job->cols,
                          job->Y + c * job->rows + r + i, job->rows);
            }
    }
}

static void ks_mm_x8_worker(void *arg, int ith, int nth) { ks_mm_x8_rows_work(arg, ith, nth, 4); }
static void ks_mm_x8q_worker(void *arg, int ith, int nth) { ks_mm_x8_rows_work(arg, ith, nth, 8); }

#if KS_MM_HAVE_X86
/* Groups g0..g1-1 (a row block, its weights kept in L2) times vectors
 * c0..c1-1, KS_MM_X8Q_NC vectors a call (their activations in L1). */
static void ks_mm_x8q_unit(const ks_mm_job *job, int64_t g0, int64_t g1, int64_t c0, int64_t c1) {
    const size_t gbytes = 8 * job->wrow;
    for (int64_t c = c0; c < c1; c += KS_MM_X8Q_NC) {
        const int nc = (int)(c1 - c < KS_MM_X8Q_NC ? c1 - c : KS_MM_X8Q_NC);
        for (int64_t g = g0; g < g1; g++)
            (job->wtype == KS_DTYPE_Q6_K     ? ks_mm_q6_kx8q_avx512
             : job->wtype == KS_DTYPE_IQ4_XS ? ks_mm_iq4_xsx8q_avx512
             : job->wtype == KS_DTYPE_Q5_K   ? ks_mm_q5_kx8q_avx512
                                             : ks_mm_q4_kx8q_avx512)(job->W + (size_t)g * gbytes, job->xq + (size_t)c * job->xs, job->xs, nc, job->cols,
                                 job->Y + c * job->rows + 8 * g, job->rows);
    }
}

/* X8Q prefill at AVX-512: the transposed Q8_0 panels' balanced split
 * (ks_mm_balanced: contiguous shares claimed in units, the activations
 * quantized by whoever comes first), a group of eight rows as the panel.
 * Each output is one kernel call over all of K, so the bits are the static
 * split's. */
static void ks_mm_x8q_prefill_worker(void *arg, int ith, int nth) {
    const ks_mm_job *job = arg;
    ks_mm_balanced(job, ith, nth, job->rows / 8, 8 * job->wrow, 1, ks_mm_x8q_unit);
}
#endif

ks_status ks_matmul_pack(ks_weight *w) {
    if (!ks_matmul_can_pack(w)) return KS_OK;
    if (w->type == KS_DTYPE_Q4_K) /* four-byte lanes at AVX2, eight at AVX-512 */
        return ks_matmul_group_pack_weight(w, ks_mm_x8_layout(w->type, ks_simd_detect() == KS_SIMD_AVX512 ? 8 : 4));
    if (w->type == KS_DTYPE_Q6_K || w->type == KS_DTYPE_IQ4_XS || w->type == KS_DTYPE_Q5_K)
        return ks_matmul_group_pack_weight(w, ks_mm_x8_layout(w->type, 8));
    if (w->type == KS_DTYPE_Q8_0 && w->rows % 16 == 0) return ks_mm_pack_p16(w);
    const bool q8 = w->type == KS_DTYPE_Q8_0;
    const int64_t nb = w->cols / 32, ng = nb / 4;
    const size_t bb = q8 ? sizeof(ks_block_q8_0) : sizeof(ks_block_q4_0), gq = ks_mm_p4_gbytes(w->type);
    const size_t panel_bytes = (size_t)ng * (gq + 32);
    KS_ASSERT(panel_bytes == 4 * (size_t)nb * bb); /* in place: same size */
    uint8_t *rows = ks_malloc(panel_bytes);
    if (!rows) return KS_FAIL(KS_ERR_NOMEM, "repacking a %lld-column matrix", (long long)w->cols);
    uint8_t *base = (uint8_t *)(uintptr_t)w->data; /* the caller made it writable */
    for (int64_t p = 0; p < w->rows / 4; p++) {
        uint8_t *panel = base + (size_t)p * panel_bytes;
        memcpy(rows, panel, panel_bytes);
        ks_f16 *d = (ks_f16 *)(panel + (size_t)ng * gq);
        for (int64_t g = 0; g < ng; g++)
            for (int r = 0; r < 4; r++)
                for (int k = 0; k < 4; k++) {
                    const uint8_t *b = rows + ((size_t)r * nb + 4 * g + k) * bb;
                    ks_f16 dk;
                    if (q8) {
                        const ks_block_q8_0 *b8 = (const ks_block_q8_0 *)b;
                        uint8_t *lo = panel + (size_t)g * gq + 64 * r + 16 * k, *hi = lo + 256;
                        for (int i = 0; i < 16; i++) {
                            lo[i] = (uint8_t)(b8->qs[i] ^ 0x80);
                            hi[i] = (uint8_t)(b8->qs[16 + i] ^ 0x80);
                        }
                        dk = b8->d;
                    } else {
                        const ks_block_q4_0 *b4 = (const ks_block_q4_0 *)b;
                        memcpy(panel + (size_t)g * gq + 64 * r + 16 * k, b4->qs, 16);
                        dk = b4->d;
                    }
                    memcpy(&d[(g * 4 + r) * 4 + k], &dk, sizeof(ks_f16));
                }
    }
    ks_free(rows);
    w->layout = q8 ? KS_WEIGHT_Q8_0_P4 : KS_WEIGHT_Q4_0_P4;
    return KS_OK;
}

/* Panel p back to four ordinary rows (the fallback below a level that has
 * the packed tile: tests forcing AVX2 or scalar). */
static void ks_mm_unpack_panel(ks_dtype t, const uint8_t *panel, int64_t nb, uint8_t *rows) {
    const bool q8 = t == KS_DTYPE_Q8_0;
    const int64_t ng = nb / 4;
    const size_t bb = q8 ? sizeof(ks_block_q8_0) : sizeof(ks_block_q4_0), gq = ks_mm_p4_gbytes(t);
    const ks_f16 *d = (const ks_f16 *)(panel + (size_t)ng * gq);
    for (int64_t g = 0; g < ng; g++)
        for (int r = 0; r < 4; r++)
            for (int k = 0; k < 4; k++) {
                uint8_t *b = rows + ((size_t)r * nb + 4 * g + k) * bb;
                const uint8_t *src = panel + (size_t)g * gq + 64 * r + 16 * k;
                if (q8) {
                    ks_block_q8_0 *b8 = (ks_block_q8_0 *)b;
                    for (int i = 0; i < 16; i++) {
                        b8->qs[i] = (int8_t)(src[i] ^ 0x80);
                        b8->qs[16 + i] = (int8_t)(src[256 + i] ^ 0x80);
                    }
                    memcpy(&b8->d, &d[(g * 4 + r) * 4 + k], sizeof(ks_f16));
                } else {
                    ks_block_q4_0 *b4 = (ks_block_q4_0 *)b;
                    memcpy(b4->qs, src, 16);
                    memcpy(&b4->d, &d[(g * 4 + r) * 4 + k], sizeof(ks_f16));
                }
            }
}

static void ks_mm_packed_worker(void *arg, int ith, int nth) {
    const ks_mm_job *job = arg;
    const int64_t nb = job->cols / KS_QK8_0, ng = nb / 4, n_panels = job->rows / 4;
    const size_t bb = job->wrow / (size_t)nb, panel_bytes = (size_t)ng * (ks_mm_p4_gbytes(job->wtype) + 32);
    int64_t p0, p1;
    ks_pool_share(n_panels, ith, nth, &p0, &p1);
    if (p0 >= p1) return;
#if KS_MM_HAVE_X86
    if (job->level == KS_SIMD_AVX512) {
        /* row block: weights kept in L2 while every vector tile passes;
         * K block: a tile's activations (4 x KG x 256 B) kept in L1 */
        int64_t block = (int64_t)(KS_MM_P4_BLOCK_BYTES / panel_bytes);
        if (block < 1) block = 1;
        if (job->n <= KS_MM_NC) block = p1 - p0;
        const int64_t kg = job->n <= KS_MM_NC || ng <= KS_MM_P4_KGROUPS ? ng : KS_MM_P4_KGROUPS;
        float *acc = ks_scratch(KS_SCRATCH_KERNEL, sizeof(float) * 256 * (size_t)(kg < ng ? block : 1));
        KS_ASSERT(acc); /* reserved before the run (ks_matmul_worker_scratch_bytes) */
        for (int64_t b0 = p0; b0 < p1; b0 += block) {
            const int64_t b1 = b0 + block < p1 ? b0 + block : p1;
            for (int64_t c = 0; c < job->n; c += KS_MM_NC) {
                const int nc = (int)(job->n - c < KS_MM_NC ? job->n - c : KS_MM_NC);
                for (int64_t g0 = 0; g0 < ng; g0 += kg) {
                    const int64_t g1 = g0 + kg < ng ? g0 + kg : ng;
                    for (int64_t p = b0; p < b1; p++)
                        (job->wtype == KS_DTYPE_Q8_0 ? ks_mm_q8_0p_avx512 : ks_mm_q4_0p_avx512)(
                            job->W + (size_t)p * panel_bytes, ng, g0, g1, job->xq + (size_t)c * job->xs, job->xs, nc,
                            acc + (kg < ng ? 256 * (size_t)(p - b0) : 0), job->Y + c * job->rows + 4 * p, job->rows, 4);
                }
            }
        }
        return;
    }
#endif
    uint8_t *rows = ks_scratch(KS_SCRATCH_KERNEL, panel_bytes);
    KS_ASSERT(rows); /* reserved before the run (ks_matmul_worker_scratch_bytes) */
    for (int64_t p = p0; p < p1; p++) {
        ks_mm_unpack_panel(job->wtype, job->W + (size_t)p * panel_bytes, nb, rows);
        for (int r = 0; r < 4; r++)
            for (int64_t c = 0; c < job->n; c += KS_MM_NC) {
                const int nc = (int)(job->n - c < KS_MM_NC ? job->n - c : KS_MM_NC);
                job->kern(rows + (size_t)r * nb * bb, job->xq + (size_t)c * job->xs, job->xs, nc, job->cols,
                          job->Y + c * job->rows + 4 * p + r, job->rows);
            }
    }
}

int64_t ks_matmul_row_align(const ks_weight *w) {
    if (w->layout == KS_WEIGHT_ROWS) return 1;
    return ks_matmul_group_layout_of(w->layout) ? 8 : 0;
}

size_t ks_matmul_worker_scratch_bytes(const ks_weight *w) {
    if (ks_matmul_group_layout_of(w->layout)) return 8 * ks_dtype_row_bytes(w->type, w->cols); /* one group unpacked */
    const int64_t nb = w->cols / KS_QK8_0;
    size_t panel_bytes;
    if (w->layout == KS_WEIGHT_Q8_0_P16) panel_bytes = (size_t)nb * 544;
    else if (w->layout == KS_WEIGHT_Q8_0_P4 || w->layout == KS_WEIGHT_Q4_0_P4)
        panel_bytes = (size_t)(nb / 4) * (ks_mm_p4_gbytes(w->type) + 32);
    else return 0;
    /* the unpacked fallback's rows, or the AVX-512 tile's accumulators of a row block */
    size_t block = panel_bytes ? KS_MM_P4_BLOCK_BYTES / panel_bytes : 1;
    size_t acc = sizeof(float) * 256 * (block > 1 ? block : 1);
    return panel_bytes > acc ? panel_bytes : acc;
}

void ks_matmul_weight_ex(ks_pool *pool, const ks_weight *w, const float *X, int64_t n, float *Y, void *scratch,
                         bool x_ready) {
    if (w->layout == KS_WEIGHT_ROWS) {
        ks_mm_run(pool, w->type, w->data, w->rows, w->cols, X, n, Y, scratch, ks_mm_worker, x_ready, false, NULL);
        return;
    }
    if (w->layout == KS_WEIGHT_Q8_0_P16) {
        KS_ASSERT(w->type == KS_DTYPE_Q8_0);
        if (w->rows == 0 || n == 0) return;
#if KS_MM_HAVE_X86
        if (n > KS_MM_P16_NC && ks_simd_current() == KS_SIMD_AVX512) { /* prefill: balanced tiles */
            ks_mm_share share;
            ks_mm_run(pool, w->type, w->data, w->rows, w->cols, X, n, Y, scratch, ks_mm_p16_prefill_worker, x_ready,
                      true, &share);
            return;
        }
#endif
        ks_mm_run(pool, w->type, w->data, w->rows, w->cols, X, n, Y, scratch, ks_mm_p16_worker, x_ready, true, NULL);
        return;
    }
    const ks_matmul_group_layout *g = ks_matmul_group_layout_of(w->layout);
    if (g) { /* eight-row groups */
        KS_ASSERT(w->type == g->type && w->rows % 8 == 0);
        if (w->rows == 0 || n == 0) return;
        const bool q = w->layout != KS_WEIGHT_Q4_K_X8;
#if KS_MM_HAVE_X86
        if (q && n >= KS_MM_PAIR_N && ks_simd_current() == KS_SIMD_AVX512) { /* prefill: balanced units */
            ks_mm_share share;
            ks_mm_run(pool, w->type, w->data, w->rows, w->cols, X, n, Y, scratch, ks_mm_x8q_prefill_worker, x_ready,
                      false, &share);
            return;
        }
#endif
        ks_mm_run(pool, w->type, w->data, w->rows, w->cols, X, n, Y, scratch, q ? ks_mm_x8q_worker : ks_mm_x8_worker,
                  x_ready, false, NULL);
        return;
    }
    KS_ASSERT((w->layout == KS_WEIGHT_Q8_0_P4 && w->type == KS_DTYPE_Q8_0) ||
              (w->layout == KS_WEIGHT_Q4_0_P4 && w->type == KS_DTYPE_Q4_0));
    if (w->rows == 0 || n == 0) return;
    ks_mm_run(pool, w->type, w->data, w->rows, w->cols, X, n, Y, scratch, ks_mm_packed_worker, x_ready, false, NULL);
}

void ks_matmul_weight(ks_pool *pool, const ks_weight *w, const float *X, int64_t n, float *Y, void *scratch) {
    ks_matmul_weight_ex(pool, w, X, n, Y, scratch, false);
}

#endif /* KS_MM_PACKED_PART */
