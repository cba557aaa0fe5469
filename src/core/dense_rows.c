/*
 * dense_rows.c — a view's rows copied dense (dense_rows.h): the size rule and the copy of
 *                one (n0, n1) slice. Which pass copies what, and when, is its caller's.
 */
#include <string.h>

#include "dense_rows.h"

size_t ai_dense_rows_bytes(const int64_t st[4], int64_t es, int64_t n0, int64_t n1,
                           int64_t L, int64_t D) {
    if (es <= 0 || st[3] != 1 || st[2] == D || L < 2) return 0;
    const int64_t most = (int64_t)DENSE_ROWS_MAX_BYTES;
    const int64_t dims[] = {n0, n1, L, D};
    int64_t n = es;
    for (int i = 0; i < 4; i++)
        if (dims[i] > most || __builtin_mul_overflow(n, dims[i], &n) || n > most) return 0;
    return (size_t)n;
}

void ai_dense_rows_copy(const void *src, const int64_t st[4], int64_t es, int64_t n1,
                        int64_t L, int64_t D, void *dst, int64_t s) {
    const int64_t a = s / n1, b = s % n1;
    const size_t row = (size_t)(D * es);
    const char *from = (const char *)src + (a * st[0] + b * st[1]) * es;
    char *to = (char *)dst + (size_t)s * (size_t)L * row;
    for (int64_t j = 0; j < L; j++) memcpy(to + (size_t)j * row, from + j * st[2] * es, row);
}
