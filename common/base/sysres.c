/* sysres: the cores and memory this process may use, and its host id
 * (sysres.h). Reads /proc and the cgroup files; never the whole machine's
 * counts alone, never an unbounded line, never the heap. */
#include "sysres.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sha256.h"

/* Appends to o->note ("; " between items): what was ignored and why. */
static void note(pw_sysres *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(pw_sysres *o, const char *fmt, ...) {
  size_t n = strlen(o->note);
  if (n + 3 >= sizeof o->note) return;
  if (n) n += (size_t)snprintf(o->note + n, sizeof o->note - n, "; ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(o->note + n, sizeof o->note - n, fmt, ap);
  va_end(ap);
}

/* ROOT + path into out; -1 when it does not fit. */
static int under(const char *root, const char *path, char *out, size_t cap) {
  int n = snprintf(out, cap, "%s%s", root, path);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* The first line of a small file (at most cap - 1 bytes), its newline cut.
 * 0, or -errno (-ENOENT: absent, which is no limit; -ENODATA: empty). */
static int read_line(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "re");
  if (!f) return -errno;
  errno = 0;
  int rc = fgets(buf, (int)cap, f) ? 0 : ferror(f) && errno ? -errno : -ENODATA; /* a directory: EISDIR */
  fclose(f);
  if (!rc) buf[strcspn(buf, "\r\n")] = '\0';
  return rc;
}

/* A whole line of f into buf; 0 at the end, -1 for a line longer than the
 * buffer (read past and skipped), 1 for a line. */
static int next_line(FILE *f, char *buf, size_t cap) {
  if (!fgets(buf, (int)cap, f)) return 0;
  size_t n = strlen(buf);
  if (n && buf[n - 1] == '\n') {
    buf[n - 1] = '\0';
    return 1;
  }
  if (feof(f)) return 1; /* the last line, without a newline */
  int c;
  while ((c = fgetc(f)) != EOF && c != '\n') {
  }
  return -1;
}

/* mountinfo's octal escapes (\040 space, \011 tab, \012 newline, \134
 * backslash) decoded in place. */
static void unescape(char *s) {
  char *w = s;
  for (char *r = s; *r; r++) {
    if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' && r[3] <= '7') {
      *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
      r += 3;
    } else {
      *w++ = *r;
    }
  }
  *w = '\0';
}

/* 1 when the comma-separated list holds word. */
static int has_word(const char *list, const char *word) {
  size_t n = strlen(word);
  for (const char *p = list; *p;) {
    size_t k = strcspn(p, ",");
    if (k == n && !strncmp(p, word, n)) return 1;
    p += k + (p[k] == ',');
  }
  return 0;
}

/* The process's path in the hierarchy of controller ctl (a v1 line naming
 * it) or, ctl NULL, in the v2 hierarchy ("0::PATH"). 0, or -1 when none. */
static int cgroup_path(const char *root, const char *ctl, char *path, size_t cap, pw_sysres *o) {
  char file[PATH_MAX], line[PW_SYSRES_LINE_MAX];
  if (under(root, "/proc/self/cgroup", file, sizeof file)) return -1;
  FILE *f = fopen(file, "re");
  if (!f) {
    if (!ctl) note(o, "%.60s: %s", file, strerror(errno)); /* said once: the v2 look comes first */
    return -1;
  }
  int found = -1, rc;
  for (int n = 0; found && n < PW_SYSRES_LINES_MAX && (rc = next_line(f, line, sizeof line)); n++) {
    if (rc < 0) continue;
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c1 = *c2 = '\0';
    int v2 = !strcmp(line, "0") && c1 + 1 == c2;
    if (ctl ? v2 || !has_word(c1 + 1, ctl) : !v2) continue;
    if ((size_t)snprintf(path, cap, "%s", c2 + 1) < cap) found = 0;
  }
  fclose(f);
  return found;
}

/* Where the hierarchy is mounted (cgroup2, or a cgroup v1 mount with
 * controller ctl): *mnt the mount point under ROOT, *rel the process's
 * cgroup below it ("" at the mount's top). Of several mounts, the one whose
 * root holds the process's path deepest; when none holds it (a container
 * shown only its own cgroup), the first: its top is all there is to read. */
static int find_mount(const char *root, const char *ctl, const char *path, char *mnt, char *rel, size_t cap,
                      pw_sysres *o) {
  char file[PATH_MAX], line[PW_SYSRES_LINE_MAX];
  if (under(root, "/proc/self/mountinfo", file, sizeof file)) return -1;
  FILE *f = fopen(file, "re");
  if (!f) {
    if (!ctl) note(o, "%.60s: %s", file, strerror(errno));
    return -1;
  }
  int best = -1, rc; /* length of the best mount root that holds path; 0 none yet but a fallback */
  int have = 0;
  for (int n = 0; n < PW_SYSRES_LINES_MAX && (rc = next_line(f, line, sizeof line)); n++) {
    if (rc < 0) continue;
    /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS */
    char *fld[6], *save = NULL, *t = strtok_r(line, " ", &save);
    int k = 0;
    for (; t && k < 6; t = strtok_r(NULL, " ", &save)) fld[k++] = t;
    if (k < 6) continue;
    while (t && strcmp(t, "-")) t = strtok_r(NULL, " ", &save);
    char *fstype = t ? strtok_r(NULL, " ", &save) : NULL, *source = fstype ? strtok_r(NULL, " ", &save) : NULL;
    char *super = source ? strtok_r(NULL, " ", &save) : NULL;
    if (!super) continue;
    if (ctl ? strcmp(fstype, "cgroup") || !has_word(super, ctl) : strcmp(fstype, "cgroup2")) continue;
    char *mroot = fld[3], *mpoint = fld[4];
    unescape(mroot);
    unescape(mpoint);
    size_t lr = strcmp(mroot, "/") ? strlen(mroot) : 0;
    int holds = (lr == 0 || (!strncmp(path, mroot, lr) && (path[lr] == '/' || path[lr] == '\0'))) &&
                !strstr(path, "/..");
    int score = holds ? (int)lr + 1 : 0;
    if (have && score <= best) continue;
    if (under(root, mpoint, mnt, cap)) continue;
    snprintf(rel, cap, "%s", holds ? path + lr : "");
    best = score;
    have = 1;
  }
  fclose(f);
  if (!have) return -1;
  size_t n = strlen(rel); /* "/a/b/" and "/" walk as "/a/b" and "" */
  while (n && rel[n - 1] == '/') rel[--n] = '\0';
  return 0;
}

/* A non-negative decimal integer, the whole string; -1 otherwise. */
static int64_t parse_u64(const char *s) {
  if (!isdigit((unsigned char)s[0])) return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v > (unsigned long long)INT64_MAX) return -1;
  return (int64_t)v;
}

typedef struct {
  const char *show;   /* the directory as the log shows it: without ROOT */
  const char *dir;    /* the directory to read */
  int v1;
} cg_dir;

/* The smallest limits found so far. */
typedef struct {
  int64_t q, p;       /* quota and period; q 0: none */
  char cpu_file[PATH_MAX];
  int64_t mem;        /* 0: none */
  char mem_file[PATH_MAX];
} limits;

static void read_cpu(const cg_dir *d, limits *l, pw_sysres *o) {
  char f[PATH_MAX], g[PATH_MAX], a[128], b[128];
  int64_t q, p;
  if (!d->v1) {
    if ((size_t)snprintf(f, sizeof f, "%s/cpu.max", d->dir) >= sizeof f) return;
    int rc = read_line(f, a, sizeof a);
    if (rc == -ENOENT) return;
    char *sp = rc ? NULL : strchr(a, ' ');
    if (rc || !sp) {
      note(o, "%.100s/cpu.max: %s", d->show, rc ? strerror(-rc) : "malformed");
      return;
    }
    *sp = '\0';
    if (!strcmp(a, "max")) return;
    q = parse_u64(a), p = parse_u64(sp + 1);
  } else {
    if ((size_t)snprintf(f, sizeof f, "%s/cpu.cfs_quota_us", d->dir) >= sizeof f ||
        (size_t)snprintf(g, sizeof g, "%s/cpu.cfs_period_us", d->dir) >= sizeof g)
      return;
    int rc = read_line(f, a, sizeof a);
    if (rc == -ENOENT) return;
    if (!rc && !strcmp(a, "-1")) return;
    if (!rc) rc = read_line(g, b, sizeof b);
    if (rc) {
      note(o, "%.100s/cpu.cfs_*: %s", d->show, strerror(-rc));
      return;
    }
    q = parse_u64(a), p = parse_u64(b);
  }
  if (q <= 0 || p <= 0) {
    note(o, "%.100s/%s: malformed", d->show, d->v1 ? "cpu.cfs_quota_us" : "cpu.max");
    return;
  }
  if (l->q && (double)q / (double)p >= (double)l->q / (double)l->p) return;
  l->q = q, l->p = p;
  snprintf(l->cpu_file, sizeof l->cpu_file, "%s/%s", d->show, d->v1 ? "cpu.cfs_quota_us" : "cpu.max");
}

static void read_mem(const cg_dir *d, limits *l, pw_sysres *o) {
  char f[PATH_MAX], a[128];
  const char *name = d->v1 ? "memory.limit_in_bytes" : "memory.max";
  if ((size_t)snprintf(f, sizeof f, "%s/%s", d->dir, name) >= sizeof f) return;
  int rc = read_line(f, a, sizeof a);
  if (rc == -ENOENT || (!rc && !strcmp(a, "max"))) return;
  int64_t v = rc ? -1 : parse_u64(a);
  if (v <= 0) {
    note(o, "%.100s/%s: %s", d->show, name, rc ? strerror(-rc) : "malformed");
    return;
  }
  if (l->mem && v >= l->mem) return;
  l->mem = v;
  snprintf(l->mem_file, sizeof l->mem_file, "%s/%s", d->show, name);
}

/* Every cgroup from the process's own up to the mount's top, in the v1
 * hierarchy of controller ctl (its limits only) or, ctl NULL, in the v2
 * one (both). */
static void walk(const char *root, const char *ctl, limits *l, pw_sysres *o) {
  char path[PATH_MAX], mnt[PATH_MAX], rel[PATH_MAX], dir[PATH_MAX];
  if (cgroup_path(root, ctl, path, sizeof path, o) || find_mount(root, ctl, path, mnt, rel, sizeof mnt, o)) return;
  for (;;) {
    if ((size_t)snprintf(dir, sizeof dir, "%s%s", mnt, rel) >= sizeof dir) return;
    cg_dir d = {.show = dir + strlen(root), .dir = dir, .v1 = ctl != NULL};
    if (!ctl || !strcmp(ctl, "cpu")) read_cpu(&d, l, o);
    if (!ctl || !strcmp(ctl, "memory")) read_mem(&d, l, o);
    char *slash = strrchr(rel, '/');
    if (!slash) return;
    *slash = '\0';
  }
}

/* "1.5 GiB" */
static const char *human(int64_t v, char *b, size_t cap) {
  const char *u[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double x = (double)v;
  int k = 0;
  while (x >= 1024 && k < 4) x /= 1024, k++;
  snprintf(b, cap, k ? "%.1f %s" : "%.0f %s", x, u[k]);
  return b;
}

int pw_sysres_read(const pw_sysres_src *src, pw_sysres *o) {
  static const pw_sysres_src none = {0};
  if (!src) src = &none;
  memset(o, 0, sizeof *o);
  const char *root = src->root && strcmp(src->root, "/") ? src->root : "";
  long online = src->online > 0 ? src->online : sysconf(_SC_NPROCESSORS_ONLN);
  o->online = online > 0 ? (int)online : 1;
  o->cpus = src->cpus;
  if (!o->cpus) {
    cpu_set_t set;
    o->cpus = sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : o->online;
  }
  o->phys = src->phys;
  if (!o->phys) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    o->phys = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
  }
  limits l = {0};
  walk(root, NULL, &l, o);
  walk(root, "cpu", &l, o);
  walk(root, "memory", &l, o);

  o->cores = o->cpus;
  if (o->cpus < o->online)
    snprintf(o->cores_from, sizeof o->cores_from, "the affinity mask: %d of %d CPUs online", o->cpus, o->online);
  else
    snprintf(o->cores_from, sizeof o->cores_from, "%d CPUs online, all in the affinity mask", o->online);
  if (l.q) {
    int64_t c = l.q / l.p + (l.q % l.p != 0);
    o->quota_cores = c > INT_MAX ? INT_MAX : (int)c;
    if (o->quota_cores < o->cores) {
      o->cores = o->quota_cores;
      snprintf(o->cores_from, sizeof o->cores_from, "%.120s: %lld/%lld = %.3g CPU%s%s", l.cpu_file, (long long)l.q,
               (long long)l.p, (double)l.q / (double)l.p, l.q == l.p ? "" : "s", l.q % l.p ? ", rounded up" : "");
    }
  }
  if (o->cores < 1) o->cores = 1;

  char h[32];
  o->memory = o->phys;
  snprintf(o->memory_from, sizeof o->memory_from, "physical memory: %s", human(o->phys, h, sizeof h));
  if (!o->phys) snprintf(o->memory_from, sizeof o->memory_from, "unknown: the physical size could not be read");
  if (l.mem) {
    o->mem_limit = l.mem;
    if (!o->phys || l.mem < o->phys) {
      o->memory = l.mem;
      snprintf(o->memory_from, sizeof o->memory_from, "%.140s: %s", l.mem_file, human(l.mem, h, sizeof h));
    }
  }
  return 0;
}

int pw_sysres_cores(void) {
  pw_sysres r;
  if (pw_sysres_read(NULL, &r)) return 1; /* never: it always reads something */
  return r.cores;
}

/* 1 for a byte a host id may hold. */
static int id_byte(unsigned char c) { return isalnum(c) || c == '.' || c == '_' || c == ':' || c == '@' || c == '-'; }

int pw_host_id(const char *root, const char *given, const char *hostname, char *id, size_t cap, char *from,
               size_t fromcap, pw_err *err) {
  if (cap <= PW_HOST_ID_MAX) return pw_err_set(err, PW_EINVAL, "host-id", "buffer of %zu bytes is too small", cap);
  id[0] = '\0';
  if (given) {
    size_t n = strlen(given);
    if (n == 0 || n > PW_HOST_ID_GIVEN_MAX)
      return pw_err_set(err, PW_EINVAL, "host-id", "must be 1..%d bytes, got %zu", PW_HOST_ID_GIVEN_MAX, n);
    for (size_t i = 0; i < n; i++)
      if (!id_byte((unsigned char)given[i]))
        return pw_err_set(err, PW_EINVAL, "host-id",
                          "byte %zu (0x%02x) is not a letter, digit or one of . _ : @ -", i, (unsigned char)given[i]);
    if (n <= PW_HOST_ID_MAX) {
      snprintf(id, cap, "%s", given);
      snprintf(from, fromcap, "given");
    } else { /* too long for the registry: a digest keeps two names apart */
      char hex[PW_SHA256_HEX_LEN + 1];
      pw_sha256_hex(given, n, hex);
      snprintf(id, cap, "sha256:%.32s", hex);
      snprintf(from, fromcap, "given (%zu bytes: its SHA-256)", n);
    }
    return 0;
  }
  char file[PATH_MAX], line[PW_HOST_ID_MAX + 2];
  const char *r = root && strcmp(root, "/") ? root : "";
  if (!under(r, "/etc/machine-id", file, sizeof file) && !read_line(file, line, sizeof line)) {
    size_t n = strlen(line), ok = n > 0 && n <= PW_HOST_ID_MAX;
    for (size_t i = 0; ok && i < n; i++) ok = id_byte((unsigned char)line[i]);
    if (ok) {
      snprintf(id, cap, "%s", line);
      snprintf(from, fromcap, "/etc/machine-id");
      return 0;
    }
  }
  snprintf(id, cap, "%.*s", PW_HOST_ID_MAX, hostname && hostname[0] ? hostname : "unknown");
  snprintf(from, fromcap, "the hostname (no usable /etc/machine-id)");
  return 0;
}
