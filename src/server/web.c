/*
 * web.c — looks up the chat page's built-in files (web.h).  The table is
 * generated (build/web_assets.c); a URL only ever selects an entry of it by
 * exact name, so no request path reaches the filesystem.
 */
#include "server/web.h"

#include <string.h>

const ks_web_asset *ks_web_find(const char *path) {
    if (!path) return NULL;
    if (!strcmp(path, "/")) path = "/index.html";
    for (int i = 0; i < ks_web_n_assets; i++)
        if (!strcmp(ks_web_assets[i].path, path)) return &ks_web_assets[i];
    return NULL;
}
