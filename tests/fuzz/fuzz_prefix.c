/*
 * fuzz_prefix.c — libFuzzer entry point for the prefix cache's block reader
 * (src/prefix/prefix_record.c, ks_pc_record_parse).
 *
 * Why: block files live in a directory that other processes and replicas
 * write (--cache-dir) and `kvsieve run --prompt-cache` reads a file the user
 * names, so the reader must survive any byte string and accept nothing it
 * cannot use.  The input is a mode byte and then a file of records, parsed
 * one after another as ks_prefix_cache_load_file does; every token and
 * payload byte of an accepted record is touched (ASan reports a stray read).
 * With the mode's bit 2 the input is a policy-state file instead
 * (ks_pc_state_parse).  A key and a checksum stop blind mutation at the first check, so with the
 * mode's low bit set the target first repairs them (the header's layout
 * decides the sizes) and the mutations reach the checks behind them.  Built
 * only with clang and -DKVSIEVE_FUZZ=ON; seeds in tests/fuzz/corpus_prefix/.
 */
#include "prefix/prefix.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t g_sink;

static uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Rewrite the first record's key and checksum so that they match. */
static void repair(uint8_t *buf, size_t size) {
    if (size < KS_PC_HEADER_BYTES) return;
    ks_pc_format f = ks_pc_header_format(buf);
    size_t pb = ks_pc_payload_bytes(&f), tb = sizeof(int32_t) * (size_t)f.page;
    if (!pb || size - KS_PC_HEADER_BYTES < tb || size - KS_PC_HEADER_BYTES - tb < pb) return;
    ks_pc_key model = {get64(buf + 32), get64(buf + 40)}, parent = {get64(buf + 64), get64(buf + 72)};
    int32_t *tok = malloc(tb);
    memcpy(tok, buf + KS_PC_HEADER_BYTES, tb);
    ks_pc_key key = ks_pc_chain(&parent, tok, (int32_t)f.page);
    ks_pc_record_header(buf, &f, &model, &key, &parent, tok, buf + KS_PC_HEADER_BYTES + tb);
    free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    uint8_t *buf = malloc(size ? size : 1);
    if (size) memcpy(buf, data, size);
    if (mode & 1) repair(buf, size);
    ks_pc_key model = {get64((const uint8_t *)"kvsieve-"), 0};
    uint64_t h = 0;
    if (mode & 4) { /* a policy-state file instead */
        ks_pc_state_record s;
        if (ks_pc_state_parse(buf, size, (mode & 2) ? &model : NULL, &s) == KS_OK) {
            for (size_t i = 0; i < s.data_bytes; i += 5) h += s.data[i];
            if (s.bytes > size) abort();
        }
        g_sink += h;
        free(buf);
        return 0;
    }
    for (size_t off = 0; off < size;) {
        ks_pc_record r;
        if (ks_pc_record_parse(buf + off, size - off, (mode & 2) ? &model : NULL, &r) != KS_OK) break;
        for (size_t i = 0; i < sizeof(int32_t) * r.fmt.page; i++) h += ((const uint8_t *)r.tokens)[i];
        for (size_t i = 0; i < r.payload_bytes; i += 7) h += r.payload[i];
        h += r.payload[r.payload_bytes - 1];
        if (r.bytes == 0 || r.bytes > size - off) abort(); /* the parser's own promise */
        off += r.bytes;
    }
    g_sink += h;
    free(buf);
    return 0;
}
