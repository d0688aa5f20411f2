/* http_conn: the bounds on the API's connections — in total and per
 * client address, taken at accept (refused ones logged on the first and
 * every 100th, counted for /metrics) and given back when a connection
 * closes; the total kept under the process's file limit. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "http_int.h"
#include "log.h"

/* The address bytes of sa (v4 as v4-mapped v6), for the per-address counts. */
static void addr_key(const struct sockaddr *sa, unsigned char key[16]) {
  memset(key, 0, 16);
  if (sa && sa->sa_family == AF_INET) {
    key[10] = key[11] = 0xff;
    memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
  } else if (sa && sa->sa_family == AF_INET6) {
    memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
  }
}

/* The count of key (added when missing and add is set); NULL if none. */
static ip_count *ip_find(http_srv *srv, const unsigned char key[16], int add) {
  for (int i = 0; i < srv->n_ips; i++)
    if (!memcmp(srv->ips[i].addr, key, 16)) return &srv->ips[i];
  if (!add) return NULL;
  ip_count *n = realloc(srv->ips, sizeof *n * (size_t)(srv->n_ips + 1));
  if (!n) return NULL;
  srv->ips = n;
  ip_count *e = &srv->ips[srv->n_ips++];
  memcpy(e->addr, key, 16);
  e->n = 0;
  return e;
}

/* Refusals are logged on the first and then every 100th, so a flood of
 * connections cannot flood the log. */
static void log_refusal(const char *what, uint64_t n, const char *who, int limit) {
  if (n == 1 || n % 100 == 0)
    pw_warn("http: refused a connection from %s: %d open, the %s limit (%llu refused so far)", who, limit, what,
            (unsigned long long)n);
}

enum MHD_Result pw__http_on_accept(void *cls, const struct sockaddr *sa, socklen_t len) {
  http_srv *srv = cls;
  (void)len;
  unsigned char key[16];
  addr_key(sa, key);
  /* The place is taken here, not when the connection starts: accepts run
   * on several threads, and a count taken later would let two through for
   * the last place. libmicrohttpd checks its own (higher) bound before
   * asking us, so a connection admitted here starts (short of running out
   * of memory setting it up) and is given back when it closes
   * (on_connection). */
  pthread_mutex_lock(&srv->c->mu);
  ip_count *e = ip_find(srv, key, 1);
  int over_total = !e || srv->c->http_adm.open >= srv->max_conns;
  int over_ip = !over_total && srv->max_per_ip && e->n >= srv->max_per_ip;
  uint64_t n = over_total ? ++srv->c->http_adm.refused_total : over_ip ? ++srv->c->http_adm.refused_per_ip : 0;
  int limit = over_total ? srv->max_conns : srv->max_per_ip;
  if (!n) {
    srv->c->http_adm.open++;
    e->n++;
  } else if (e && e->n == 0) {
    *e = srv->ips[--srv->n_ips]; /* keep the table to live addresses */
  }
  pthread_mutex_unlock(&srv->c->mu);
  if (!n) return MHD_YES;
  char who[INET6_ADDRSTRLEN] = "?";
  if (sa && sa->sa_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, who, sizeof who);
  if (sa && sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, who, sizeof who);
  log_refusal(over_total ? "total" : "per-address", n, who, limit);
  return MHD_NO;
}

void pw__http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                            enum MHD_ConnectionNotificationCode toe) {
  http_srv *srv = cls;
  (void)socket_context;
  if (toe != MHD_CONNECTION_NOTIFY_CLOSED) return; /* its place was taken at accept */
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  unsigned char key[16];
  addr_key(ci ? ci->client_addr : NULL, key);
  pthread_mutex_lock(&srv->c->mu);
  ip_count *e = ip_find(srv, key, 0);
  srv->c->http_adm.open--;
  if (e && --e->n <= 0) *e = srv->ips[--srv->n_ips]; /* keep the table to live addresses */
  pthread_mutex_unlock(&srv->c->mu);
}

/* The connection bound: the option, else 2048, kept under the process's
 * file limit less room for the store, the worker links and the pool. */
int pw__http_conn_limit(const pw_coord *c) {
  int want = c->http_max_conns > 0 ? c->http_max_conns : 2048;
  struct rlimit rl;
  if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY) {
    long room = (long)rl.rlim_cur - 256;
    if (room < 16) room = 16;
    if (want > room) {
      pw_warn("http: %d connections asked, the file limit (%ld) allows %ld", want, (long)rl.rlim_cur, room);
      want = (int)room;
    }
  }
  return want;
}
