/*
 * json.h — a small strict JSON reader for the tools and the tests: a tree of nodes,
 *          freed with json_free. Not for untrusted input larger than memory: the whole
 *          text is parsed at once.
 */
#ifndef ATTN_TOOLS_JSON_H
#define ATTN_TOOLS_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jnode {
    jtype type;
    bool boolean;
    double num;
    char *str;           /* J_STR: the decoded string (UTF-8)              */
    char *key;           /* member name when the node is inside an object  */
    struct jnode *child; /* J_ARR / J_OBJ: first element or member         */
    struct jnode *next;  /* next sibling                                   */
} jnode;

/* The value in text[0..len) (not NUL-terminated), or NULL with the reason in err. */
jnode *json_parse(const char *text, size_t len, char *err, size_t errlen);
/* The value of a whole file, or NULL with the reason in err. */
jnode *json_read_file(const char *path, char *err, size_t errlen);
void json_free(jnode *n);

/* Members of an object (NULL / false / -1 when obj is not an object or lacks a member of
 * that type): the node; an integral number (-1 if not integral or beyond 9e15); any number;
 * a string. */
const jnode *jget(const jnode *obj, const char *key);
int jget_i64(const jnode *obj, const char *key, int64_t *out);
bool jget_num(const jnode *obj, const char *key, double *out);
const char *jget_str(const jnode *obj, const char *key);

#endif /* ATTN_TOOLS_JSON_H */
