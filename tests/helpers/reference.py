"""Naive float64 loop references for layer forwards: slow, obvious, never the kernel under test."""
import numpy as np


def conv2d(x, w, b, stride, pads, dilation):
    N, C, H, W = x.shape
    K, _, kH, kW = w.shape
    t, bo, lf, r = pads
    xp = np.zeros((N, C, H + t + bo, W + lf + r))
    xp[:, :, t:t + H, lf:lf + W] = x
    sh, sw = stride
    dh, dw = dilation
    oH = (H + t + bo - (kH - 1) * dh - 1) // sh + 1
    oW = (W + lf + r - (kW - 1) * dw - 1) // sw + 1
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


def conv2d_backward(x, w, gy, stride, pads, dilation):
    """(gx, gw) of conv2d: each output's gradient sent back along the products that made it."""
    N, C, H, W = x.shape
    K, _, kH, kW = w.shape
    t, bo, lf, r = pads
    xp = np.zeros((N, C, H + t + bo, W + lf + r))
    xp[:, :, t:t + H, lf:lf + W] = x
    gxp, gw = np.zeros_like(xp), np.zeros(w.shape)
    (sh, sw), (dh, dw) = stride, dilation
    for n in range(N):
        for k in range(K):
            for i in range(gy.shape[2]):
                for j in range(gy.shape[3]):
                    for c in range(C):
                        for a in range(kH):
                            for e in range(kW):
                                h, v = i * sh + a * dh, j * sw + e * dw
                                gxp[n, c, h, v] += gy[n, k, i, j] * w[k, c, a, e]
                                gw[k, c, a, e] += gy[n, k, i, j] * xp[n, c, h, v]
    return gxp[:, :, t:t + H, lf:lf + W], gw


def _pool_out(x, ksize, stride, pads, value):
    """x padded with `value`, and the floor output size."""
    N, C, H, W = x.shape
    t, bo, lf, r = pads
    xp = np.full((N, C, H + t + bo, W + lf + r), value, dtype=np.float64)
    xp[:, :, t:t + H, lf:lf + W] = x
    oH = (H + t + bo - ksize[0]) // stride[0] + 1
    oW = (W + lf + r - ksize[1]) // stride[1] + 1
    return xp, oH, oW


def maxpool2d(x, ksize, stride, pads):
    """The max of each window of x padded with -inf."""
    xp, oH, oW = _pool_out(x, ksize, stride, pads, -np.inf)
    N, C = x.shape[:2]
    y = np.zeros((N, C, oH, oW))
    for n in range(N):
        for c in range(C):
            for i in range(oH):
                for j in range(oW):
                    m = -np.inf
                    for a in range(ksize[0]):
                        for e in range(ksize[1]):
                            m = max(m, xp[n, c, i * stride[0] + a, j * stride[1] + e])
                    y[n, c, i, j] = m
    return y


def maxpool2d_backward(x, gy, ksize, stride, pads):
    """Each gy added to the first (row-major) maximum of its window of x padded with -inf."""
    xp, oH, oW = _pool_out(x, ksize, stride, pads, -np.inf)
    N, C, H, W = x.shape
    t, lf = pads[0], pads[2]
    gx = np.zeros((N, C, H + t + pads[1], W + lf + pads[3]))
    for n in range(N):
        for c in range(C):
            for i in range(oH):
                for j in range(oW):
                    best, at = -np.inf, None
                    for a in range(ksize[0]):
                        for e in range(ksize[1]):
                            v = xp[n, c, i * stride[0] + a, j * stride[1] + e]
                            if at is None or v > best:
                                best, at = v, (i * stride[0] + a, j * stride[1] + e)
                    gx[n, c, at[0], at[1]] += gy[n, c, i, j]
    return gx[:, :, t:t + H, lf:lf + W]


def avgpool2d(x, ksize, stride, pads):
    """The sum of each window of x padded with zeros, over kH*kW (padding in the divisor)."""
    xp, oH, oW = _pool_out(x, ksize, stride, pads, 0.0)
    N, C = x.shape[:2]
    y = np.zeros((N, C, oH, oW))
    for n in range(N):
        for c in range(C):
            for i in range(oH):
                for j in range(oW):
                    s = 0.0
                    for a in range(ksize[0]):
                        for e in range(ksize[1]):
                            s += xp[n, c, i * stride[0] + a, j * stride[1] + e]
                    y[n, c, i, j] = s / (ksize[0] * ksize[1])
    return y


def global_avgpool(x):
    N, C, H, W = x.shape
    y = np.zeros((N, C, 1, 1))
    for n in range(N):
        for c in range(C):
            s = 0.0
            for i in range(H):
                for j in range(W):
                    s += x[n, c, i, j]
            y[n, c, 0, 0] = s / (H * W)
    return y


def batchnorm_train(x, gamma, beta, eps):
    """Returns y, the batch mean and the biased batch variance per channel."""
    N, C, H, W = x.shape
    M = N * H * W
    y, mean, var = np.zeros((N, C, H, W)), np.zeros(C), np.zeros(C)
    for c in range(C):
        s = 0.0
        for n in range(N):
            for i in range(H):
                for j in range(W):
                    s += x[n, c, i, j]
        mean[c] = s / M
        s = 0.0
        for n in range(N):
            for i in range(H):
                for j in range(W):
                    s += (x[n, c, i, j] - mean[c]) ** 2
        var[c] = s / M
        for n in range(N):
            for i in range(H):
                for j in range(W):
                    y[n, c, i, j] = gamma[c] * (x[n, c, i, j] - mean[c]) / np.sqrt(var[c] + eps) + beta[c]
    return y, mean, var


def batchnorm_infer(x, gamma, beta, running_mean, running_var, eps):
    N, C, H, W = x.shape
    y = np.zeros((N, C, H, W))
    for n in range(N):
        for c in range(C):
            for i in range(H):
                for j in range(W):
                    xhat = (x[n, c, i, j] - running_mean[c]) / np.sqrt(running_var[c] + eps)
                    y[n, c, i, j] = gamma[c] * xhat + beta[c]
    return y


def lrn(x, size, alpha, beta, k):
    """Across channels; the window of c is [c - (size-1)//2, c + size - 1 - (size-1)//2], clipped."""
    N, C, H, W = x.shape
    behind = (size - 1) // 2
    ahead = size - 1 - behind
    y = np.zeros((N, C, H, W))
    for n in range(N):
        for c in range(C):
            for i in range(H):
                for j in range(W):
                    s = 0.0
                    for cc in range(max(0, c - behind), min(C, c + ahead + 1)):
                        s += x[n, cc, i, j] ** 2
                    y[n, c, i, j] = x[n, c, i, j] / (k + alpha / size * s) ** beta
    return y


def shift_images(x, dy, dx, fill):
    """y[n, c, h, w] = x[n, c, h - dy[n], w - dx[n]], `fill` outside the image."""
    N, C, H, W = x.shape
    y = np.full(x.shape, fill, dtype=x.dtype)
    for n in range(N):
        for h in range(H):
            for w in range(W):
                if 0 <= h - dy[n] < H and 0 <= w - dx[n] < W:
                    y[n, :, h, w] = x[n, :, h - dy[n], w - dx[n]]
    return y


def flip_images(x, flips):
    """y[n, :, h, w] = x[n, :, h, W - 1 - w] where flips[n], else x[n]."""
    N, C, H, W = x.shape
    y = x.copy()
    for n in range(N):
        if flips[n]:
            for w in range(W):
                y[n, :, :, w] = x[n, :, :, W - 1 - w]
    return y
