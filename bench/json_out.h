/*
 * json_out.h — writing a JSON string (quotes, backslashes and control characters escaped)
 *              for the bench parts that print their own JSON objects.
 *
 * What it is not: a JSON writer (each part prints its own members) or a reader (json.h).
 */
#ifndef ATTN_TOOLS_JSON_OUT_H
#define ATTN_TOOLS_JSON_OUT_H

#include <stdio.h>

static inline void json_out_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

#endif /* ATTN_TOOLS_JSON_OUT_H */
