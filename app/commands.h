/*
 * commands.h — the kvsieve CLI's subcommands.  Each takes the arguments after
 * its name (argv[0] is the subcommand) and returns the process exit code:
 * 0 success, 1 runtime failure (message on stderr), 2 usage error.
 * Only app/ code exits the process.
 */
#ifndef KS_APP_COMMANDS_H
#define KS_APP_COMMANDS_H

int cmd_run(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_gen_model(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_policies(int argc, char **argv); /* policy_opts.c */

/* Report a failed library call: "kvsieve <cmd>: <what>: <status> (<file:line: msg>)". */
void app_report(const char *cmd, const char *what, int status);

#endif
