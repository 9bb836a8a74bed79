/*
 * membw.h — a quick memory-bandwidth probe (STREAM-like).
 *
 * Decode is memory-bound: tokens/s is bounded by (bytes streamed per step) /
 * (bandwidth).  To report how close the engine gets to that roof, `kvsieve
 * bench` needs the roof of *this* machine with *this* thread count, measured
 * the same way the engine reads memory (parallel over the same pool).  The
 * read-only reduction is the number to compare weight/KV streaming against;
 * copy and triad are reported for comparison with published STREAM results.
 *
 * Byte accounting follows STREAM: copy counts 2 arrays (1 read + 1 write),
 * triad 3 (2 reads + 1 write), read 1.  Write-allocate traffic (the hidden
 * read of each destination line on caches without streaming stores) is NOT
 * counted, so copy/triad understate the bus traffic by 1/2 and 1/3 and
 * usually come out below the read figure.  GB/s is 1e9 bytes per second.
 */
#ifndef KS_MEMBW_H
#define KS_MEMBW_H

#include "core/core.h"
#include "kvsieve_tools.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ks_membw_result and ks_membw_measure are public (kvsieve_tools.h): `kvsieve bench` reports them. */

/* Default: 3 x 256 MiB = 768 MiB, several times the last-level cache of
 * current CPUs (STREAM asks for 4x), and ~0.5-1.5 s in all on a desktop. */
#define KS_MEMBW_DEFAULT_BYTES ((size_t)256 << 20)
#define KS_MEMBW_DEFAULT_REPS 4

/* Measure with three float32 arrays of bytes_per_array each (0: default),
 * best of reps (<= 0: default).  pool may be NULL (single thread).
 * KS_ERR_INVALID_ARG if the size is below 4 KiB or above 16 GiB. */
ks_status ks_membw_measure(ks_pool *pool, size_t bytes_per_array, int reps, ks_membw_result *out);

#ifdef __cplusplus
}
#endif
#endif
