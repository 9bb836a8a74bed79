/*
 * matmul_packed_x8q.c — the K-quants' eight-row group layouts (X8, X8Q):
 * what each looks like, and the one pack and one unpack that make them.
 *
 * Rows 8g..8g+7 of a Q4_K, Q5_K, Q6_K or IQ4_XS matrix form group g, in
 * place of those rows, so that the group kernels (matmul_x86_q4k.c, which
 * say why these layouts serve decode and prefill alike) load one field of
 * all eight rows with one instruction.  Every layout here is the same byte
 * shuffle: per super-block, each field of a row's block (a scale, the
 * quants) is cut into chunks of a lane width, and chunk c of the eight rows
 * is stored side by side.  Written by hand, that was one pack and one
 * unpack per layout, four near-identical pairs whose offsets had to agree
 * with each other and with the kernels; here a layout is a table row (each
 * field's source offset, destination offset, lane width and chunk count)
 * and ks_matmul_group_pack / _unpack walk it.  Pack and unpack read the
 * same row, so they cannot disagree, and tests/test_matmul.c checks that
 * unpack undoes pack for every layout.
 *
 * Why apart from matmul_packed.c: that file is the drivers (which kernel
 * runs where, how the threads share a product), a part of matmul.c's
 * translation unit; this is the layouts alone, a translation unit of its
 * own that needs nothing of the driver, so a test can reach it.
 */
#include "matmul/matmul_packed_x8q.h"

#include <stddef.h>
#include <string.h>

/* A field of `count` chunks of `lane` bytes, from offset src of the file's
 * block to offset dst of the super-block. */
#define KS_MM_FIELD(src, dst, lane, count) {(uint16_t)(src), (uint16_t)(dst), (uint8_t)(lane), (uint8_t)(count)}

static const ks_matmul_group_layout ks_mm_group_layouts[] = {
    /* Q4_K in eight-row groups, layouts KS_WEIGHT_Q4_K_X8 (AVX2) and
     * KS_WEIGHT_Q4_K_X8Q (AVX-512 VNNI; matmul_x86_q4k.c has both in full and
     * says why): rows 8g..8g+7 form group g, in place of those rows (8 * nb *
     * 144 bytes); per super-block 1152 bytes: the eight rows' f16 d, then f16
     * dmin, then their 12 scale bytes as three arrays of eight dwords, then
     * the quants in chunks of 8 * L bytes, L the lane width (4: X8, 8: X8Q):
     * chunk ch, bytes L r .. L r + L - 1 = row r's qs[L ch ..].  The host's
     * level picks the lane width at load; one layout serves decode and
     * prefill (the kernel is the same for every n). */
    {KS_WEIGHT_Q4_K_X8, KS_DTYPE_Q4_K, sizeof(ks_block_q4_k), 1152, 4,
     {KS_MM_FIELD(offsetof(ks_block_q4_k, d), 0, 2, 1), KS_MM_FIELD(offsetof(ks_block_q4_k, dmin), 16, 2, 1),
      KS_MM_FIELD(offsetof(ks_block_q4_k, scales), 32, 4, 3), KS_MM_FIELD(offsetof(ks_block_q4_k, qs), 128, 4, 32)}},
    {KS_WEIGHT_Q4_K_X8Q, KS_DTYPE_Q4_K, sizeof(ks_block_q4_k), 1152, 4,
     {KS_MM_FIELD(offsetof(ks_block_q4_k, d), 0, 2, 1), KS_MM_FIELD(offsetof(ks_block_q4_k, dmin), 16, 2, 1),
      KS_MM_FIELD(offsetof(ks_block_q4_k, scales), 32, 4, 3), KS_MM_FIELD(offsetof(ks_block_q4_k, qs), 128, 8, 16)}},
    /* Q6_K in eight-row groups with eight-byte lanes (KS_WEIGHT_Q6_K_X8Q,
     * AVX-512 VNNI; matmul_x86_q4k.c has it in full and says why): per
     * super-block 1680 bytes: the eight rows' f16 d, their int8 scales [16][8],
     * ql as 16 chunks of 64 bytes (chunk c, bytes 8r..8r+7 = row r's ql[8c ..]),
     * qh as 8 such chunks. */
    {KS_WEIGHT_Q6_K_X8Q, KS_DTYPE_Q6_K, sizeof(ks_block_q6_k), 1680, 4,
     {KS_MM_FIELD(offsetof(ks_block_q6_k, d), 0, 2, 1), KS_MM_FIELD(offsetof(ks_block_q6_k, scales), 16, 1, 16),
      KS_MM_FIELD(offsetof(ks_block_q6_k, ql), 144, 8, 16), KS_MM_FIELD(offsetof(ks_block_q6_k, qh), 1168, 8, 8)}},
    /* IQ4_XS in eight-row groups with eight-byte lanes (KS_WEIGHT_IQ4_XS_X8Q,
     * AVX-512 VNNI; matmul_x86_q4k.c): per super-block 1088 bytes: the eight
     * rows' f16 d, u16 scales_h, scales_l as eight dwords, then qs as 16 chunks
     * of 64 bytes (chunk c, bytes 8r..8r+7 = row r's qs[8c ..]). */
    {KS_WEIGHT_IQ4_XS_X8Q, KS_DTYPE_IQ4_XS, sizeof(ks_block_iq4_xs), 1088, 4,
     {KS_MM_FIELD(offsetof(ks_block_iq4_xs, d), 0, 2, 1), KS_MM_FIELD(offsetof(ks_block_iq4_xs, scales_h), 16, 2, 1),
      KS_MM_FIELD(offsetof(ks_block_iq4_xs, scales_l), 32, 4, 1),
      KS_MM_FIELD(offsetof(ks_block_iq4_xs, qs), 64, 8, 16)}},
    /* Q5_K in eight-row groups with eight-byte lanes (KS_WEIGHT_Q5_K_X8Q,
     * AVX-512 VNNI; matmul_x86_q4k.c): Q4_K's X8Q super-block (1152 bytes: d,
     * dmin, the scale dwords, the qs chunks), then qh as 4 chunks of 64 bytes
     * (chunk c, bytes 8r..8r+7 = row r's qh[8c ..]). */
    {KS_WEIGHT_Q5_K_X8Q, KS_DTYPE_Q5_K, sizeof(ks_block_q5_k), 1408, 5,
     {KS_MM_FIELD(offsetof(ks_block_q5_k, d), 0, 2, 1), KS_MM_FIELD(offsetof(ks_block_q5_k, dmin), 16, 2, 1),
      KS_MM_FIELD(offsetof(ks_block_q5_k, scales), 32, 4, 3), KS_MM_FIELD(offsetof(ks_block_q5_k, qs), 128, 8, 16),
      KS_MM_FIELD(offsetof(ks_block_q5_k, qh), 1152, 8, 4)}},
};
#undef KS_MM_FIELD

const ks_matmul_group_layout *ks_matmul_group_layout_of(ks_weight_layout layout) {
    for (size_t i = 0; i < sizeof ks_mm_group_layouts / sizeof ks_mm_group_layouts[0]; i++)
        if (ks_mm_group_layouts[i].layout == layout) return &ks_mm_group_layouts[i];
    return NULL;
}

/* Field fl of block b of the eight rows (row r's block at rows + r * rb)
 * to or from super-block o: chunk c of row r at o + dst + 8 lane c + lane
 * r.  Walked chunk by chunk, row by row, so the super-block side is one
 * sequential run; W is the lane width as a constant, so that each lane is
 * one move rather than a call to memcpy (a model's worth of lanes at load). */
#define KS_MM_FIELD_LOOP(W, PACK)                                                                    \
    for (int c = 0; c < fl->count; c++)                                                              \
        for (int r = 0; r < 8; r++) {                                                                \
            uint8_t *sb_ = o + fl->dst + 8 * (W) * c + (W) * r;                                      \
            uint8_t *row_ = blk + (size_t)r * rb + fl->src + (W) * c;                                \
            if (PACK) memcpy(sb_, row_, (W));                                                        \
            else memcpy(row_, sb_, (W));                                                             \
        }

/* The pack (pack true: rows to group) or the unpack of nb super-blocks. */
static inline __attribute__((always_inline)) void ks_mm_group_copy(const ks_matmul_group_layout *g, uint8_t *rows, int64_t nb, uint8_t *grp,
                                    bool pack) {
    const size_t rb = (size_t)nb * g->block_bytes;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *o = grp + (size_t)b * g->sbytes, *blk = rows + (size_t)b * g->block_bytes;
        for (int f = 0; f < g->nfields; f++) {
            const ks_matmul_group_field *fl = &g->field[f];
            switch (fl->lane) {
            case 8: KS_MM_FIELD_LOOP(8, pack) break;
            case 4: KS_MM_FIELD_LOOP(4, pack) break;
            case 2: KS_MM_FIELD_LOOP(2, pack) break;
            default: KS_ASSERT(fl->lane == 1); KS_MM_FIELD_LOOP(1, pack) break;
            }
        }
    }
}
#undef KS_MM_FIELD_LOOP

/* The copy with g one row of the table named as such, so that the compiler
 * sees its fields as constants and unrolls each layout's loops as in the
 * hand-written pairs this replaced: the pack at load runs at their speed
 * (one generic loop over the fields was 1.6-2x slower, 4x with a memcpy
 * call per lane), while the layout stays data. */
static void ks_mm_group_copy_layout(const ks_matmul_group_layout *g, uint8_t *rows, int64_t nb, uint8_t *grp,
                                    bool pack) {
#define KS_MM_ROW(i) &ks_mm_group_layouts[i], rows, nb, grp
    switch (g - ks_mm_group_layouts) {
    case 0: pack ? ks_mm_group_copy(KS_MM_ROW(0), true) : ks_mm_group_copy(KS_MM_ROW(0), false); break;
    case 1: pack ? ks_mm_group_copy(KS_MM_ROW(1), true) : ks_mm_group_copy(KS_MM_ROW(1), false); break;
    case 2: pack ? ks_mm_group_copy(KS_MM_ROW(2), true) : ks_mm_group_copy(KS_MM_ROW(2), false); break;
    case 3: pack ? ks_mm_group_copy(KS_MM_ROW(3), true) : ks_mm_group_copy(KS_MM_ROW(3), false); break;
    case 4: pack ? ks_mm_group_copy(KS_MM_ROW(4), true) : ks_mm_group_copy(KS_MM_ROW(4), false); break;
    default: pack ? ks_mm_group_copy(g, rows, nb, grp, true) : ks_mm_group_copy(g, rows, nb, grp, false); break;
    }
#undef KS_MM_ROW
}

void ks_matmul_group_pack(const ks_matmul_group_layout *g, const uint8_t *rows, int64_t nb, uint8_t *grp) {
    ks_mm_group_copy_layout(g, (uint8_t *)(uintptr_t)rows, nb, grp, true); /* rows only read */
}

void ks_matmul_group_unpack(const ks_matmul_group_layout *g, const uint8_t *grp, int64_t nb, uint8_t *rows) {
    ks_mm_group_copy_layout(g, rows, nb, (uint8_t *)(uintptr_t)grp, false); /* grp only read */
}

ks_status ks_matmul_group_pack_weight(ks_weight *w, ks_weight_layout layout) {
    const ks_matmul_group_layout *g = ks_matmul_group_layout_of(layout);
    KS_ASSERT(g && w->type == g->type && w->rows % 8 == 0 && w->cols % KS_QK_K == 0);
    const int64_t nb = w->cols / KS_QK_K;
    const size_t gbytes = 8 * ks_dtype_row_bytes(w->type, w->cols);
    KS_ASSERT(gbytes == (size_t)nb * g->sbytes); /* in place: same size */
    uint8_t *tmp = ks_malloc(gbytes);
    if (!tmp) return KS_FAIL(KS_ERR_NOMEM, "repacking a %lld-column matrix", (long long)w->cols);
    uint8_t *base = (uint8_t *)(uintptr_t)w->data; /* the caller made it writable */
    for (int64_t i = 0; i < w->rows / 8; i++) {
        memcpy(tmp, base + (size_t)i * gbytes, gbytes);
        ks_matmul_group_pack(g, tmp, nb, base + (size_t)i * gbytes);
    }
    ks_free(tmp);
    w->layout = layout;
    return KS_OK;
}
