/*
 * matmul_packed_x8q.h — the K-quants' eight-row group layouts as data
 * (matmul_packed_x8q.c): Q4_K X8 and X8Q, Q6_K, IQ4_XS and Q5_K X8Q.
 *
 * A group is eight rows of the file, repacked in place per super-block so
 * that the group kernels (matmul_x86_q4k.c) load one field of all eight
 * rows at once.  Every such layout is the same kind of byte shuffle: each
 * field of a row's block is cut into chunks of a lane width, and chunk c of
 * the eight rows is stored side by side (row r at lane r).  So a layout is
 * its list of fields, and one pack and one unpack serve them all.  The
 * matmul module's own header for its packed drivers (matmul_packed.c) and
 * for tests/test_matmul.c, which checks that unpack undoes pack.
 */
#ifndef KS_MATMUL_PACKED_X8Q_H
#define KS_MATMUL_PACKED_X8Q_H

#include "core/core.h"
#include "tensor/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One field of a block: `count` chunks of `lane` bytes, chunk c being bytes
 * src + lane * c .. + lane - 1 of a row's block in the file; in the
 * super-block, chunk c of row r sits at dst + 8 * lane * c + lane * r. */
typedef struct {
    uint16_t src;  /* offset of the field in the file's block */
    uint16_t dst;  /* offset of its first chunk in the eight-row super-block */
    uint8_t lane;  /* bytes of one row per chunk: 1, 2, 4 or 8 */
    uint8_t count; /* chunks */
} ks_matmul_group_field;

#define KS_MATMUL_GROUP_FIELDS 5 /* most fields of a layout (Q4_K, Q5_K) */

/* An eight-row group layout: the fields of a block, which together cover
 * the block once and fill the super-block (8 * block_bytes bytes) once. */
typedef struct {
    ks_weight_layout layout;
    ks_dtype type;
    uint16_t block_bytes; /* one row's super-block in the file */
    uint16_t sbytes;      /* the eight rows' super-block in the group: 8 * block_bytes */
    int nfields;
    ks_matmul_group_field field[KS_MATMUL_GROUP_FIELDS];
} ks_matmul_group_layout;

/* The description of an eight-row group layout, NULL for any other. */
const ks_matmul_group_layout *ks_matmul_group_layout_of(ks_weight_layout layout);

/* Eight rows of nb blocks each (row r at rows + r * nb * block_bytes) into
 * one group of nb super-blocks, and back.  Out of place; g as
 * ks_matmul_group_layout_of returned it. */
void ks_matmul_group_pack(const ks_matmul_group_layout *g, const uint8_t *rows, int64_t nb, uint8_t *grp);
void ks_matmul_group_unpack(const ks_matmul_group_layout *g, const uint8_t *grp, int64_t nb, uint8_t *rows);

/* w (rows a multiple of 8, of the layout's type) into eight-row groups, IN
 * PLACE (w->data must be writable), and w->layout set.  KS_ERR_NOMEM (w
 * unchanged) when the one group of working memory is refused. */
ks_status ks_matmul_group_pack_weight(ks_weight *w, ks_weight_layout layout);

#ifdef __cplusplus
}
#endif
#endif
