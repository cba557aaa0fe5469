/*
 * heatmap.h — attention weights as a PNG: one panel, or a grid of labelled panels (one
 *             per head), each a rows x cols matrix of cells coloured on one scale from
 *             white (0) to dark blue (vmax) — linear, or logarithmic from vmin —, masked cells in their own grey, a colour bar
 *             with its numbers and a "masked" swatch, token labels on the axes.
 *
 * What it is not: the computation of the weights (attn_weights_grid) or a general plot.
 * The colours are fixed and written down here so that tests can read the pixels back.
 */
#ifndef ATTN_HEATMAP_H
#define ATTN_HEATMAP_H

#include <stddef.h>
#include <stdint.h>

#define HEAT_MASKED 0xB4B4B4u  /* a cell whose every entry is masked (value -inf)   */
#define HEAT_NAN    0xFF00FFu  /* a NaN cell                                        */
#define HEAT_BG     0xFFFFFFu  /* the page                                          */

typedef struct heat_panel {
    const float *cells;  /* (rows, cols) row-major; -inf = masked                     */
    const char *title;   /* above the panel ("head 3"), or NULL                       */
} heat_panel;

typedef struct heat_spec {
    const char *title;                 /* the picture's first line, or NULL            */
    const heat_panel *panels;
    int n_panels;
    int64_t rows, cols;                /* cells of every panel                         */
    double vmax;                       /* the top of the colour scale (> 0); above it:
                                          the darkest colour                           */
    const char *scale_label;           /* under the colour bar ("weight"), or NULL     */
    const char *const *row_labels;     /* rows strings (queries), or NULL              */
    const char *const *col_labels;     /* cols strings (keys), or NULL                 */
    int numbers;                       /* print each value in its cell ("0.31") where a
                                          cell is at least 40 pixels                   */
    /* added for the log colour scale (heat_colour_log); 0 = linear, as before          */
    int log;                           /* colour by log10(v) between vmin and vmax     */
    double vmin;                       /* the log scale's bottom (0 < vmin < vmax): at
                                          and below it (weight 0 too) white            */
} heat_spec;

/* The colour of value v on the scale [0, vmax]: white at 0 through light and mid blue to
 * dark blue at vmax, linear between four anchors; HEAT_MASKED for -inf, HEAT_NAN for NaN. */
uint32_t heat_colour(double v, double vmax);

/* The log scale's colour: the same four anchors, at t = log(v / vmin) / log(vmax / vmin)
 * clamped to [0, 1] (v <= vmin, 0 included, is white); -inf and NaN as heat_colour. */
uint32_t heat_colour_log(double v, double vmin, double vmax);

/* Pixels a cell takes: as large as keeps a panel within about 420 pixels, 1 at least. */
int heat_cell_pixels(int64_t rows, int64_t cols);

/* Writes the picture to path by the rules of cli_files.h (a temporary file renamed into
 * place). 0, or -1 with the reason in err. Labels are drawn only where a cell is at
 * least 10 pixels (longer labels are cut to 12 characters). */
int heat_png(const char *path, const heat_spec *spec, char *err, size_t errlen);

/* The same picture written to fd (closed in every case; name for messages), for a
 * command that places its outputs itself (cli_files_open). */
int heat_png_fd(int fd, const char *name, const heat_spec *spec, char *err, size_t errlen);

#endif /* ATTN_HEATMAP_H */
