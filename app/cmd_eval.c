/*
 * cmd_eval.c — `kvsieve eval` (placeholder until the eval harness lands).
 */
#include "commands.h"

#include <stdio.h>

int cmd_eval(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvsieve eval: not implemented yet\n");
    return 1;
}
