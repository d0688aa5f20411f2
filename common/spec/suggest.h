/* suggest: "did you mean" — the closest of a list of names to a word that
 * matched none of them. The CLI's unknown flags and schedule names and the
 * spec's unknown fields all ask it, so all three judge "close" alike. */
#ifndef PW_SUGGEST_H
#define PW_SUGGEST_H

/* Edits (insert, delete, substitute, swap two neighbours) from a to b,
 * ignoring ASCII case; capped at 100 (longer words are never "close"). */
int pw_edit_distance(const char *a, const char *b);

/* The name of names[0..n) nearest to word, or NULL when none is near: at
 * most 1 edit for names of up to 4 characters, 2 up to 8, 3 beyond; or
 * word (3+ characters) is the start of exactly one name. The first of
 * equally near names wins. */
const char *pw_suggest(const char *word, const char *const *names, int n);

/* "; did you mean <prefix><name>?" for pw_suggest's name, or "" when
 * none is near: for the end of an error message. */
const char *pw_suggest_text(const char *word, const char *const *names, int n, const char *prefix, char *buf,
                            int cap);

#endif
