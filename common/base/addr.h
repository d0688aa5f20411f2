/* addr: "HOST:PORT" options and addresses, as both daemons take them. */
#ifndef PW_ADDR_H
#define PW_ADDR_H

#include <stddef.h>

#include "errors.h"

/* Splits "host:port" (the last colon; "[v6]:port" keeps its brackets off).
 * Returns 0, or -1 when there is no host, no port, or the port is not
 * 0..65535. */
PW_MUST_CHECK int pw_addr_split(const char *s, char *host, size_t cap, int *port);
/* 127.0.0.0/8, ::1 and "localhost". */
int pw_addr_is_loopback(const char *host);

#endif
