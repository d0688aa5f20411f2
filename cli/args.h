/* args: how every subcommand reads its command line. getopt_long, but
 * long options only by their whole names (an abbreviation that works
 * today would change meaning when an option is added), an unknown option
 * answered with the nearest known one, and strict numbers: the whole
 * value, base 10, in range, or an error naming the flag and the value.
 * Every message starts "pipewright <command>: "; the caller then prints
 * its usage and exits 2. */
#ifndef PW_CLI_ARGS_H
#define PW_CLI_ARGS_H

#include <getopt.h>

/* The subcommand being run ("train", "dataset upload"), set by the
 * dispatcher: the parsers below it name it without being told. */
extern const char *pw_cli_cmd_name;

/* "pipewright <command>: <message>\n" on stderr. */
void pw_cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* getopt_long over argv (set optind = 1 before the first call): the
 * option's val, -1 after the last, or '?' after printing what was wrong
 * ("unknown option '--step'; did you mean --steps?", "--job needs a
 * value"). */
int pw_getopt(int argc, char **argv, const char *shortopts, const struct option *opts);

/* The operands argv[optind..argc): lo..hi of them, else prints "missing
 * <what>" or "unexpected argument 'X'" and returns -1. */
int pw_args_operands(int argc, char **argv, int lo, int hi, const char *what);
/* A required option's value: NULL prints "missing <what>" ("--job FILE")
 * and returns -1. */
int pw_args_required(const char *value, const char *what);

/* text as a whole number in lo..hi into *out; else prints
 * "--steps: 'abc' is not a whole number" (or why it is out of range) and
 * returns -1. */
int pw_arg_ll(const char *flag, const char *text, long long lo, long long hi, long long *out);
int pw_arg_int(const char *flag, const char *text, int lo, int hi, int *out);
/* text as a finite decimal number above lo and at most hi. */
int pw_arg_num(const char *flag, const char *text, double lo, double hi, double *out);

#endif
