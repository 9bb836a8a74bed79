/*
 * web.h — the chat page's files, built into the binary.
 *
 * cmake/embed_web.cmake turns src/server/web/ (index.html, chat.js,
 * chat.css) into byte arrays at build time, so `kvsieve serve` answers
 * GET / with no files beside it and no path from a URL ever reaches the
 * filesystem: a request names one of these entries or gets 404.
 */
#ifndef KS_SERVER_WEB_H
#define KS_SERVER_WEB_H

#include <stddef.h>

typedef struct ks_web_asset {
    const char *path;            /* "/index.html", "/chat.js", ... */
    const char *content_type;
    const unsigned char *data;   /* [size], NUL after the end */
    size_t size;
} ks_web_asset;

extern const ks_web_asset ks_web_assets[];
extern const int ks_web_n_assets;

/* The entry for a URL path ("/" is "/index.html"); NULL if none. */
const ks_web_asset *ks_web_find(const char *path);

#endif
