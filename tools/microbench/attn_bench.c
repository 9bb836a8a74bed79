/*
 * attn_bench.c — the decode attention kernel alone, in the engine's KV
 * layout, against a plain read of the same bytes (diagnostics, not a test).
 *
 * Why it exists: `kvsieve bench` times whole decode steps, where the
 * attention kernel shares each step with the weight matvec and the host's
 * noise.  To tell compute from memory one needs the kernel alone, hot (rows
 * reused from L2, so only its instructions count) and cold (every row from
 * DRAM), next to a plain read loop of the same bytes, on the same threads,
 * alternated in one run.
 *
 * Layout, as the KV store lays out a dense f16 head (2 MiB pages,
 * MADV_HUGEPAGE): "split" (default), the fast tier's and the slots': all K
 * halves of a layer in one region and all V halves in another, a head's
 * pages back to back in each (one K stream and one V stream per head);
 * "paged", the slow tier's and the gather buffer's: pages of P K rows then
 * P V rows, a head's pages back to back.
 * Shape: L layers x H KV heads x N rows, head_dim 64, GQA group 4 (7th argument: Qwen3 has 2): the
 * Llama-3.2-1B shape at 32K, 1.07 GB of K and V (hd 128: 8 layers, the same
 * bytes; cycles are per row either way).  Thread i takes heads
 * i, i + T, ... of every layer with a barrier per layer, as the engine's
 * pool does.
 *
 * Usage: attn_bench [threads=2] [rounds=3] [hot_rows=1024] [split|paged] [f16|q8] [hd=64|128] [group=4]
 *                   [page_stride=1]  (from DRAM: every S-th page only, a page selector's reads;
 *                   tS: one token in every S rows instead, a token selector's scattered reads,
 *                   also with the rows copied into a contiguous staging area first) [rows=32768]
 * (q8: the 8-bit KV cache's Q8_0 rows, 68 bytes at hd 64, on integer units:
 * run f16 and q8 back to back to compare them within one run)
 * Prints, per round, the best of 5 repetitions of: plain read, kernel hot,
 * kernel from DRAM (ms for the whole L x H x N), and cycles per row hot at
 * the clock given by KS_GHZ (default 3.0; the host has no PMU to read).
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "infer/infer.h"

enum { H = 8, P = 32, REPS = 5 };
static int N = 32768; /* rows per head (9th argument: 131072 for the 128K context) */
static int G = 4;           /* query heads per KV head (7th argument) */
static int PAGE_STRIDE = 1; /* from DRAM: every S-th page, as a page selector reads (8th argument) */
static int TOKEN_STRIDE = 0; /* from DRAM: one token in every S rows at a hashed offset, as a token selector reads (8th argument tS) */
static int L = 16, HD = 64; /* hd 128: 8 layers, the same bytes */
static ks_kv_type KVT = KS_KV_F16;
static size_t ROW_BYTES; /* ks_kv_row_bytes(KVT, HD), set in main */
#define HEAD_BYTES ((size_t)N * ROW_BYTES * 2) /* K and V */
#define LAYER_BYTES (HEAD_BYTES * H)

typedef enum { MODE_READ, MODE_HOT, MODE_COLD } bench_mode;

typedef struct {
    int id, nthr, hot_rows, paged;
    bench_mode mode;
    uint8_t *const *layers; /* borrowed: [L] LAYER_BYTES each */
    pthread_barrier_t *bar; /* borrowed */
    float *q;               /* [G][HD] */
    float *scores;          /* [N][4] */
    float *out;             /* [G][HD] */
    float *tmp;             /* portable-path scratch */
    ks_kv_seg *segs;        /* [N] */
    uint8_t *stage;         /* [2][N][row]: tS's rows copied first (compact_segs) */
    int compact;            /* tS from DRAM: copy the rows into stage before the kernel */
    float sink;             /* keeps the read loop's sum alive */
} bench_thread;

static double now_sec(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A plain AVX2 read of [p, p + n): the rate the kernel's bytes could come at. */
__attribute__((target("avx2"))) static float read_bytes(const uint8_t *p, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps((const float *)(p + i)));
        s1 = _mm256_add_ps(s1, _mm256_load_ps((const float *)(p + i + 32)));
        s2 = _mm256_add_ps(s2, _mm256_load_ps((const float *)(p + i + 64)));
        s3 = _mm256_add_ps(s3, _mm256_load_ps((const float *)(p + i + 96)));
    }
    float v[8];
    _mm256_storeu_ps(v, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return v[0] + v[7];
}

/* tS, rows copied first: each run's K and V rows copied into a contiguous
 * staging area (K [cap][row], then V) in run order, the runs pointed there
 * with their lengths unchanged (so the kernel's blocks and bits are too),
 * prefetching the rows of the run AHEAD runs on.  The idea tested: a bare
 * copy loop keeps more of a token selection's scattered misses in flight
 * than the kernel, which computes between its prefetches.  Measured not to
 * pay (docs/history/benchmarks-notebook.md, "Token selections copied
 * first"), so the engine reads the rows in place. */
static inline void copy_rows(uint8_t *dst, const uint8_t *src, size_t bytes) { /* 64 bytes at a time: no call per row */
    size_t o = 0;
    for (; o + 64 <= bytes; o += 64) memcpy(dst + o, src + o, 64);
    if (o < bytes) memcpy(dst + o, src + o, bytes - o);
}

static int compact_segs(ks_kv_seg *segs, int nseg, size_t row_bytes, uint8_t *staging, size_t cap) {
    enum { AHEAD = 8 };
    uint8_t *Kd = staging, *Vd = staging + cap * row_bytes;
    size_t t = 0;
    for (int i = 0; i < nseg; i++) {
        if (i + AHEAD < nseg)
            for (size_t o = 0; o < row_bytes; o += 64) {
                __builtin_prefetch((const uint8_t *)segs[i + AHEAD].K + o);
                __builtin_prefetch((const uint8_t *)segs[i + AHEAD].V + o);
            }
        size_t bytes = (size_t)segs[i].len * row_bytes;
        if (t + (size_t)segs[i].len > cap) return -1;
        copy_rows(Kd + t * row_bytes, segs[i].K, bytes);
        copy_rows(Vd + t * row_bytes, segs[i].V, bytes);
        segs[i].K = Kd + t * row_bytes;
        segs[i].V = Vd + t * row_bytes;
        t += (size_t)segs[i].len;
    }
    return (int)t;
}

/* Head h of a layer: its K rows start at *K, its V rows at *V; in the
 * paged layout K and V alternate page by page from the head's start. */
static void head_rows(const bench_thread *t, const uint8_t *layer, int h, const uint8_t **K, const uint8_t **V) {
    if (t->paged) {
        *K = layer + (size_t)h * HEAD_BYTES;
        *V = *K + (size_t)P * ROW_BYTES;
    } else {
        *K = layer + (size_t)h * N * ROW_BYTES;
        *V = layer + (size_t)(H + h) * N * ROW_BYTES;
    }
}

static void attend_head(bench_thread *t, const uint8_t *layer, int h, int rows) {
    const uint8_t *K, *V;
    head_rows(t, layer, h, &K, &V);
    size_t stride = t->paged ? (size_t)P * ROW_BYTES * 2 : (size_t)P * ROW_BYTES; /* page to page */
    if (rows == N && TOKEN_STRIDE > 0) { /* scattered single tokens: segments of one row */
        int nt = 0;
        for (int w = 0; w < N / TOKEN_STRIDE; w++) {
            int r = w * TOKEN_STRIDE + (int)(((unsigned)w * 2654435761u) >> 16) % TOKEN_STRIDE;
            size_t off = (size_t)(r / P) * stride + (size_t)(r % P) * ROW_BYTES;
            t->segs[nt++] = (ks_kv_seg){K + off, V + off, 1};
        }
        if (t->compact && compact_segs(t->segs, nt, ROW_BYTES, t->stage, N) < 0) abort();
        ks_attention_segs(KVT, t->segs, nt, nt, HD, G, t->q, t->scores, t->out, t->tmp, NULL, true);
        return;
    }
    int step = rows == N ? PAGE_STRIDE : 1, np = 0;
    for (int p = 0; p < rows / P; p += step) t->segs[np++] = (ks_kv_seg){K + (size_t)p * stride, V + (size_t)p * stride, P};
    ks_attention_segs(KVT, t->segs, np, np * P, HD, G, t->q, t->scores, t->out, t->tmp, NULL, true);
}

static void *bench_worker(void *arg) {
    bench_thread *t = arg;
    for (int l = 0; l < L; l++) {
        for (int h = t->id; h < H; h += t->nthr) {
            if (t->mode == MODE_READ) { /* a head's bytes, wherever the layout puts them */
                const uint8_t *K, *V;
                head_rows(t, t->layers[l], h, &K, &V);
                if (t->paged) t->sink += read_bytes(K, HEAD_BYTES);
                else t->sink += read_bytes(K, HEAD_BYTES / 2) + read_bytes(V, HEAD_BYTES / 2);
            } else if (t->mode == MODE_COLD) {
                attend_head(t, t->layers[l], h, N);
            } else { /* the same hot_rows of a head of this thread's own (layer, head), as many rows in all */
                for (int r = 0; r < N / t->hot_rows; r++) attend_head(t, t->layers[t->id / H], t->id % H, t->hot_rows);
            }
        }
        pthread_barrier_wait(t->bar);
    }
    return NULL;
}

static double run_best(bench_thread *th, int nthr, bench_mode mode) {
    double best = 1e30;
    for (int rep = 0; rep < REPS; rep++) {
        pthread_t pt[64];
        double t0 = now_sec();
        for (int i = 0; i < nthr; i++) {
            th[i].mode = mode;
            if (pthread_create(&pt[i], NULL, bench_worker, &th[i]) != 0) {
                fprintf(stderr, "attn_bench: pthread_create failed\n");
                exit(1);
            }
        }
        for (int i = 0; i < nthr; i++) pthread_join(pt[i], NULL);
        double dt = now_sec() - t0;
        if (dt < best) best = dt;
    }
    return best * 1e3;
}

int main(int argc, char **argv) {
    int nthr = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 3;
    int hot_rows = argc > 3 ? atoi(argv[3]) : 1024;
    int paged = argc > 4 && !strcmp(argv[4], "paged");
    if (argc > 5 && strcmp(argv[5], "f16") && strcmp(argv[5], "q8")) {
        fprintf(stderr, "attn_bench: kv type must be f16 or q8\n");
        return 2;
    }
    if (argc > 5 && !strcmp(argv[5], "q8")) KVT = KS_KV_Q8;
    if (argc > 6) {
        HD = atoi(argv[6]);
        if (HD != 64 && HD != 128) {
            fprintf(stderr, "attn_bench: hd must be 64 or 128\n");
            return 2;
        }
        L = 16 * 64 / HD;
    }
    if (argc > 9) {
        N = atoi(argv[9]);
        if (N < 1024 || N > (1 << 20) || N % 1024) {
            fprintf(stderr, "attn_bench: rows must be a multiple of 1024 in [1024, 1048576]\n");
            return 2;
        }
    }
    if (argc > 8 && argv[8][0] == 't') TOKEN_STRIDE = atoi(argv[8] + 1) > 0 ? atoi(argv[8] + 1) : 1;
    else if (argc > 8) PAGE_STRIDE = atoi(argv[8]) > 0 ? atoi(argv[8]) : 1;
    if (argc > 7) {
        G = atoi(argv[7]);
        if (G < 1 || G > 16) {
            fprintf(stderr, "attn_bench: group must be 1..16\n");
            return 2;
        }
    }
    ROW_BYTES = ks_kv_row_bytes(KVT, HD);
    if (argc > 4 && !paged && strcmp(argv[4], "split")) {
        fprintf(stderr, "attn_bench: layout must be split or paged\n");
        return 2;
    }
    const char *ghz_env = getenv("KS_GHZ");
    double ghz = ghz_env ? atof(ghz_env) : 3.0;
    if (nthr < 1 || nthr > 64 || rounds < 1 || hot_rows < P || hot_rows % P || N % hot_rows) {
        fprintf(stderr, "usage: attn_bench [threads 1-64] [rounds] [hot_rows: a multiple of %d dividing %d]\n", P, N);
        return 2;
    }
    if (!__builtin_cpu_supports("avx2")) { /* the read loop is AVX2 */
        fprintf(stderr, "attn_bench: needs an AVX2 CPU\n");
        return 1;
    }
    uint8_t *layers[16];
    for (int l = 0; l < L; l++) {
        if (posix_memalign((void **)&layers[l], (size_t)1 << 21, LAYER_BYTES) != 0) {
            fprintf(stderr, "attn_bench: out of memory (%zu bytes per layer)\n", LAYER_BYTES);
            return 1;
        }
        (void)madvise(layers[l], LAYER_BYTES, MADV_HUGEPAGE); /* advice only */
        uint16_t *h = (uint16_t *)layers[l];
        for (size_t i = 0; i < LAYER_BYTES / 2; i++) /* f16 values in [0.125, 0.25): no denormals, no overflow */
            h[i] = (uint16_t)(0x3000 + ((i * 2654435761u) >> 22));
        if (KVT == KS_KV_Q8) /* Q8_0 blocks (34 bytes): scale 2^-9, the hashed bytes as int8 */
            for (size_t b = 0; b + 34 <= LAYER_BYTES; b += 34) memcpy(layers[l] + b, &(uint16_t){0x1800}, 2);
    }
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nthr);
    bench_thread *th = calloc((size_t)nthr, sizeof *th);
    if (!th) return 1;
    for (int i = 0; i < nthr; i++) {
        th[i] = (bench_thread){.id = i, .nthr = nthr, .hot_rows = hot_rows, .paged = paged, .layers = layers, .bar = &bar};
        th[i].q = malloc(sizeof(float) * G * HD);
        th[i].scores = malloc(sizeof(float) * (size_t)N * 4);
        th[i].out = malloc(sizeof(float) * G * HD);
        th[i].tmp = malloc(sizeof(float) * (size_t)N * 4 + 65536);
        th[i].segs = malloc(sizeof(ks_kv_seg) * N);
        th[i].stage = malloc(2 * (size_t)N * ROW_BYTES);
        if (!th[i].q || !th[i].scores || !th[i].out || !th[i].tmp || !th[i].segs || !th[i].stage) return 1;
        for (int j = 0; j < G * HD; j++) th[i].q[j] = (float)(j % 7) * 0.1f;
    }
    double gb = (double)LAYER_BYTES * L / 1e9, rows = (double)L * H * N;
    printf("attn_bench: %d x %d heads x %d rows, hd %d, GQA %d, %.2f GB of %s K+V, %d thread(s), hot set %d rows, %s layout\n",
           L, H, N, HD, G, gb, KVT == KS_KV_Q8 ? "q8" : "f16", nthr, hot_rows, paged ? "paged" : "split");
    for (int r = 1; r <= rounds; r++) {
        double rd = run_best(th, nthr, MODE_READ), hot = run_best(th, nthr, MODE_HOT);
        double cold = run_best(th, nthr, MODE_COLD);
        printf("round %d: read %.1f ms (%.1f GB/s) | kernel hot %.1f ms (%.1f cycles/row/thread at %.2f GHz) | kernel "
               "from DRAM %.1f ms (%.1f GB/s of the pages read)\n",
               r, rd, gb / rd * 1e3, hot, hot * 1e-3 * ghz * 1e9 * nthr / rows, ghz, cold, gb / PAGE_STRIDE / cold * 1e3);
        if (TOKEN_STRIDE > 0) { /* the same rows copied into a contiguous staging area first, alternated */
            for (int i = 0; i < nthr; i++) th[i].compact = 1;
            double gat = run_best(th, nthr, MODE_COLD);
            for (int i = 0; i < nthr; i++) th[i].compact = 0;
            double cold2 = run_best(th, nthr, MODE_COLD);
            printf("round %d: tokens from DRAM, rows copied first %.1f ms, in place again %.1f ms\n", r, gat, cold2);
        }
    }
    for (int i = 0; i < nthr; i++) {
        free(th[i].q), free(th[i].scores), free(th[i].out), free(th[i].tmp), free(th[i].segs), free(th[i].stage);
    }
    free(th);
    pthread_barrier_destroy(&bar);
    for (int l = 0; l < L; l++) free(layers[l]);
    return 0;
}
