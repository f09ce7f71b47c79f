/* cli.h - pieces of the tapegrad CLI shared between its files. Not installed. */
#ifndef TG_CLI_H
#define TG_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* Exit statuses of every subcommand. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* Parses val as an integer in [lo, hi] for option opt of command cmd;
 * prints the complaint to stderr and returns false when it is not. */
bool cli_parse_int(const char *cmd, const char *opt, const char *val, int64_t lo, int64_t hi,
                   int64_t *out);

/* Prints "tapegrad <cmd>: <what>: <last error message> (<status string>)"
 * to stderr and returns CLI_FAIL. */
int cli_lib_error(const char *cmd, const char *what);

/* `tapegrad demo [--steps N] [--seed S]`; argv[0] is "demo". */
int cli_demo(int argc, char **argv);

/* `tapegrad train digits [options]`; argv[0] is "train". */
int cli_train(int argc, char **argv);

#endif
