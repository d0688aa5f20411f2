/* json_short: JSON text whose reals read as they were written.
 *
 * jansson writes a real with 17 significant digits, so a spec's 3e-3
 * comes back as 0.0030000000000000001. pw_json_dumps is json_dumps (same
 * flags) with every real rewritten as the shortest decimal that parses
 * back to the same double (0.003, 0.1, 2.382, 1e-08), still a real (1.0,
 * never 1). Strings, keys and integers are left as they are. */
#ifndef PW_JSON_SHORT_H
#define PW_JSON_SHORT_H

#include <jansson.h>

/* A malloc'd text, or NULL (out of memory, or json_dumps refused j). */
char *pw_json_dumps(const json_t *j, size_t flags);
/* The same rewrite on a JSON text in place (it only shrinks). */
void pw_json_shorten(char *text);

#endif
