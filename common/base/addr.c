/* addr: the parsing of addr.h. */
#include "addr.h"

#include <stdlib.h>
#include <string.h>

int pw_addr_split(const char *s, char *host, size_t cap, int *port) {
  const char *c = strrchr(s, ':');
  if (!c || c == s) return -1;
  const char *h = s, *he = c;
  if (*h == '[' && he[-1] == ']') h++, he--;
  if (he <= h || (size_t)(he - h) >= cap) return -1;
  char *end;
  long p = strtol(c + 1, &end, 10);
  if (c[1] == 0 || *end || p < 0 || p > 65535) return -1;
  memcpy(host, h, (size_t)(he - h));
  host[he - h] = 0;
  *port = (int)p;
  return 0;
}

int pw_addr_is_loopback(const char *host) {
  return !strncmp(host, "127.", 4) || !strcmp(host, "::1") || !strcmp(host, "localhost");
}
