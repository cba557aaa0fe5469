/*
 * png_plot.h — a small line plot written as a PNG (libpng): axes with ticks and numbers,
 *              light grid lines, any number of curves in their own colours (solid or
 *              dashed), a horizontal reference line, and a legend by colour.
 *
 * What it is not: a plotting library. One fixed layout, labels in the built-in 5x7 pixel
 * font of canvas.h (printable ASCII), linear axes from 0.
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

/* Writes the plot to path by the rules of cli_files.h (a temporary file renamed into
 * place). 0 on success; -1 with the reason in err. */
int plot_png(const char *path, const plot_spec *spec, char *err, size_t errlen);

/* The same plot written to fd (closed in every case; name for messages), for a command
 * that places its outputs itself (cli_files_open). */
int plot_png_fd(int fd, const char *name, const plot_spec *spec, char *err, size_t errlen);

#endif /* ATTN_PNG_PLOT_H */
