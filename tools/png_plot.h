/*
 * png_plot.h — a small line plot written as a PNG (libpng): axes with ticks and numbers,
 *              light grid lines, any number of curves in their own colours (solid or
 *              dashed), a horizontal reference line, and a legend by colour.
 *
 * What it is not: a plotting library. One fixed layout, lower-case labels in a built-in
 * 5x7 pixel font (digits, a-z and a little punctuation), linear axes from 0.
 */
#ifndef ATTN_PNG_PLOT_H
#define ATTN_PNG_PLOT_H

#include <stddef.h>
#include <stdint.h>

typedef struct plot_series {
    const char *label;  /* legend text                                          */
    const double *x, *y;
    int n;              /* points, drawn joined in order; NaN y breaks the line  */
    uint32_t rgb;       /* 0xRRGGBB                                             */
    int dashed;         /* 0 solid, 1 dashed                                    */
} plot_series;

typedef struct plot_spec {
    const char *title, *xlabel, *ylabel;
    double xmax, ymax;  /* the axes run from 0                                  */
    const plot_series *series;
    int n_series;
} plot_spec;

/* Writes the plot to path. 0 on success; -1 with the reason in err. */
int plot_png(const char *path, const plot_spec *spec, char *err, size_t errlen);

/* Writes W x H 8-bit RGB pixels (rows top to bottom, 3 bytes a pixel) as a PNG; the
 * writer of plot_png, for pictures drawn elsewhere. 0 on success; -1 with the reason. */
int png_write_rgb(const char *path, const unsigned char *px, int W, int H, char *err,
                  size_t errlen);

#endif /* ATTN_PNG_PLOT_H */
