/*
 * canvas.h — an 8-bit RGB canvas for the command's pictures: pixels, filled rectangles,
 *            text in a built-in bitmap font, and writing it as a PNG (libpng). Shared by
 *            the line plots (png_plot.c) and the attention heatmaps (heatmap.c).
 *
 * What it is not: a graphics library. No blending, no anti-aliasing, one monospaced font
 * (printable ASCII, 6 x 9 pixels a character at scale 1, 7 above the baseline).
 */
#ifndef ATTN_CANVAS_H
#define ATTN_CANVAS_H

#include <stddef.h>
#include <stdint.h>

typedef struct canvas {
    uint8_t *px;  // (h, w, 3), rows top to bottom
    int w, h;
} canvas;

/* w x h pixels of colour bg (0xRRGGBB). 0, or -1 when out of memory. */
int canvas_new(canvas *c, int w, int h, uint32_t bg);
void canvas_free(canvas *c);

/* Pixels outside the canvas are ignored. canvas_rect fills x0..x1, y0..y1 inclusive. */
void canvas_put(canvas *c, int x, int y, uint32_t rgb);
void canvas_rect(canvas *c, int x0, int y0, int x1, int y1, uint32_t rgb);

/* Text with its top-left corner at (x, y), each font pixel drawn scale x scale; vertical:
 * turned a quarter left, reading upwards from (x, y). Width: 6 * scale a character. */
void canvas_text(canvas *c, int x, int y, const char *s, uint32_t rgb, int scale, int vertical);
int canvas_text_width(const char *s, int scale);

/* The PNG written to fd, which is closed in every case (name is for messages): 0, or -1
 * with the reason in err. Placing and renaming the file is the caller's (cli_files.h). */
int canvas_write_png(const canvas *c, int fd, const char *name, char *err, size_t errlen);

#endif /* ATTN_CANVAS_H */
