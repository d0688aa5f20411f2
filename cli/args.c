/* args: strict options and numbers for every subcommand (args.h). */
#include "args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suggest.h"

const char *pw_cli_cmd_name = "";

void pw_cli_usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "pipewright%s%s: ", *pw_cli_cmd_name ? " " : "", pw_cli_cmd_name);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* "--name" of a token "--name=value", or "-c" of a short option. */
static void opt_name(const char *tok, int c, char *buf, size_t cap) {
  if (strncmp(tok, "--", 2) == 0)
    snprintf(buf, cap, "%.*s", (int)strcspn(tok, "="), tok);
  else
    snprintf(buf, cap, "-%c", c);
}

static void unknown(const char *name, const struct option *opts) {
  const char *names[64];
  int n = 0;
  for (; opts[n].name && n < 64; n++) names[n] = opts[n].name;
  char near[160] = "";
  if (strncmp(name, "--", 2) == 0) pw_suggest_text(name + 2, names, n, "--", near, sizeof near);
  pw_cli_usage_error("unknown option '%s'%s", name, near);
}

int pw_getopt(int argc, char **argv, const char *shortopts, const struct option *opts) {
  char so[96];
  snprintf(so, sizeof so, ":%s", shortopts); /* ':' first: a missing value is told apart */
  opterr = 0;
  int idx = -1;
  int c = getopt_long(argc, argv, so, opts, &idx);
  char name[96];
  if (c == ':' || c == '?') {
    /* optopt is 0 for an unknown long option, else the option's val */
    const char *tok = argv[optind - 1];
    int is_long = strncmp(tok, "--", 2) == 0 && (c == ':' || optopt == 0 || strchr(tok, '='));
    opt_name(is_long ? tok : "", optopt, name, sizeof name);
    if (c == ':')
      pw_cli_usage_error("%s needs a value", name);
    else if (optopt)
      pw_cli_usage_error(is_long ? "%s takes no value" : "unknown option '%s'", name);
    else
      unknown(name, opts);
    return '?';
  }
  if (c != -1 && idx >= 0) {
    /* getopt_long took an abbreviation if the token is not the whole name;
     * the token is the one before a separate value */
    const char *tok = optarg && optarg == argv[optind - 1] ? argv[optind - 2] : argv[optind - 1];
    opt_name(tok, c, name, sizeof name);
    if (strcmp(name + 2, opts[idx].name) != 0) {
      unknown(name, opts);
      return '?';
    }
  }
  return c;
}

int pw_args_operands(int argc, char **argv, int lo, int hi, const char *what) {
  int n = argc - optind;
  if (n < lo) pw_cli_usage_error("missing %s", what);
  if (n > hi) pw_cli_usage_error("unexpected argument '%s'", argv[optind + hi]);
  return n < lo || n > hi ? -1 : 0;
}

int pw_args_required(const char *value, const char *what) {
  if (!value) pw_cli_usage_error("missing %s", what);
  return value ? 0 : -1;
}

/* "(want 1 to 500)", "(want 0 or more)"; "(at most N)" for a huge value
 * when the range has no useful top. */
static void range_text(long long lo, long long hi, int too_large, char *buf, size_t cap) {
  if (hi < INT_MAX)
    snprintf(buf, cap, "(want %lld to %lld)", lo, hi);
  else if (too_large)
    snprintf(buf, cap, "(at most %lld)", hi);
  else
    snprintf(buf, cap, "(want %lld or more)", lo);
}

int pw_arg_ll(const char *flag, const char *text, long long lo, long long hi, long long *out) {
  const char *digits = text[0] == '-' ? text + 1 : text;
  if (!*digits || strspn(digits, "0123456789") != strlen(digits)) {
    pw_cli_usage_error("%s: '%s' is not a whole number", flag, text);
    return -1;
  }
  errno = 0;
  long long v = strtoll(text, NULL, 10);
  int neg = text[0] == '-', too_large = !neg && (errno == ERANGE || v > hi);
  if (errno == ERANGE || v < lo || v > hi) {
    char want[64];
    range_text(lo, hi, too_large, want, sizeof want);
    pw_cli_usage_error("%s: '%s' is %s %s", flag, text,
                       neg && lo >= 0 ? "negative" : too_large ? "too large" : "too small", want);
    return -1;
  }
  *out = v;
  return 0;
}

int pw_arg_int(const char *flag, const char *text, int lo, int hi, int *out) {
  long long v;
  if (pw_arg_ll(flag, text, lo, hi, &v)) return -1;
  *out = (int)v;
  return 0;
}

int pw_arg_num(const char *flag, const char *text, double lo, double hi, double *out) {
  /* decimal only: strtod would take "inf", "nan" and hex too */
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  size_t n = strlen(text);
  if (!n || *end || strspn(text, "0123456789.eE+-") != n || strcspn(text, "0123456789") == n) {
    pw_cli_usage_error("%s: '%s' is not a number", flag, text);
    return -1;
  }
  if (errno == ERANGE || !isfinite(v) || !(v > lo) || v > hi) {
    char want[64];
    if (isinf(hi))
      snprintf(want, sizeof want, "(want more than %g)", lo);
    else
      snprintf(want, sizeof want, "(want more than %g, at most %g)", lo, hi);
    pw_cli_usage_error("%s: '%s' is out of range %s", flag, text, want);
    return -1;
  }
  *out = v;
  return 0;
}
