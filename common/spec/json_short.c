/* json_short: shortest round-trip reals in JSON text (json_short.h). */
#include "json_short.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shortest %g form of d that strtod reads back as d, kept a real. */
static int shortest(double d, char *out, size_t cap) {
  for (int p = 1; p <= 17; p++) {
    snprintf(out, cap, "%.*g", p, d);
    if (strtod(out, NULL) == d) break;
  }
  char *e = strchr(out, 'e');
  if (e) { /* jansson's exponent style: 1e-8, 1e22 (no '+', no leading zeros) */
    char *digits = e + 1 + (e[1] == '+' || e[1] == '-'), *w = e[1] == '-' ? e + 2 : e + 1;
    while (*digits == '0' && digits[1]) digits++;
    memmove(w, digits, strlen(digits) + 1);
  }
  if (!strpbrk(out, ".eE")) strncat(out, ".0", cap - strlen(out) - 1);
  return (int)strlen(out);
}

static int num_char(char c) { return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'; }

void pw_json_shorten(char *t) {
  char *w = t; /* write position: the text only shrinks */
  for (const char *r = t; *r;) {
    if (*r == '"') { /* a string (or key): copied as is, escapes included */
      *w++ = *r++;
      while (*r && *r != '"') {
        if (*r == '\\' && r[1]) *w++ = *r++;
        *w++ = *r++;
      }
      if (*r) *w++ = *r++;
      continue;
    }
    if (*r == '-' || (*r >= '0' && *r <= '9')) {
      const char *end = r;
      while (num_char(*end)) end++;
      size_t len = (size_t)(end - r);
      char tok[64], best[40];
      int real = memchr(r, '.', len) || memchr(r, 'e', len) || memchr(r, 'E', len);
      if (real && len < sizeof tok) {
        memcpy(tok, r, len);
        tok[len] = 0;
        int n = shortest(strtod(tok, NULL), best, sizeof best);
        if ((size_t)n <= len) { /* never longer than what it replaces */
          memcpy(w, best, (size_t)n);
          w += n;
          r = end;
          continue;
        }
      }
      memmove(w, r, len);
      w += len;
      r = end;
      continue;
    }
    *w++ = *r++;
  }
  *w = 0;
}

char *pw_json_dumps(const json_t *j, size_t flags) {
  char *s = json_dumps(j, flags);
  if (s) pw_json_shorten(s);
  return s;
}
