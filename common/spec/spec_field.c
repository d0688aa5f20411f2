/* spec_field: the engine of spec_field.h's tables — one parser and one
 * emitter that walk a table of fields, so parsing and writing back cannot
 * drift apart. spec.c's sections and spec_model.c's model both use it. */
#include "spec_field.h"

#include "suggest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pw__path(char *buf, size_t cap, const char *pre, const char *key) {
  if (pre && pre[0])
    snprintf(buf, cap, "%s.%s", pre, key);
  else
    snprintf(buf, cap, "%s", key);
}

/* "a, b, c" into buf, cut short if it does not fit. */
static void names_list(char *buf, size_t cap, const char *const *names, int n) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < n && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", names[i]);
}

static int enum_parse(const json_t *v, const char *path, const char *const *names, int n, int *out,
                      pw_err *err) {
  if (!json_is_string(v)) return pw_err_set(err, PW_ESPEC, path, "must be a string");
  const char *s = json_string_value(v);
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = i;
      return 0;
    }
  char list[320];
  names_list(list, sizeof list, names, n);
  char near[96];
  return pw_err_set(err, PW_ESPEC, path, "must be one of %s (got \"%.40s\")%s", list, s,
                    pw_suggest_text(s, names, n, "", near, sizeof near));
}

int pw__enum_get(const json_t *o, const char *pre, const char *key, const char *const *names, int n,
                 int def, int *out, pw_err *err) {
  char path[128];
  pw__path(path, sizeof path, pre, key);
  const json_t *v = o ? json_object_get(o, key) : NULL;
  if (!v) {
    if (def < 0) return pw_err_set(err, PW_ESPEC, path, "required");
    *out = def;
    return 0;
  }
  return enum_parse(v, path, names, n, out, err);
}

int pw__globs_get(const json_t *a, const char *path, int max, int len, char *dst, int *n, const char *what,
                  pw_err *err) {
  *n = 0;
  if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > (size_t)max)
    return pw_err_set(err, PW_ESPEC, path, "must be an array of 1 to %d glob patterns over %s", max, what);
  for (size_t i = 0; i < json_array_size(a); i++) {
    const char *s = json_string_value(json_array_get(a, i));
    char p[64];
    snprintf(p, sizeof p, "%s[%zu]", path, i);
    if (!s || !s[0] || strlen(s) >= (size_t)len)
      return pw_err_set(err, PW_ESPEC, p, "must be a non-empty string of at most %d bytes", len - 1);
    snprintf(dst + (size_t)(*n)++ * (size_t)len, (size_t)len, "%s", s);
  }
  return 0;
}

int pw__globs_emit(json_t *o, const char *key, const char *src, int len, int n) {
  json_t *a = json_array();
  int bad = json_object_set_new(o, key, a);
  for (int i = 0; i < n; i++) bad |= json_array_append_new(a, json_string(src + (size_t)i * (size_t)len));
  return bad ? -1 : 0;
}

int pw__obj_get(const json_t *o, const char *pre, const char *key, const json_t **out, pw_err *err) {
  *out = o ? json_object_get(o, key) : NULL;
  if (*out && !json_is_object(*out)) {
    char path[128];
    pw__path(path, sizeof path, pre, key);
    return pw_err_set(err, PW_ESPEC, path, "must be an object");
  }
  return 0;
}

/* lo/hi of a field against v; is_int chooses the number format. */
static int range_check(const pw__field *f, const char *path, double v, long long iv, int is_int,
                       pw_err *err) {
  int lo_open = f->flags & PW__LO_OPEN, hi_open = f->flags & PW__HI_OPEN;
  if (lo_open ? v <= f->lo : v < f->lo) {
    if (is_int) return pw_err_set(err, PW_ESPEC, path, "must be >= %.0f (got %lld)", f->lo, iv);
    return pw_err_set(err, PW_ESPEC, path, "must be %s %g (got %g)", lo_open ? ">" : ">=", f->lo, v);
  }
  if (hi_open ? v >= f->hi : v > f->hi) {
    if (is_int) return pw_err_set(err, PW_ESPEC, path, "must be <= %.0f (got %lld)", f->hi, iv);
    return pw_err_set(err, PW_ESPEC, path, "must be %s %g (got %g)", hi_open ? "<" : "<=", f->hi, v);
  }
  return 0;
}

int pw__field_parse(const pw__field *f, const json_t *v, const char *path, void *dst, pw_err *err) {
  char *p = (char *)dst + f->off;
  int rc;
  switch ((pw__ftype)f->type) {
    case PW__F_SKIP: return 0;
    case PW__F_INT:
    case PW__F_U64: {
      if (!json_is_integer(v)) return pw_err_set(err, PW_ESPEC, path, "must be an integer");
      long long iv = json_integer_value(v);
      if ((rc = range_check(f, path, (double)iv, iv, 1, err))) return rc;
      if (f->type == PW__F_INT)
        *(int *)p = (int)iv;
      else
        *(unsigned long long *)p = (unsigned long long)iv;
      return 0;
    }
    case PW__F_NUM:
    case PW__F_FLOAT: {
      if (!json_is_number(v)) return pw_err_set(err, PW_ESPEC, path, "must be a number");
      double d = json_number_value(v);
      if (!isfinite(d)) return pw_err_set(err, PW_ESPEC, path, "must be finite");
      if ((rc = range_check(f, path, d, 0, 0, err))) return rc;
      if (f->type == PW__F_NUM)
        *(double *)p = d;
      else
        *(float *)p = (float)d;
      return 0;
    }
    case PW__F_BOOL:
      if (!json_is_boolean(v)) return pw_err_set(err, PW_ESPEC, path, "must be a boolean");
      *(int *)p = json_is_true(v);
      return 0;
    case PW__F_ENUM: return enum_parse(v, path, f->names, f->n_names, (int *)p, err);
    case PW__F_STR: {
      if (!json_is_string(v)) return pw_err_set(err, PW_ESPEC, path, "must be a string");
      size_t len = json_string_length(v);
      if (len == 0) return pw_err_set(err, PW_ESPEC, path, "must not be empty");
      if (strlen(json_string_value(v)) != len)
        return pw_err_set(err, PW_ESPEC, path, "must not contain NUL bytes");
      if (len >= f->cap)
        return pw_err_set(err, PW_ESPEC, path, "too long (%zu bytes, at most %zu)", len, f->cap - 1);
      memcpy(p, json_string_value(v), len + 1);
      return 0;
    }
  }
  return pw_err_set(err, PW_EINTERNAL, path, "bad field type");
}

static void field_default(const pw__field *f, void *dst) {
  char *p = (char *)dst + f->off;
  switch ((pw__ftype)f->type) {
    case PW__F_INT:
    case PW__F_BOOL:
    case PW__F_ENUM: *(int *)p = (int)f->def; break;
    case PW__F_U64: *(unsigned long long *)p = (unsigned long long)f->def; break;
    case PW__F_NUM: *(double *)p = f->def; break;
    case PW__F_FLOAT: *(float *)p = (float)f->def; break;
    case PW__F_SKIP:
    case PW__F_STR: break;
  }
}

/* "unknown field; did you mean n_heads?" — the nearest of the fields that
 * belong here (this variant's). */
static int unknown_field(const char *key, const char *path, const pw__field *tab, int n, unsigned mask, pw_err *err) {
  const char *names[128];
  int k = 0;
  for (int i = 0; i < n && k < 128; i++)
    if (tab[i].mask & mask) names[k++] = tab[i].key;
  char near[96];
  return pw_err_set(err, PW_ESPEC, path, "unknown field%s", pw_suggest_text(key, names, k, "", near, sizeof near));
}

int pw__fields_parse(const json_t *o, const char *pre, const pw__field *tab, int n, unsigned mask,
                     const char *ctx, void *dst, pw_err *err) {
  char path[128];
  if (o) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
      int known = 0, here = 0;
      for (int i = 0; i < n; i++)
        if (strcmp(tab[i].key, key) == 0) {
          known = 1;
          here |= (tab[i].mask & mask) != 0;
        }
      pw__path(path, sizeof path, pre, key);
      if (!known) return unknown_field(key, path, tab, n, mask, err);
      if (!here) return pw_err_set(err, PW_ESPEC, path, "not used with %s", ctx);
    }
  }
  for (int i = 0; i < n; i++) {
    const pw__field *f = &tab[i];
    if (!(f->mask & mask)) continue;
    const json_t *v = o ? json_object_get(o, f->key) : NULL;
    pw__path(path, sizeof path, pre, f->key);
    if (!v) {
      if (f->flags & PW__REQ) return pw_err_set(err, PW_ESPEC, path, "required");
      if (!(f->flags & PW__NODEF)) field_default(f, dst);
      continue;
    }
    int rc = pw__field_parse(f, v, path, dst, err);
    if (rc) return rc;
  }
  return 0;
}

int pw__fields_emit(json_t *o, const pw__field *tab, int n, unsigned mask, const void *src) {
  for (int i = 0; i < n; i++) {
    const pw__field *f = &tab[i];
    if (!(f->mask & mask)) continue;
    const char *p = (const char *)src + f->off;
    json_t *v = NULL;
    switch ((pw__ftype)f->type) {
      case PW__F_SKIP: continue;
      case PW__F_INT:
        if ((f->flags & PW__OMIT0) && *(const int *)p == 0) continue;
        if ((f->flags & PW__OMITDEF) && *(const int *)p == (int)f->def) continue;
        v = json_integer(*(const int *)p);
        break;
      case PW__F_U64: v = json_integer((json_int_t) * (const unsigned long long *)p); break;
      case PW__F_NUM: v = json_real(*(const double *)p); break;
      case PW__F_FLOAT: { /* the shortest decimal that is the same float: 1e-05, not 9.9999997e-06 */
        char b[32];
        snprintf(b, sizeof b, "%.9g", (double)*(const float *)p);
        for (int prec = 6; prec < 9; prec++) {
          char t[32];
          snprintf(t, sizeof t, "%.*g", prec, (double)*(const float *)p);
          if (strtof(t, NULL) == *(const float *)p) {
            memcpy(b, t, sizeof t);
            break;
          }
        }
        v = json_real(strtod(b, NULL));
        break;
      }
      case PW__F_BOOL:
        if ((f->flags & PW__OMIT0) && *(const int *)p == 0) continue;
        v = json_boolean(*(const int *)p);
        break;
      case PW__F_ENUM: {
        int e = *(const int *)p;
        if ((f->flags & PW__OMIT0) && e == 0) continue;
        if (e < 0 || e >= f->n_names) return -1;
        v = json_string(f->names[e]);
        break;
      }
      case PW__F_STR:
        if (!*p && !(f->flags & PW__REQ)) continue; /* optional and unset */
        v = json_string(p);
        break;
    }
    if (json_object_set_new(o, f->key, v)) return -1;
  }
  return 0;
}

