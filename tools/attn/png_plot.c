/*
 * png_plot.c — the line plot of png_plot.h: drawn by hand into an RGB canvas (canvas.h:
 *              pixels, the project's bitmap font at twice its size, the PNG writer).
 *
 * Lines are Bresenham's with a 2-pixel pen; a dashed line alternates 9 pixels on and 6
 * off along its length. What it is not: anti-aliased, or general.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "canvas.h"
#include "cli_files.h"
#include "png_plot.h"

enum { W = 960, H = 600, LEFT = 90, RIGHT = 30, TOP = 56, BOTTOM = 70, SCALE = 2 };

static void put(canvas *c, int x, int y, uint32_t rgb) { canvas_put(c, x, y, rgb); }

static void rect(canvas *c, int x0, int y0, int x1, int y1, uint32_t rgb) {
    canvas_rect(c, x0, y0, x1, y1, rgb);
}

/* Bresenham with a pen of `pen` pixels; dashed: 9 on, 6 off, phase carried in *run */
static void line(canvas *c, int x0, int y0, int x1, int y1, uint32_t rgb, int pen, int dashed,
                 int *run) {
    const int dx = abs(x1 - x0), dy = -abs(y1 - y0);
    const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
        if (!dashed || (*run % 15) < 9) rect(c, x0, y0, x0 + pen - 1, y0 + pen - 1, rgb);
        (*run)++;
        if (x0 == x1 && y0 == y1) break;
        const int e2 = 2 * err;
        if (e2 >= dy) {
            err += dy;
            x0 += sx;
        }
        if (e2 <= dx) {
            err += dx;
            y0 += sy;
        }
    }
}

/* ---- text ------------------------------------------------------------------------------ */

enum { CHAR_W = 6 * SCALE, CHAR_H = 7 * SCALE };

static int text_width(const char *s) { return canvas_text_width(s, SCALE); }

/* text with its top-left corner at (x, y); vertical = rotated a quarter turn left */
static void text(canvas *c, int x, int y, const char *s, uint32_t rgb, int vertical) {
    canvas_text(c, x, y, s, rgb, SCALE, vertical);
}

/* ---- axes ----------------------------------------------------------------------------------- */

/* a tick step of 1, 2 or 5 times a power of ten giving at most `most` intervals */
static double nice_step(double span, int most) {
    static const double mult[] = {1, 2, 5, 10};
    const double p = pow(10.0, floor(log10(span / most)));
    for (int k = 0; k < 4; k++)
        if (span / (mult[k] * p) <= most) return mult[k] * p;
    return 10 * p;
}

static void number(char *buf, size_t n, double v, double step) {
    if (step >= 1) snprintf(buf, n, "%.0f", v);
    else if (step >= 0.1) snprintf(buf, n, "%.1f", v);
    else snprintf(buf, n, "%.2f", v);
}

int plot_png_fd(int fd, const char *name, const plot_spec *sp, char *err, size_t errlen) {
    canvas cv;
    if (canvas_new(&cv, W, H, 0xFFFFFF)) {
        snprintf(err, errlen, "out of memory");
        close(fd);
        return -1;
    }
    const int x0 = LEFT, x1 = W - RIGHT, y0 = H - BOTTOM, y1 = TOP;  // plot area
    const double xmax = sp->xmax > 0 ? sp->xmax : 1, ymax = sp->ymax > 0 ? sp->ymax : 1;
#define PX(x) (x0 + (int)lround((x) / xmax * (x1 - x0)))
#define PY(y) (y0 - (int)lround((y) / ymax * (y0 - y1)))

    /* grid, ticks and their numbers */
    char buf[32];
    const double xs = nice_step(xmax, 8), ys = nice_step(ymax, 8);
    for (double x = 0; x <= xmax + 1e-9; x += xs) {
        const int px = PX(x);
        for (int y = y1; y <= y0; y++) put(&cv, px, y, 0xE4E4E4);
        rect(&cv, px, y0, px + 1, y0 + 6, 0x000000);
        number(buf, sizeof buf, x, xs);
        text(&cv, px - text_width(buf) / 2, y0 + 12, buf, 0x000000, 0);
    }
    for (double y = 0; y <= ymax + 1e-9; y += ys) {
        const int py = PY(y);
        for (int x = x0; x <= x1; x++) put(&cv, x, py, 0xE4E4E4);
        rect(&cv, x0 - 6, py, x0, py + 1, 0x000000);
        number(buf, sizeof buf, y, ys);
        text(&cv, x0 - 12 - text_width(buf), py - CHAR_H / 2, buf, 0x000000, 0);
    }
    rect(&cv, x0, y1, x0 + 1, y0 + 1, 0x000000);  // the axes
    rect(&cv, x0, y0, x1, y0 + 1, 0x000000);
    if (sp->title) text(&cv, (W - text_width(sp->title)) / 2, 16, sp->title, 0x000000, 0);
    if (sp->xlabel)
        text(&cv, x0 + (x1 - x0 - text_width(sp->xlabel)) / 2, H - 26, sp->xlabel, 0x000000, 0);
    if (sp->ylabel)
        text(&cv, 14, y0 - (y0 - y1 - text_width(sp->ylabel)) / 2, sp->ylabel, 0x000000, 1);

    /* the curves, clipped to the axes */
    for (int s = 0; s < sp->n_series; s++) {
        const plot_series *se = &sp->series[s];
        int run = 0, have = 0, lx = 0, ly = 0;
        for (int k = 0; k < se->n; k++) {
            if (!isfinite(se->y[k])) {
                have = 0;
                continue;
            }
            double yv = se->y[k] < 0 ? 0 : se->y[k] > ymax ? ymax : se->y[k];
            const int px = PX(se->x[k]), py = PY(yv);
            if (have) line(&cv, lx, ly, px, py, se->rgb, 2, se->dashed, &run);
            lx = px;
            ly = py;
            have = 1;
        }
    }

    /* the legend: a sample of each line and its label, top right */
    int wmax = 0;
    for (int s = 0; s < sp->n_series; s++)
        if (text_width(sp->series[s].label) > wmax) wmax = text_width(sp->series[s].label);
    const int lw = 40 + 12 + wmax + 16, lh = sp->n_series * (CHAR_H + 10) + 12;
    const int lx0 = x1 - lw - 10, ly0 = y1 + 10;
    rect(&cv, lx0, ly0, lx0 + lw, ly0 + lh, 0xFFFFFF);
    for (int x = lx0; x <= lx0 + lw; x++) {
        put(&cv, x, ly0, 0x999999);
        put(&cv, x, ly0 + lh, 0x999999);
    }
    for (int y = ly0; y <= ly0 + lh; y++) {
        put(&cv, lx0, y, 0x999999);
        put(&cv, lx0 + lw, y, 0x999999);
    }
    for (int s = 0; s < sp->n_series; s++) {
        const int y = ly0 + 10 + s * (CHAR_H + 10);
        int run = 0;
        line(&cv, lx0 + 10, y + CHAR_H / 2, lx0 + 50, y + CHAR_H / 2, sp->series[s].rgb, 2,
             sp->series[s].dashed, &run);
        text(&cv, lx0 + 62, y, sp->series[s].label, 0x000000, 0);
    }
#undef PX
#undef PY

    const int rc = canvas_write_png(&cv, fd, name, err, errlen);
    canvas_free(&cv);
    return rc;
}

static int plot_png_writer(int fd, const char *name, const void *ctx, char *err, size_t errlen) {
    return plot_png_fd(fd, name, ctx, err, errlen);
}

int plot_png(const char *path, const plot_spec *sp, char *err, size_t errlen) {
    return cli_files_save("picture", path, NULL, 0, plot_png_writer, sp, err, errlen) ? -1 : 0;
}
