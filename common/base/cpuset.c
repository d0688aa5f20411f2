/* cpuset: see cpuset.h. */
#include "cpuset.h"

#include <stdio.h>
#include <string.h>

int pw_cpuset_count(const pw_cpuset *s) {
  int n = 0;
  for (int i = 0; i < PW_CPUSET_WORDS; i++) n += __builtin_popcountll(s->w[i]);
  return n;
}

void pw_cpuset_or(pw_cpuset *a, const pw_cpuset *b) {
  for (int i = 0; i < PW_CPUSET_WORDS; i++) a->w[i] |= b->w[i];
}

void pw_cpuset_minus(pw_cpuset *a, const pw_cpuset *b) {
  for (int i = 0; i < PW_CPUSET_WORDS; i++) a->w[i] &= ~b->w[i];
}

void pw_cpuset_and(pw_cpuset *a, const pw_cpuset *b) {
  for (int i = 0; i < PW_CPUSET_WORDS; i++) a->w[i] &= b->w[i];
}

/* A decimal CPU number at *p (advanced past it); -1 when there is none or
 * it is too large. */
static int number(const char **p) {
  const char *s = *p;
  long v = 0;
  if (*s < '0' || *s > '9') return -1;
  while (*s >= '0' && *s <= '9') {
    v = v * 10 + (*s++ - '0');
    if (v >= PW_CPUSET_MAX) return -1;
  }
  *p = s;
  return (int)v;
}

int pw_cpuset_parse(const char *text, pw_cpuset *s, pw_err *err) {
  pw_cpuset_zero(s);
  const char *p = text;
  if (!p) return pw_err_set(err, PW_EFORMAT, "cpus", "no cpulist");
  if (!*p || !strcmp(p, "\n")) return 0;
  for (;;) {
    const char *at = p;
    int a = number(&p), b = a;
    if (a >= 0 && *p == '-') {
      p++;
      b = number(&p);
    }
    if (a < 0 || b < 0)
      return pw_err_set(err, PW_EFORMAT, "cpus", "'%.40s': expected CPU numbers below %d at '%.10s'", text,
                        PW_CPUSET_MAX, at);
    if (b < a) return pw_err_set(err, PW_EFORMAT, "cpus", "'%.40s': the range %d-%d runs backwards", text, a, b);
    for (int c = a; c <= b; c++) pw_cpuset_add(s, c);
    if (*p == ',') {
      p++;
      continue;
    }
    if (*p == 0 || (*p == '\n' && p[1] == 0)) return 0;
    return pw_err_set(err, PW_EFORMAT, "cpus", "'%.40s': unexpected '%c'", text, *p);
  }
}

int pw_cpuset_format(const pw_cpuset *s, char *buf, size_t cap) {
  size_t l = 0;
  if (!cap) return PW_ETOOBIG;
  buf[0] = 0;
  for (int c = 0; c < PW_CPUSET_MAX; c++) {
    if (!pw_cpuset_has(s, c)) continue;
    int e = c;
    while (e + 1 < PW_CPUSET_MAX && pw_cpuset_has(s, e + 1)) e++;
    int n = e == c ? snprintf(buf + l, cap - l, "%s%d", l ? "," : "", c)
                   : snprintf(buf + l, cap - l, "%s%d-%d", l ? "," : "", c, e);
    if (n < 0 || (size_t)n >= cap - l) {
      buf[0] = 0;
      return PW_ETOOBIG;
    }
    l += (size_t)n;
    c = e;
  }
  return 0;
}

/* The lowest `want` CPUs of free into out (free has at least that many). */
static void lowest(const pw_cpuset *free, int want, pw_cpuset *out) {
  pw_cpuset_zero(out);
  for (int c = 0; c < PW_CPUSET_MAX && want > 0; c++)
    if (pw_cpuset_has(free, c)) pw_cpuset_add(out, c), want--;
}

int pw_cpuset_pick(const pw_cpuset *allowed, const pw_cpuset *used, const pw_cpuset *nodes, int n_nodes, int want,
                   pw_cpuset *out) {
  pw_cpuset free = *allowed;
  pw_cpuset_minus(&free, used);
  pw_cpuset_zero(out);
  if (want < 1 || pw_cpuset_count(&free) < want) return PW_EBUDGET;
  /* one node if one can hold the rank: the tightest fit */
  int best = -1, best_free = 0;
  for (int k = 0; k < n_nodes && k < PW_CPUSET_NODES; k++) {
    pw_cpuset f = free;
    pw_cpuset_and(&f, &nodes[k]);
    int n = pw_cpuset_count(&f);
    if (n >= want && (best < 0 || n < best_free)) best = k, best_free = n;
  }
  if (best >= 0) {
    pw_cpuset f = free;
    pw_cpuset_and(&f, &nodes[best]);
    lowest(&f, want, out);
    return 0;
  }
  /* across nodes (or no nodes known): node by node, lowest first, which is
   * the lowest free CPUs when nodes are numbered in order */
  lowest(&free, want, out);
  return 0;
}
