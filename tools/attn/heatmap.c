/*
 * heatmap.c — the picture of heatmap.h, drawn into a canvas (canvas.h) and written as PNG.
 *
 * Layout, left to right: for each panel, its row labels, then the cells under the panel's
 * title and its column labels (written upwards); panels in a near-square grid, heads in
 * reading order; the colour bar and its legend at the right. Each cell is a square of
 * heat_cell_pixels() pixels, so a 4 x 4 matrix and a 256 x 256 grid of blocks both come
 * out a few hundred pixels wide. What it is not: a choice of what to draw (cli_viz.c).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "canvas.h"
#include "cli_files.h"
#include "heatmap.h"

enum { PANEL_PX = 420, LABEL_MAX = 12, GAP = 24, BAR_W = 22 };

/* white, light blue, mid blue, dark blue at 0, 1/3, 2/3 and 1 of the scale */
static const uint32_t ANCHORS[4] = {0xFFFFFF, 0xA8C8F0, 0x3870C8, 0x102050};

/* The colour at t in [0, 1] of the scale (t clamped). */
static uint32_t colour_at(double t) {
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    const int seg = t >= 1 ? 2 : (int)(t * 3);
    const double f = t * 3 - seg;
    uint32_t rgb = 0;
    for (int sh = 16; sh >= 0; sh -= 8) {
        const double a = (double)((ANCHORS[seg] >> sh) & 255), b = (double)((ANCHORS[seg + 1] >> sh) & 255);
        rgb |= (uint32_t)lround(a + (b - a) * f) << sh;
    }
    return rgb;
}

uint32_t heat_colour(double v, double vmax) {
    if (isnan(v)) return HEAT_NAN;
    if (v == -INFINITY) return HEAT_MASKED;
    return colour_at(vmax > 0 ? v / vmax : 0);
}

uint32_t heat_colour_log(double v, double vmin, double vmax) {
    if (isnan(v)) return HEAT_NAN;
    if (v == -INFINITY) return HEAT_MASKED;
    if (!(v > vmin) || !(vmax > vmin) || !(vmin > 0)) return colour_at(0);
    return colour_at(log(v / vmin) / log(vmax / vmin));
}

/* A value's colour on the spec's scale, and its place t in [0, 1] on it. */
static uint32_t spec_colour(const heat_spec *sp, double v) {
    return sp->log ? heat_colour_log(v, sp->vmin, sp->vmax) : heat_colour(v, sp->vmax);
}

static double spec_t(const heat_spec *sp, double v) {
    if (!sp->log) return v / sp->vmax;
    return v > sp->vmin ? log(v / sp->vmin) / log(sp->vmax / sp->vmin) : 0;
}

/* The value at t of the spec's scale (the colour bar's pixel rows and ticks). */
static double spec_value(const heat_spec *sp, double t) {
    return sp->log ? sp->vmin * pow(sp->vmax / sp->vmin, t) : sp->vmax * t;
}

int heat_cell_pixels(int64_t rows, int64_t cols) {
    const int64_t n = rows > cols ? rows : cols;
    const int64_t px = n > 0 ? PANEL_PX / n : 1;
    return px < 1 ? 1 : px > 96 ? 96 : (int)px;
}

/* the label cut to LABEL_MAX characters, a space shown as "sp" and an empty one as "" */
static void label_text(const char *s, char *out) {
    if (strcmp(s, " ") == 0) s = "sp";
    snprintf(out, LABEL_MAX + 1, "%s", s);
}

static int label_len(const char *const *labels, int64_t n) {
    int most = 0;
    char buf[LABEL_MAX + 1];
    for (int64_t x = 0; labels && x < n; x++) {
        label_text(labels[x], buf);
        if ((int)strlen(buf) > most) most = (int)strlen(buf);
    }
    return most;
}

int heat_png_fd(int fd, const char *name, const heat_spec *sp, char *err, size_t errlen) {
    const int cp = heat_cell_pixels(sp->rows, sp->cols);
    const int fs = cp >= 24 ? 2 : 1;  // the labels' font scale
    const int labels = cp >= 10;
    const int pw = (int)(sp->cols * cp), ph = (int)(sp->rows * cp);
    const int lw = labels ? label_len(sp->row_labels, sp->rows) * 6 * fs + 6 : 0;
    const int lh = labels ? label_len(sp->col_labels, sp->cols) * 6 * fs + 6 : 0;
    const int th = 9 * fs + 8;  // a panel's title line
    const int gc = (int)ceil(sqrt((double)sp->n_panels)), gr = (sp->n_panels + gc - 1) / gc;
    const int cell_w = lw + pw + GAP, cell_h = th + lh + ph + GAP;
    const int top = sp->title ? 30 : 8, left = 12;
    const int bar_x = left + gc * cell_w + 8, bar_h = ph > 160 ? ph : 160;
    const int W = bar_x + BAR_W + 90, H = top + (gr * cell_h > th + lh + bar_h + 80 ? gr * cell_h : th + lh + bar_h + 80);
    canvas c;
    if (canvas_new(&c, W, H, HEAT_BG)) {
        snprintf(err, errlen, "out of memory for a %d x %d picture", W, H);
        close(fd);
        return -1;
    }
    if (sp->title) canvas_text(&c, left, 10, sp->title, 0x000000, 1, 0);
    char buf[64];
    for (int p = 0; p < sp->n_panels; p++) {
        const int x0 = left + (p % gc) * cell_w + lw, y0 = top + (p / gc) * cell_h + th + lh;
        if (sp->panels[p].title)
            canvas_text(&c, x0, y0 - lh - th + 2, sp->panels[p].title, 0x000000, fs, 0);
        const float *cells = sp->panels[p].cells;
        for (int64_t r = 0; r < sp->rows; r++)
            for (int64_t k = 0; k < sp->cols; k++)
                canvas_rect(&c, x0 + (int)k * cp, y0 + (int)r * cp, x0 + (int)(k + 1) * cp - 1,
                            y0 + (int)(r + 1) * cp - 1, spec_colour(sp, cells[r * sp->cols + k]));
        for (int64_t r = 0; sp->numbers && cp >= 40 && r < sp->rows; r++)
            for (int64_t k = 0; k < sp->cols; k++) {
                const float v = cells[r * sp->cols + k];
                if (!isfinite(v)) continue;
                snprintf(buf, sizeof buf, "%.2f", v);
                const int dark = spec_t(sp, v) > 0.5;  // white on the darker half of the scale
                canvas_text(&c, x0 + (int)k * cp + (cp - canvas_text_width(buf, 1)) / 2,
                            y0 + (int)r * cp + (cp - 7) / 2, buf, dark ? 0xFFFFFF : 0x000000, 1, 0);
            }
        /* a frame one pixel outside the cells */
        canvas_rect(&c, x0 - 1, y0 - 1, x0 + pw, y0 - 1, 0x606060);
        canvas_rect(&c, x0 - 1, y0 + ph, x0 + pw, y0 + ph, 0x606060);
        canvas_rect(&c, x0 - 1, y0 - 1, x0 - 1, y0 + ph, 0x606060);
        canvas_rect(&c, x0 + pw, y0 - 1, x0 + pw, y0 + ph, 0x606060);
        if (!labels) continue;
        char lab[LABEL_MAX + 1];
        for (int64_t r = 0; sp->row_labels && r < sp->rows; r++) {
            label_text(sp->row_labels[r], lab);
            canvas_text(&c, x0 - 4 - canvas_text_width(lab, fs), y0 + (int)r * cp + (cp - 7 * fs) / 2,
                        lab, 0x000000, fs, 0);
        }
        for (int64_t k = 0; sp->col_labels && k < sp->cols; k++) {
            label_text(sp->col_labels[k], lab);
            canvas_text(&c, x0 + (int)k * cp + (cp - 7 * fs) / 2, y0 - 4, lab, 0x000000, fs, 1);
        }
    }
    /* the colour bar: vmax at the top, 0 (or the log scale's vmin) at the bottom; numbers
     * at 0, 1/2 and 1 of a linear scale, at every power of 10 of a log one (with vmin and
     * vmax when fewer than two powers fall inside) */
    const int by0 = top + th + lh, by1 = by0 + bar_h - 1;
    for (int y = by0; y <= by1; y++)
        canvas_rect(&c, bar_x, y, bar_x + BAR_W - 1, y,
                    spec_colour(sp, spec_value(sp, (double)(by1 - y) / (double)(by1 - by0))));
    canvas_rect(&c, bar_x - 1, by0 - 1, bar_x + BAR_W, by0 - 1, 0x606060);
    canvas_rect(&c, bar_x - 1, by1 + 1, bar_x + BAR_W, by1 + 1, 0x606060);
    canvas_rect(&c, bar_x - 1, by0 - 1, bar_x - 1, by1 + 1, 0x606060);
    canvas_rect(&c, bar_x + BAR_W, by0 - 1, bar_x + BAR_W, by1 + 1, 0x606060);
    double ticks[16];
    int nt = 0;
    if (sp->log) {
        const double e0 = ceil(log10(sp->vmin) - 1e-9), e1 = floor(log10(sp->vmax) + 1e-9);
        const double step = e1 - e0 + 1 > 8 ? ceil((e1 - e0 + 1) / 8) : 1;
        for (double e = e0; e <= e1 && nt < 14; e += step) ticks[nt++] = pow(10, e);
        if (nt < 2) ticks[nt++] = sp->vmin, ticks[nt++] = sp->vmax;
    } else {
        for (int t = 0; t <= 2; t++) ticks[nt++] = sp->vmax * t / 2;
    }
    for (int t = 0; t < nt; t++) {
        const int y = by1 - (int)lround((by1 - by0) * spec_t(sp, ticks[t]));
        canvas_rect(&c, bar_x + BAR_W, y, bar_x + BAR_W + 4, y, 0x000000);
        snprintf(buf, sizeof buf, sp->log ? "%.0e" : "%.3g", ticks[t]);
        if (sp->log && ticks[t] != pow(10, round(log10(ticks[t])))) snprintf(buf, sizeof buf, "%.2g", ticks[t]);
        canvas_text(&c, bar_x + BAR_W + 8, y - 3, buf, 0x000000, 1, 0);
    }
    if (sp->log) canvas_text(&c, bar_x, by1 + 34, "log scale", 0x000000, 1, 0);
    if (sp->scale_label) canvas_text(&c, bar_x, by0 - 14, sp->scale_label, 0x000000, 1, 0);
    const int my = by1 + 16;
    canvas_rect(&c, bar_x, my, bar_x + BAR_W - 1, my + 13, HEAT_MASKED);
    canvas_text(&c, bar_x + BAR_W + 6, my + 3, "masked", 0x000000, 1, 0);
    const int rc = canvas_write_png(&c, fd, name, err, errlen);
    canvas_free(&c);
    return rc;
}

static int heat_png_writer(int fd, const char *name, const void *ctx, char *err, size_t errlen) {
    return heat_png_fd(fd, name, ctx, err, errlen);
}

int heat_png(const char *path, const heat_spec *sp, char *err, size_t errlen) {
    return cli_files_save("picture", path, NULL, 0, heat_png_writer, sp, err, errlen) ? -1 : 0;
}
