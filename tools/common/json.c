/*
 * json.c — a small JSON reader (json.h): objects, arrays, strings with escapes and
 *          surrogate pairs, numbers, true/false/null; strict about syntax, with a
 *          nesting limit. Read by the ONNX conformance harness (manifest.json) and by
 *          `attn bench --vs torch` (the PyTorch side's result lines).
 */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


typedef struct jparser {
    const char *start, *p, *end;
    int depth;
    char err[160];
} jparser;

enum { JSON_MAX_DEPTH = 64 };

void json_free(jnode *n) {
    while (n) {
        jnode *next = n->next;
        json_free(n->child);
        free(n->str);
        free(n->key);
        free(n);
        n = next;
    }
}

static void jfail(jparser *ps, const char *what) {
    if (!ps->err[0])
        snprintf(ps->err, sizeof ps->err, "%s at byte offset %lld", what,
                 (long long)(ps->p - ps->start));
}

static void jskip_ws(jparser *ps) {
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int jhex4(jparser *ps, unsigned *out) {
    if (ps->end - ps->p < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = ps->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    ps->p += 4;
    *out = v;
    return 0;
}

/* Appends the UTF-8 encoding of code point cp to buf (room for 4 bytes guaranteed). */
static size_t jutf8(char *buf, unsigned cp) {
    if (cp < 0x80) {
        buf[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        buf[0] = (char)(0xC0 | (cp >> 6));
        buf[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        buf[0] = (char)(0xE0 | (cp >> 12));
        buf[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        buf[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    buf[0] = (char)(0xF0 | (cp >> 18));
    buf[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    buf[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    buf[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Parses a string literal at ps->p (which points at the opening quote). The decoded text
 * is never longer than the literal, so one buffer of the literal's size is enough. */
static char *jparse_string(jparser *ps) {
    const char *start = ++ps->p;
    const char *q = start;
    while (q < ps->end && *q != '"') q += (*q == '\\' && q + 1 < ps->end) ? 2 : 1;
    if (q >= ps->end) {
        jfail(ps, "unterminated string");
        return NULL;
    }
    char *out = malloc((size_t)(q - start) + 1);
    if (!out) {
        jfail(ps, "out of memory");
        return NULL;
    }
    size_t n = 0;
    while (ps->p < q) {
        unsigned char c = (unsigned char)*ps->p++;
        if (c < 0x20) {
            jfail(ps, "control character in string");
            free(out);
            return NULL;
        }
        if (c != '\\') {
            out[n++] = (char)c;
            continue;
        }
        char e = *ps->p++;
        switch (e) {
        case '"':
            out[n++] = '"';
            break;
        case '\\':
            out[n++] = '\\';
            break;
        case '/':
            out[n++] = '/';
            break;
        case 'b':
            out[n++] = '\b';
            break;
        case 'f':
            out[n++] = '\f';
            break;
        case 'n':
            out[n++] = '\n';
            break;
        case 'r':
            out[n++] = '\r';
            break;
        case 't':
            out[n++] = '\t';
            break;
        case 'u': {
            unsigned cp;
            if (jhex4(ps, &cp) != 0) {
                jfail(ps, "bad \\u escape");
                free(out);
                return NULL;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair: \uD8xx\uDCxx */
                unsigned lo;
                if (q - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    jfail(ps, "lone surrogate");
                    free(out);
                    return NULL;
                }
                ps->p += 2;
                if (jhex4(ps, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF) {
                    jfail(ps, "bad surrogate pair");
                    free(out);
                    return NULL;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                jfail(ps, "lone surrogate");
                free(out);
                return NULL;
            }
            /* \uXXXX is 6 bytes of input for at most 3 bytes of output (12 for 4). */
            n += jutf8(out + n, cp);
            break;
        }
        default:
            jfail(ps, "bad escape");
            free(out);
            return NULL;
        }
    }
    ps->p = q + 1;
    out[n] = '\0';
    return out;
}

static jnode *jparse_value(jparser *ps);

static jnode *jnew(jparser *ps, jtype t) {
    jnode *n = calloc(1, sizeof *n);
    if (!n)
        jfail(ps, "out of memory");
    else
        n->type = t;
    return n;
}

static int jliteral(jparser *ps, const char *word) {
    size_t len = strlen(word);
    if ((size_t)(ps->end - ps->p) < len || memcmp(ps->p, word, len) != 0) return -1;
    ps->p += len;
    return 0;
}

static jnode *jparse_container(jparser *ps, bool is_obj) {
    jnode *n = jnew(ps, is_obj ? J_OBJ : J_ARR);
    if (!n) return NULL;
    if (++ps->depth > JSON_MAX_DEPTH) {
        jfail(ps, "nesting too deep");
        free(n);
        return NULL;
    }
    ps->p++; /* '{' or '[' */
    jnode **tail = &n->child;
    jskip_ws(ps);
    if (ps->p < ps->end && *ps->p == (is_obj ? '}' : ']')) {
        ps->p++;
        ps->depth--;
        return n;
    }
    for (;;) {
        char *key = NULL;
        jskip_ws(ps);
        if (is_obj) {
            if (ps->p >= ps->end || *ps->p != '"') {
                jfail(ps, "expected a member name");
                goto bad;
            }
            if (!(key = jparse_string(ps))) goto bad;
            jskip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                jfail(ps, "expected ':'");
                free(key);
                goto bad;
            }
            ps->p++;
        }
        jnode *v = jparse_value(ps);
        if (!v) {
            free(key);
            goto bad;
        }
        v->key = key;
        *tail = v;
        tail = &v->next;
        jskip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == (is_obj ? '}' : ']')) {
            ps->p++;
            break;
        }
        jfail(ps, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
        goto bad;
    }
    ps->depth--;
    return n;
bad:
    json_free(n);
    return NULL;
}

static jnode *jparse_value(jparser *ps) {
    jskip_ws(ps);
    if (ps->p >= ps->end) {
        jfail(ps, "unexpected end of input");
        return NULL;
    }
    char c = *ps->p;
    if (c == '{' || c == '[') return jparse_container(ps, c == '{');
    if (c == '"') {
        char *s = jparse_string(ps);
        if (!s) return NULL;
        jnode *n = jnew(ps, J_STR);
        if (!n) {
            free(s);
            return NULL;
        }
        n->str = s;
        return n;
    }
    if (jliteral(ps, "true") == 0) {
        jnode *n = jnew(ps, J_BOOL);
        if (n) n->boolean = true;
        return n;
    }
    if (jliteral(ps, "false") == 0) return jnew(ps, J_BOOL);
    if (jliteral(ps, "null") == 0) return jnew(ps, J_NULL);
    if (c == '-' || (c >= '0' && c <= '9')) {
        /* Copy the number's characters into a terminated buffer: the input is not
         * NUL-terminated at ps->end, so strtod must not run on it directly. */
        char buf[64];
        size_t len = 0;
        while (ps->p + len < ps->end && len < sizeof buf - 1 &&
               strchr("+-0123456789.eE", ps->p[len]))
            len++;
        memcpy(buf, ps->p, len);
        buf[len] = '\0';
        char *stop;
        errno = 0;
        double v = strtod(buf, &stop);
        if (stop != buf + len || len == 0 || errno == ERANGE) {
            jfail(ps, "bad number");
            return NULL;
        }
        ps->p += len;
        jnode *n = jnew(ps, J_NUM);
        if (n) n->num = v;
        return n;
    }
    jfail(ps, "unexpected character");
    return NULL;
}

jnode *json_parse(const char *text, size_t len, char *err, size_t errlen) {
    jparser ps = {text, text, text + len, 0, {0}};
    jnode *root = jparse_value(&ps);
    if (root) {
        jskip_ws(&ps);
        if (ps.p != ps.end) {
            jfail(&ps, "trailing characters");
            json_free(root);
            root = NULL;
        }
    }
    if (!root && err) snprintf(err, errlen, "JSON: %s", ps.err);
    return root;
}

jnode *json_read_file(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open: %s", strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                fclose(f);
                snprintf(err, errlen, "out of memory");
                return NULL;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    int ioerr = ferror(f);
    fclose(f);
    if (ioerr) {
        free(buf);
        snprintf(err, errlen, "read error");
        return NULL;
    }
    jnode *root = json_parse(buf, len, err, errlen);
    free(buf);
    return root;
}

const jnode *jget(const jnode *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (const jnode *m = obj->child; m; m = m->next)
        if (strcmp(m->key, key) == 0) return m;
    return NULL;
}

/* An integral number member; -1 if missing, null or not an integer. */
int jget_i64(const jnode *obj, const char *key, int64_t *out) {
    const jnode *n = jget(obj, key);
    if (!n || n->type != J_NUM || n->num != floor(n->num) || fabs(n->num) > 9.0e15) return -1;
    *out = (int64_t)n->num;
    return 0;
}

/* A number member; false if missing or not a number. */
bool jget_num(const jnode *obj, const char *key, double *out) {
    const jnode *n = jget(obj, key);
    if (!n || n->type != J_NUM) return false;
    *out = n->num;
    return true;
}

/* A string member; NULL if missing or not a string. */
const char *jget_str(const jnode *obj, const char *key) {
    const jnode *n = jget(obj, key);
    return n && n->type == J_STR ? n->str : NULL;
}
