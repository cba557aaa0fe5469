"""png_read.py — a small PNG reader for the tests: 8-bit RGB or RGBA, non-interlaced, the
five row filters, into a NumPy array (H, W, 3). Standard library (zlib) and NumPy only.

What it is not: a general decoder (no palette, no 16-bit, no interlacing): it reads what
the `attn` command writes and refuses anything else with a ValueError.
"""
import struct
import zlib

import numpy as np


def read(path):
    data = open(path, 'rb').read()
    if data[:8] != b'\x89PNG\r\n\x1a\n':
        raise ValueError('%s: not a PNG' % path)
    at, idat, w = 8, b'', None
    while at < len(data):
        n, kind = struct.unpack('>I4s', data[at:at + 8])
        body = data[at + 8:at + 8 + n]
        if zlib.crc32(kind + body) != struct.unpack('>I', data[at + 8 + n:at + 12 + n])[0]:
            raise ValueError('%s: bad CRC in %s' % (path, kind))
        if kind == b'IHDR':
            w, h, depth, ctype, _, _, interlace = struct.unpack('>IIBBBBB', body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError('%s: only 8-bit RGB/RGBA, not interlaced' % path)
            bpp = 3 if ctype == 2 else 4
        elif kind == b'IDAT':
            idat += body
        elif kind == b'IEND':
            break
        at += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(h):
        f, line = raw[y * (stride + 1)], np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        cur = np.zeros(stride, dtype=np.int32)
        if f in (0, 2):
            cur = (line + (prev if f == 2 else 0)) & 255
        elif f == 1:  # Sub: a running sum along each channel
            cur = np.cumsum(line.reshape(w, bpp), axis=0).reshape(stride) & 255
        elif f in (3, 4):  # these depend on the pixel to the left: byte by byte
            for x in range(stride):
                a = cur[x - bpp] if x >= bpp else 0
                b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
                if f == 3:
                    pred = (a + b) >> 1
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[x] = (line[x] + pred) & 255
        else:
            raise ValueError('%s: bad filter %d' % (path, f))
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)[:, :, :3]
