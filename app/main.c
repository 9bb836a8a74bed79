/*
 * main.c — kvsieve command-line entry: dispatches to a subcommand.
 */
#include "commands.h"
#include "kvsieve.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} subcommand;

static const subcommand g_commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"info", cmd_info, "print a GGUF model's architecture, shapes, types and memory needs (or an EAGLE-3 checkpoint dir)"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"perplexity", cmd_perplexity, "perplexity of a text file"},
    {"gen-model", cmd_gen_model, "write a GGUF with random weights of a real model shape"},
    {"bench", cmd_bench, "prefill/decode throughput and achieved memory bandwidth"},
    {"eval", cmd_eval, "long-context task accuracy and agreement with dense attention"},
    {"plan", cmd_plan, "adaptive memory plan: sequence-length thresholds and the fast/slow layer split"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with continuous batching (docs/SERVER.md)"},
    {"policies", cmd_policies, "list the selection policies (--policy), their arguments and needs"},
};

void app_report(const char *cmd, const char *what, int status) {
    fprintf(stderr, "kvsieve %s: %s: %s (%s)\n", cmd, what, ks_status_str((ks_status)status),
            ks_last_error());
}

static void usage(FILE *f) {
    fprintf(f, "kvsieve %s — long-context inference with context sparsity\n\n", KVSIEVE_VERSION);
    fprintf(f, "usage: kvsieve <command> [options]   (kvsieve <command> --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        fprintf(f, "  %-12s %s\n", g_commands[i].name, g_commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kvsieve %s\n", KVSIEVE_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        if (!strcmp(argv[1], g_commands[i].name)) return g_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvsieve: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
