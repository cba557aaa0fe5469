/*
 * canvas.c — the RGB canvas of canvas.h: pixels, filled rectangles, text in this file's
 *            own bitmap font, and the PNG writer (libpng).
 *
 * The font was drawn for this project: each glyph is 7 rows of 5 pixels ('#' on) above
 * the baseline, plus 2 below for g, j, p, q, y, in a cell of 6 x 9 pixels, drawn at an
 * integer scale. It covers printable ASCII (a space, or a character outside it, is left
 * blank). What it is not: anti-aliased, proportional, or Unicode.
 */
#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "canvas.h"

int canvas_new(canvas *c, int w, int h, uint32_t bg) {
    c->w = w;
    c->h = h;
    c->px = w > 0 && h > 0 ? malloc((size_t)w * (size_t)h * 3) : NULL;
    if (!c->px) return -1;
    canvas_rect(c, 0, 0, w - 1, h - 1, bg);
    return 0;
}

void canvas_free(canvas *c) {
    free(c->px);
    c->px = NULL;
}

void canvas_put(canvas *c, int x, int y, uint32_t rgb) {
    if (x < 0 || y < 0 || x >= c->w || y >= c->h) return;
    uint8_t *p = c->px + ((size_t)y * (size_t)c->w + (size_t)x) * 3;
    p[0] = (uint8_t)(rgb >> 16);
    p[1] = (uint8_t)(rgb >> 8);
    p[2] = (uint8_t)rgb;
}

void canvas_rect(canvas *c, int x0, int y0, int x1, int y1, uint32_t rgb) {
    for (int y = y0 < 0 ? 0 : y0; y <= y1 && y < c->h; y++)
        for (int x = x0 < 0 ? 0 : x0; x <= x1 && x < c->w; x++) canvas_put(c, x, y, rgb);
}

/* ---- the font --------------------------------------------------------------------------- */

/* 7 rows of 5 (9 with a descender), separated by spaces; '#' = on */
static const struct {
    char ch;
    const char *rows;
} GLYPHS[] = {
    {'a', "..... ..... .###. ....# .#### #...# .####"}, {'b', "#.... #.... ####. #...# #...# #...# ####."},
    {'c', "..... ..... .###. #.... #.... #.... .###."}, {'d', "....# ....# .#### #...# #...# #...# .####"},
    {'e', "..... ..... .###. #...# ##### #.... .###."}, {'f', "..##. .#... ####. .#... .#... .#... .#..."},
    {'g', "..... ..... .#### #...# #...# #...# .#### ....# .###."}, {'h', "#.... #.... ####. #...# #...# #...# #...#"},
    {'i', "..#.. ..... .##.. ..#.. ..#.. ..#.. .###."}, {'j', "...#. ..... ..##. ...#. ...#. ...#. ...#. #..#. .##.."},
    {'k', "#.... #.... #..#. #.#.. ##... #.#.. #..#."}, {'l', ".##.. ..#.. ..#.. ..#.. ..#.. ..#.. .###."},
    {'m', "..... ..... ##.#. #.#.# #.#.# #.#.# #.#.#"}, {'n', "..... ..... ####. #...# #...# #...# #...#"},
    {'o', "..... ..... .###. #...# #...# #...# .###."}, {'p', "..... ..... ####. #...# #...# #...# ####. #.... #...."},
    {'q', "..... ..... .#### #...# #...# #...# .#### ....# ....#"}, {'r', "..... ..... #.##. ##..# #.... #.... #...."},
    {'s', "..... ..... .#### #.... .###. ....# ####."}, {'t', ".#... .#... ####. .#... .#... .#..# ..##."},
    {'u', "..... ..... #...# #...# #...# #..## .##.#"}, {'v', "..... ..... #...# #...# #...# .#.#. ..#.."},
    {'w', "..... ..... #...# #...# #.#.# #.#.# .#.#."}, {'x', "..... ..... #...# .#.#. ..#.. .#.#. #...#"},
    {'y', "..... ..... #...# #...# #...# #...# .#### ....# .###."}, {'z', "..... ..... ##### ...#. ..#.. .#... #####"},
    {'0', ".###. #...# #..## #.#.# ##..# #...# .###."}, {'1', "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###."},
    {'2', ".###. #...# ....# ...#. ..#.. .#... #####"}, {'3', "##### ...#. ..#.. ...#. ....# #...# .###."},
    {'4', "...#. ..##. .#.#. #..#. ##### ...#. ...#."}, {'5', "##### #.... ####. ....# ....# #...# .###."},
    {'6', "..##. .#... #.... ####. #...# #...# .###."}, {'7', "##### ....# ...#. ..#.. .#... .#... .#..."},
    {'8', ".###. #...# #...# .###. #...# #...# .###."}, {'9', ".###. #...# #...# .#### ....# ...#. .##.."},
    {'.', "..... ..... ..... ..... ..... .##.. .##.."}, {',', "..... ..... ..... ..... .##.. ..#.. .#..."},
    {':', "..... .##.. .##.. ..... .##.. .##.. ....."}, {'(', "...#. ..#.. .#... .#... .#... ..#.. ...#."},
    {')', ".#... ..#.. ...#. ...#. ...#. ..#.. .#..."}, {'-', "..... ..... ..... ##### ..... ..... ....."},
    {'/', "..... ....# ...#. ..#.. .#... #.... ....."}, {'=', "..... ..... ##### ..... ##### ..... ....."},
    {'+', "..... ..#.. ..#.. ##### ..#.. ..#.. ....."}, {'\'', "..#.. ..#.. .#... ..... ..... ..... ....."},

    /* capitals and the rest of ASCII's punctuation, for token labels */
    {'A', ".###. #...# #...# ##### #...# #...# #...#"}, {'B', "####. #...# #...# ####. #...# #...# ####."},
    {'C', ".###. #...# #.... #.... #.... #...# .###."}, {'D', "###.. #..#. #...# #...# #...# #..#. ###.."},
    {'E', "##### #.... #.... ####. #.... #.... #####"}, {'F', "##### #.... #.... ####. #.... #.... #...."},
    {'G', ".###. #...# #.... #.### #...# #...# .####"}, {'H', "#...# #...# #...# ##### #...# #...# #...#"},
    {'I', ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###."}, {'J', "..### ...#. ...#. ...#. ...#. #..#. .##.."},
    {'K', "#...# #..#. #.#.. ##... #.#.. #..#. #...#"}, {'L', "#.... #.... #.... #.... #.... #.... #####"},
    {'M', "#...# ##.## #.#.# #.#.# #...# #...# #...#"}, {'N', "#...# #...# ##..# #.#.# #..## #...# #...#"},
    {'O', ".###. #...# #...# #...# #...# #...# .###."}, {'P', "####. #...# #...# ####. #.... #.... #...."},
    {'Q', ".###. #...# #...# #...# #.#.# #..#. .##.#"}, {'R', "####. #...# #...# ####. #.#.. #..#. #...#"},
    {'S', ".#### #.... #.... .###. ....# ....# ####."}, {'T', "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#.."},
    {'U', "#...# #...# #...# #...# #...# #...# .###."}, {'V', "#...# #...# #...# #...# #...# .#.#. ..#.."},
    {'W', "#...# #...# #...# #.#.# #.#.# #.#.# .#.#."}, {'X', "#...# #...# .#.#. ..#.. .#.#. #...# #...#"},
    {'Y', "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#.."}, {'Z', "##### ....# ...#. ..#.. .#... #.... #####"},
    {'_', "..... ..... ..... ..... ..... ..... #####"}, {'!', "..#.. ..#.. ..#.. ..#.. ..#.. ..... ..#.."},
    {'?', ".###. #...# ....# ...#. ..#.. ..... ..#.."}, {'"', ".#.#. .#.#. .#.#. ..... ..... ..... ....."},
    {'#', ".#.#. .#.#. ##### .#.#. ##### .#.#. .#.#."}, {';', "..... .##.. .##.. ..... .##.. ..#.. .#..."},
    {'*', "..... ..#.. #.#.# .###. #.#.# ..#.. ....."}, {'<', "...#. ..#.. .#... #.... .#... ..#.. ...#."},
    {'>', ".#... ..#.. ...#. ....# ...#. ..#.. .#..."}, {'[', ".###. .#... .#... .#... .#... .#... .###."},
    {']', ".###. ...#. ...#. ...#. ...#. ...#. .###."}, {'{', "...## ..#.. ..#.. ##... ..#.. ..#.. ...##"},
    {'}', "##... ..#.. ..#.. ...## ..#.. ..#.. ##..."}, {'&', ".##.. #..#. #.#.. .#... #.#.# #..#. .##.#"},
    {'|', "..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ..#.."}, {'%', "##..# ##..# ...#. ..#.. .#... #..## #..##"},
    {'^', "..#.. .#.#. #...# ..... ..... ..... ....."}, {'~', "..... ..... .#... #.#.# ...#. ..... ....."},
    {'`', ".#... ..#.. ..... ..... ..... ..... ....."}, {'@', ".###. #...# #.### #.#.# #.### #.... .###."},
    {'$', "..#.. .#### #.#.. .###. ..#.# ####. ..#.."}, {'\\', "..... #.... .#... ..#.. ...#. ....# ....."},
};

static const char *glyph(char ch) {
    for (size_t g = 0; g < sizeof GLYPHS / sizeof GLYPHS[0]; g++)
        if (GLYPHS[g].ch == ch) return GLYPHS[g].rows;
    return NULL;  // a space, or a character the font lacks: left blank
}

int canvas_text_width(const char *s, int scale) { return (int)strlen(s) * 6 * scale; }

void canvas_text(canvas *c, int x, int y, const char *s, uint32_t rgb, int scale, int vertical) {
    for (int k = 0; s[k]; k++) {
        const char *g = glyph(s[k]);
        if (!g) continue;
        const int rows = (int)(strlen(g) + 1) / 6;
        for (int row = 0; row < rows; row++)
            for (int col = 0; col < 5; col++) {
                if (g[row * 6 + col] != '#') continue;
                for (int a = 0; a < scale; a++)
                    for (int b = 0; b < scale; b++) {
                        const int px = (k * 6 + col) * scale + a, py = row * scale + b;
                        if (vertical) canvas_put(c, x + py, y - px, rgb);
                        else canvas_put(c, x + px, y + py, rgb);
                    }
            }
    }
}

/* ---- PNG ---------------------------------------------------------------------------------- */

/* libpng's own handlers print to stderr; the command's errors are one line, ours */
static void png_quiet_error(png_structp png, png_const_charp msg) {
    (void)msg;
    png_longjmp(png, 1);
}
static void png_quiet_warning(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

int canvas_write_png(const canvas *c, int fd, const char *name, char *err, size_t errlen) {
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        snprintf(err, errlen, "%s: cannot open for writing", name);
        return -1;
    }
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, png_quiet_error,
                                              png_quiet_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info || setjmp(png_jmpbuf(png))) {
        snprintf(err, errlen, "%s: libpng failed to write it%s%s", name, errno ? ": " : "",
                 errno ? strerror(errno) : "");
        png_destroy_write_struct(&png, &info);
        fclose(f);
        return -1;
    }
    errno = 0;
    png_init_io(png, f);
    /* 8-bit RGB, rows top to bottom */
    png_set_IHDR(png, info, (png_uint_32)c->w, (png_uint_32)c->h, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < c->h; y++) png_write_row(png, c->px + (size_t)y * (size_t)c->w * 3);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    const int bad = fflush(f) != 0 || ferror(f);
    const int e = errno;
    if (fclose(f) != 0 || bad) {
        snprintf(err, errlen, "%s: write error: %s", name, strerror(bad ? e : errno));
        return -1;
    }
    return 0;
}
