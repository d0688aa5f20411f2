/* suggest: edit distance and the nearest name (suggest.h). */
#include "suggest.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define MAX_WORD 100

static int low(char c) { return tolower((unsigned char)c); }

int pw_edit_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n > MAX_WORD || m > MAX_WORD) return MAX_WORD;
  /* the optimal-string-alignment table, three rows kept: row i is i % 3 */
  int rows[3][MAX_WORD + 1];
  for (size_t j = 0; j <= m; j++) rows[0][j] = (int)j;
  for (size_t i = 1; i <= n; i++) {
    int *c = rows[i % 3], *p = rows[(i + 2) % 3], *pp = rows[(i + 1) % 3];
    c[0] = (int)i;
    for (size_t j = 1; j <= m; j++) {
      int d = p[j - 1] + (low(a[i - 1]) != low(b[j - 1]));
      if (p[j] + 1 < d) d = p[j] + 1;
      if (c[j - 1] + 1 < d) d = c[j - 1] + 1;
      if (i > 1 && j > 1 && low(a[i - 1]) == low(b[j - 2]) && low(a[i - 2]) == low(b[j - 1]) && pp[j - 2] + 1 < d)
        d = pp[j - 2] + 1;
      c[j] = d;
    }
  }
  return rows[n % 3][m];
}

/* How many edits still count as a slip of the fingers for a name this long. */
static int slack(size_t len) { return len <= 4 ? 1 : len <= 8 ? 2 : 3; }

const char *pw_suggest(const char *word, const char *const *names, int n) {
  const char *best = NULL, *prefix_of = NULL;
  int best_d = MAX_WORD, n_prefix = 0;
  size_t wl = strlen(word);
  for (int i = 0; i < n; i++) {
    int d = pw_edit_distance(word, names[i]);
    if (d <= slack(strlen(names[i])) && d < best_d) best = names[i], best_d = d;
    if (wl >= 3 && wl < strlen(names[i]) && strncasecmp(word, names[i], wl) == 0) prefix_of = names[i], n_prefix++;
  }
  if (best) return best;
  return n_prefix == 1 ? prefix_of : NULL;
}

const char *pw_suggest_text(const char *word, const char *const *names, int n, const char *prefix, char *buf,
                            int cap) {
  const char *near = pw_suggest(word, names, n);
  if (cap > 0) buf[0] = 0;
  if (near) snprintf(buf, (size_t)cap, "; did you mean %s%s?", prefix, near);
  return buf;
}
