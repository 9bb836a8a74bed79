/*
 * cmd_info.c — `kvsieve info`: a GGUF file's architecture, shapes, types and
 * memory needs (with --kv its metadata keys, with --tensors its tensors), or
 * the same of an EAGLE-3 checkpoint directory.  The listing is the library's
 * (ks_file_info, kvsieve_tools.h): the file formats stay behind the API.
 */
#include "commands.h"
#include "kvsieve_tools.h"
#include "opts.h"

#include <stdio.h>

int cmd_info(int argc, char **argv) {
    app_options o;
    int rc = app_parse("info", argc, argv, &o);
    if (rc >= 0) return rc;
    if (!o.model_path) {
        fprintf(stderr, "usage: kvsieve info FILE.gguf [--kv] [--tensors]\n");
        return 2;
    }
    const char *what = "reading the file";
    ks_status st = ks_file_info(o.model_path, o.show_kv, o.show_tensors, stdout, &what);
    if (st != KS_OK) {
        fflush(stdout);
        app_report("info", what, st);
        return 1;
    }
    return 0;
}
