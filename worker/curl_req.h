/* curl_req: the libcurl request setup the worker's transfers share — the
 * dataset and weights cache (fetch.c) and checkpoint shards
 * (ckptxfer.c): http(s) only, no signals, the worker's user agent, no
 * overall timeout but a connect timeout and a stall limit, cancellation
 * through an abort flag, no proxy for a coordinator on loopback — and the
 * reading of an error answer. */
#ifndef PW_CURL_REQ_H
#define PW_CURL_REQ_H

#include <curl/curl.h>
#include <stdatomic.h>
#include <stddef.h>

/* Sets the common options on h: url, errbuf (CURL_ERROR_SIZE bytes),
 * hdrs when not NULL, the body to on_body(…, body_arg), a transfer that
 * stops once *abort is nonzero (abort may be NULL). The first failing
 * option's code, else CURLE_OK; the caller adds its own options. */
CURLcode pw_curl_setup(CURL *h, const char *url, struct curl_slist *hdrs, char *errbuf, curl_write_callback on_body,
                       void *body_arg, atomic_int *abort);

/* The message of a JSON error answer ({"error": {"message"}}), else its
 * printable start (at most 120 bytes). */
void pw_curl_answer_text(const char *body, size_t len, char *out, size_t cap);

/* Keeps the start of an error answer: up to cap - 1 bytes in all in buf
 * (*len so far, NUL-terminated). */
void pw_curl_keep_answer(char *buf, size_t cap, size_t *len, const char *p, size_t k);
/* All n bytes of p to fd (EINTR retried): 0, or the errno (EIO for a
 * write that wrote nothing). */
int pw_curl_write_all(int fd, const char *p, size_t n);

/* Whether the URL's host is a loopback address. */
int pw_curl_url_is_loopback(const char *url);

#endif
