/* tokfile: token files (the format is in tokfile.h). */
#include "tokfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  put32(p, (uint32_t)v);
  put32(p + 4, (uint32_t)(v >> 32));
}

int pw_tokfile_is_tokens(const uint8_t *buf, size_t n) {
  return n >= 8 && !memcmp(buf, PW_TOKFILE_MAGIC, 8);
}

int pw_tokfile_header_parse(const uint8_t *buf, size_t n, uint64_t file_size, pw_tokfile_hdr *h,
                            const char *what, pw_err *err) {
  if (!pw_tokfile_is_tokens(buf, n))
    return pw_err_set(err, PW_EFORMAT, what, "not a token file: it does not start with \"%s\"", PW_TOKFILE_MAGIC);
  if (n < PW_TOKFILE_HEADER)
    return pw_err_set(err, PW_EFORMAT, what, "token file header cut short (%zu of %d bytes)", n, PW_TOKFILE_HEADER);
  h->version = get32(buf + 8);
  h->width = get32(buf + 12);
  h->vocab_size = get32(buf + 16);
  h->n_tokens = get64(buf + 24);
  if (h->version != PW_TOKFILE_VERSION)
    return pw_err_set(err, PW_EFORMAT, what, "token file version %u; this build reads version %d", h->version,
                      PW_TOKFILE_VERSION);
  if (h->width != 2 && h->width != 4)
    return pw_err_set(err, PW_EFORMAT, what, "token width %u bytes; must be 2 or 4", h->width);
  if (h->vocab_size < 1)
    return pw_err_set(err, PW_EFORMAT, what, "vocab_size is 0; must be >= 1");
  if (h->width == 2 && h->vocab_size > 65536)
    return pw_err_set(err, PW_EFORMAT, what, "vocab_size %u does not fit 2-byte ids (at most 65536)", h->vocab_size);
  if (get32(buf + 20) != 0) return pw_err_set(err, PW_EFORMAT, what, "reserved header bytes 20..23 are not 0");
  if (file_size) {
    uint64_t body = file_size - PW_TOKFILE_HEADER; /* file_size >= n >= 32 here */
    if (file_size < PW_TOKFILE_HEADER || h->n_tokens > body / h->width || body != h->n_tokens * h->width)
      return pw_err_set(err, PW_EFORMAT, what,
                        "header says %llu tokens of %u bytes (%llu bytes after the header), the file has %llu",
                        (unsigned long long)h->n_tokens, h->width,
                        (unsigned long long)h->n_tokens * h->width, (unsigned long long)body);
  }
  return 0;
}

void pw_tokfile_header_write(const pw_tokfile_hdr *h, uint8_t out[PW_TOKFILE_HEADER]) {
  memset(out, 0, PW_TOKFILE_HEADER);
  memcpy(out, PW_TOKFILE_MAGIC, 8);
  put32(out + 8, h->version);
  put32(out + 12, h->width);
  put32(out + 16, h->vocab_size);
  put64(out + 24, h->n_tokens);
}

int pw_tokfile_check_ids(const uint8_t *ids, uint64_t n, uint64_t first, const pw_tokfile_hdr *h,
                         const char *what, pw_err *err) {
  for (uint64_t i = 0; i < n; i++) {
    uint32_t v = pw_tokfile_id(ids, h->width, i);
    if (v >= h->vocab_size)
      return pw_err_set(err, PW_EFORMAT, what, "token %llu is %u, outside the vocabulary of %u",
                        (unsigned long long)(first + i), v, h->vocab_size);
  }
  return 0;
}

int pw_tokfile_check(const char *path, pw_tokfile_hdr *h, pw_err *err) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return pw_err_set(err, errno == ENOENT ? PW_ENOENT : PW_EIO, path, "cannot open: %s", strerror(errno));
  struct stat st;
  uint8_t hdr[PW_TOKFILE_HEADER], buf[1 << 16];
  size_t got = 0;
  int rc = fstat(fileno(fp), &st) ? pw_err_set(err, PW_EIO, path, "cannot stat: %s", strerror(errno)) : 0;
  if (!rc) got = fread(hdr, 1, sizeof hdr, fp);
  if (!rc && ferror(fp)) rc = pw_err_set(err, PW_EIO, path, "cannot read: %s", strerror(errno));
  if (!rc) rc = pw_tokfile_header_parse(hdr, got, (uint64_t)st.st_size, h, path, err);
  /* ids in blocks of whole ids: the index in an error stays exact */
  uint64_t done = 0;
  while (!rc && done < h->n_tokens) {
    size_t want = (size_t)(h->n_tokens - done < sizeof buf / h->width ? h->n_tokens - done : sizeof buf / h->width);
    if (fread(buf, h->width, want, fp) != want) {
      rc = pw_err_set(err, PW_EIO, path, "cannot read: %s", ferror(fp) ? strerror(errno) : "file shrank");
      break;
    }
    if ((rc = pw_tokfile_check_ids(buf, want, done, h, path, err))) break;
    done += want;
  }
  fclose(fp);
  return rc;
}

int pw_tokfile_from_text(const char *in, const char *out, pw_tokfile_hdr *h, pw_err *err) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid()) >= (int)sizeof tmp)
    return pw_err_set(err, PW_EINVAL, out, "path too long");
  FILE *fi = fopen(in, "rb");
  if (!fi) return pw_err_set(err, errno == ENOENT ? PW_ENOENT : PW_EIO, in, "cannot open: %s", strerror(errno));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int e = errno;
    fclose(fi);
    return pw_err_set(err, PW_EIO, tmp, "cannot create: %s", strerror(e));
  }
  FILE *fo = fdopen(fd, "wb");
  if (!fo) {
    close(fd);
    unlink(tmp);
    fclose(fi);
    return pw_err_set(err, PW_ENOMEM, tmp, "out of memory");
  }
  *h = (pw_tokfile_hdr){.version = PW_TOKFILE_VERSION, .width = 2, .vocab_size = 256, .n_tokens = 0};
  uint8_t hdr[PW_TOKFILE_HEADER], ib[1 << 15], ob[2 << 15];
  pw_tokfile_hdr blank = *h;
  pw_tokfile_header_write(&blank, hdr); /* rewritten with the count at the end */
  int rc = fwrite(hdr, 1, sizeof hdr, fo) == sizeof hdr ? 0 : pw_err_set(err, PW_EIO, tmp, "cannot write: %s", strerror(errno));
  size_t n;
  while (!rc && (n = fread(ib, 1, sizeof ib, fi)) > 0) {
    for (size_t i = 0; i < n; i++) ob[2 * i] = ib[i], ob[2 * i + 1] = 0;
    if (fwrite(ob, 2, n, fo) != n) rc = pw_err_set(err, PW_EIO, tmp, "cannot write: %s", strerror(errno));
    h->n_tokens += n;
  }
  if (!rc && ferror(fi)) rc = pw_err_set(err, PW_EIO, in, "cannot read: %s", strerror(errno));
  pw_tokfile_header_write(h, hdr);
  if (!rc && (fseek(fo, 0, SEEK_SET) || fwrite(hdr, 1, sizeof hdr, fo) != sizeof hdr))
    rc = pw_err_set(err, PW_EIO, tmp, "cannot write the header: %s", strerror(errno));
  if (!rc && (fflush(fo) || fsync(fileno(fo)))) rc = pw_err_set(err, PW_EIO, tmp, "cannot sync: %s", strerror(errno));
  if (fclose(fo) && !rc) rc = pw_err_set(err, PW_EIO, tmp, "cannot close: %s", strerror(errno));
  fclose(fi);
  if (!rc && rename(tmp, out)) rc = pw_err_set(err, PW_EIO, out, "cannot rename %s to it: %s", tmp, strerror(errno));
  if (rc) unlink(tmp);
  return rc;
}

int pw_tokfile_write(const char *out, const uint32_t *ids, uint64_t n, uint32_t vocab_size, pw_tokfile_hdr *h,
                     pw_err *err) {
  if (vocab_size < 1) return pw_err_set(err, PW_EINVAL, out, "vocab_size is 0");
  *h = (pw_tokfile_hdr){.version = PW_TOKFILE_VERSION, .width = vocab_size <= 65536 ? 2 : 4,
                        .vocab_size = vocab_size, .n_tokens = n};
  for (uint64_t i = 0; i < n; i++)
    if (ids[i] >= vocab_size)
      return pw_err_set(err, PW_EINVAL, out, "token %llu is %u, outside the vocabulary of %u", (unsigned long long)i,
                        ids[i], vocab_size);
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid()) >= (int)sizeof tmp)
    return pw_err_set(err, PW_EINVAL, out, "path too long");
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return pw_err_set(err, PW_EIO, tmp, "cannot create: %s", strerror(errno));
  FILE *fo = fdopen(fd, "wb");
  if (!fo) {
    close(fd);
    unlink(tmp);
    return pw_err_set(err, PW_ENOMEM, tmp, "out of memory");
  }
  uint8_t hdr[PW_TOKFILE_HEADER], buf[1 << 15];
  pw_tokfile_header_write(h, hdr);
  int rc = fwrite(hdr, 1, sizeof hdr, fo) == sizeof hdr ? 0 : pw_err_set(err, PW_EIO, tmp, "cannot write: %s", strerror(errno));
  for (uint64_t i = 0; !rc && i < n;) {
    size_t k = 0;
    for (; i < n && k + 4 <= sizeof buf; i++) {
      buf[k++] = (uint8_t)ids[i], buf[k++] = (uint8_t)(ids[i] >> 8);
      if (h->width == 4) buf[k++] = (uint8_t)(ids[i] >> 16), buf[k++] = (uint8_t)(ids[i] >> 24);
    }
    if (fwrite(buf, 1, k, fo) != k) rc = pw_err_set(err, PW_EIO, tmp, "cannot write: %s", strerror(errno));
  }
  if (!rc && (fflush(fo) || fsync(fileno(fo)))) rc = pw_err_set(err, PW_EIO, tmp, "cannot sync: %s", strerror(errno));
  if (fclose(fo) && !rc) rc = pw_err_set(err, PW_EIO, tmp, "cannot close: %s", strerror(errno));
  if (!rc && rename(tmp, out)) rc = pw_err_set(err, PW_EIO, out, "cannot rename %s to it: %s", tmp, strerror(errno));
  if (rc) unlink(tmp);
  return rc;
}
