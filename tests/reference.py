"""Naive float64 loop references for layer forwards: slow, obvious, never the kernel under test."""
import numpy as np


def conv2d(x, w, b, stride, pads, dilation):
    N, C, H, W = x.shape
    K, _, kH, kW = w.shape
    t, bo, l, r = pads
    xp = np.zeros((N, C, H + t + bo, W + l + r))
    xp[:, :, t:t + H, l:l + W] = x
    sh, sw = stride
    dh, dw = dilation
    oH = (H + t + bo - (kH - 1) * dh - 1) // sh + 1
    oW = (W + l + r - (kW - 1) * dw - 1) // sw + 1
    y = np.zeros((N, K, oH, oW))
    for n in range(N):
        for k in range(K):
            for i in range(oH):
                for j in range(oW):
                    s = 0.0
                    for c in range(C):
                        for a in range(kH):
                            for e in range(kW):
                                s += xp[n, c, i * sh + a * dh, j * sw + e * dw] * w[k, c, a, e]
                    y[n, k, i, j] = s + (b[k] if b is not None else 0.0)
    return y
