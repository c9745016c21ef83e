"""The chain kernel's CUDA source, generated for one network's stages (see chain.py).

Conv weights are staged in shared memory transposed to [c][i][j][k] and the input zero-padded for
the first conv; dense weights that fit the shared-memory budget are copied there with cp.async; the
channels a thread computes in each conv stage come from a cost model of one block.
"""
import numpy as np

from ..shapes import pads4
from ._chain_cuda import CHAIN_LIB
from ._util import round_up

CHAIN_THREADS = 512
CHAIN_SMEM_FLOATS = 48 * 1024       # 192 KiB of shared memory a block at most (one block an SM)


def _ro(rows):
    return max(1, min(8, -(-rows // (CHAIN_THREADS // 32))))


def _vec2(P, kW, stride):
    return P == 2 and (kW + 1) % 2 == 0 and stride % 2 == 0


def _chain_kt(C, K, kH, kW, P, npos, vec2):
    """Channels per thread in a chain conv stage, by a cost model of one block (cycles of shared-memory
    loads and of FMA issue, whichever is larger): more channels a thread reuse each loaded input,
    fewer leave warps idle."""
    best, warps_sm = None, CHAIN_THREADS // 32
    for d in range(1, min(K, 16) + 1):
        if K % d:
            continue
        items = (K // d) * npos
        rounds, warps = -(-items // CHAIN_THREADS), min(warps_sm, -(-items // 32))
        w_lds = d // 4 if d % 4 == 0 else (d // 2 if d % 2 == 0 else d)
        patch = (kH + P - 1) * (kW + P - 1)
        patch_lds = patch // 2 if vec2 else patch * (2 if P == 2 else 1)      # stride-2 reads: 2-way conflicts
        lds = rounds * warps * C * (patch_lds + kH * kW * w_lds)
        fma = rounds * -(-warps // 4) * C * kH * kW * P * P * d
        cost = max(lds, fma)
        if best is None or cost <= best[0]:
            best = (cost, d)
    return best[1]


def chain_source(x_shape, stages, shapes, R, affine=False):
    """The chain kernel's CUDA source and dynamic shared bytes for these stages and R first-layer rows
    a block; `affine`: the kernel takes xa, xb (C,) after x and stages x as xa[c] x + xb[c] (a
    Normalize before the first conv; its zero padding stays zero). Conv weights are staged in shared
    memory transposed to [c][i][j][k] and the input zero-padded for the first conv; dense weights that
    fit the shared-memory budget are copied there with cp.async (this block's first-layer rows with the
    input, the later layers as a second group that lands while the convs run); the rest are read from
    global memory."""
    first = next(i for i, st in enumerate(stages) if st[0] == "dense")
    if first > 0:                                       # the first conv reads a zero-padded copy of x
        C0, H0, W0 = x_shape
        t0, b0_, l0, r0 = pads4(stages[0][3])
        in_h, in_w = H0 + t0 + b0_, round_up(W0 + l0 + r0, 2)
        size_in = C0 * in_h * in_w
    else:
        size_in = int(np.prod(x_shape))
    size = int(np.prod(x_shape))
    buf = round_up(max([size_in] + [int(np.prod(s)) for s in shapes]), 4)
    used = 2 * buf
    place = {}                                          # (stage, 'w' or 'b') -> smem offset (floats)

    def reserve(key, n, required=False):
        nonlocal used
        if used + round_up(n, 4) <= CHAIN_SMEM_FLOATS or required:
            place[key] = used
            used += round_up(n, 4)

    for i, st in enumerate(stages[:first]):             # conv weights: always staged
        K, C, kH, kW = st[1].shape
        reserve((i, "w"), C * kH * kW * round_up(K, 4), required=True)
    for i, st in enumerate(stages):                     # this block's first-layer rows, then the later layers
        if i >= first:
            rows = R if i == first else st[1].shape[0]
            reserve((i, "w"), rows * st[1].shape[1])
            if st[2] is not None:
                reserve((i, "b"), rows)

    args, stage_in, copies_a, copies_b = ["const float* __restrict__ x"], [], [], []
    if affine:
        args += ["const float* __restrict__ xa", "const float* __restrict__ xb"]
    xv = "__ldg(x + (size_t)n * {size} + (c * {H0} + hh) * {W0} + ww)"
    xv = f"fmaf({xv}, __ldg(xa + c), __ldg(xb + c))" if affine else xv
    ptr = {}
    for i, st in enumerate(stages):
        args += [f"const float* __restrict__ w{i}", f"const float* __restrict__ b{i}"]
        if st[0] == "conv":
            K, C, kH, kW = st[1].shape
            ckk, KP = C * kH * kW, round_up(K, 4)
            stage_in.append(f"""#pragma unroll 8
    for (int j = threadIdx.x; j < {K * ckk}; j += NT) {{             // w{i} (K, C, kH, kW) -> [c][i][j][k]
        const int k = j / {ckk}, cij = j - k * {ckk};
        sm[{place[(i, 'w')]} + cij * {KP} + k] = __ldg(w{i} + j);
    }}""")
            ptr[(i, "w")], ptr[(i, "b")] = f"(sm + {place[(i, 'w')]})", f"b{i}"
            continue
        D_out, D_in = st[1].shape
        for part, src, per_row in (("w", f"w{i}", D_in), ("b", f"b{i}", 1)):
            if part == "b" and st[2] is None:
                ptr[(i, part)] = src
                continue
            g_src = f"{src} + (size_t)o0 * {per_row}" if i == first else src
            if (i, part) in place:
                n_expr = f"(o1 - o0) * {per_row}" if i == first else str(D_out * per_row)
                (copies_a if i == first else copies_b).append(
                    f"copy_async(sm + {place[(i, part)]}, {g_src}, {n_expr});")
                ptr[(i, part)] = f"(sm + {place[(i, part)]})"
            else:
                ptr[(i, part)] = f"({g_src})"
    if first > 0:
        x_load = f"""#pragma unroll 4
    for (int j = threadIdx.x; j < {size_in}; j += NT) {{            // x, zero-padded to ({C0}, {in_h}, {in_w})
        const int c = j / {in_h * in_w}, rem = j - c * {in_h * in_w};
        const int hh = rem / {in_w} - {t0}, ww = rem % {in_w} - {l0};
        cur[j] = ((unsigned)hh < {H0}u && (unsigned)ww < {W0}u) ? {xv.format(size=size, H0=H0, W0=W0)} : 0.f;
    }}"""
    else:
        if affine:
            raise ValueError("chain: x_affine needs a conv stage first")
        copies_a.insert(0, f"copy_async(cur, x + (size_t)n * {size}, {size});")
        x_load = ""
    body = copies_a + ["cp_async_commit();"] + copies_b + ["cp_async_commit();", x_load] + stage_in + \
        ["cp_async_wait<1>();", "__syncthreads();"]
    shape, n_dense = tuple(x_shape), sum(st[0] == "dense" for st in stages)
    dense_i = 0
    for i, (st, out_shape) in enumerate(zip(stages, shapes)):
        hasb = st[2] is not None
        w_p, b_p = ptr[(i, "w")], ptr[(i, "b")]
        if st[0] == "conv":
            _, w, _, pads, pool, relu = st
            K, C, kH, kW = w.shape
            t, _, l, _ = pads4(pads)
            H, W = shape[1], shape[2]
            if i == 0:                                  # padded storage: windows start inside it
                HS, WS, OT, OL, check = in_h, in_w, 0, 0, 0
            elif not any(pads4(pads)):
                HS, WS, OT, OL, check = H, W, 0, 0, 0
            else:
                HS, WS, OT, OL, check = H, W, t, l, 1
            vec2 = int(not check and _vec2(pool, kW, WS))
            kt = _chain_kt(C, K, kH, kW, pool, out_shape[1] * out_shape[2], vec2)
            body.append(f"conv_stage<{C},{HS},{WS},{H},{W},{K},{kH},{kW},{OT},{OL},{pool},{out_shape[1]},"
                        f"{out_shape[2]},{int(bool(relu))},{kt},{round_up(K, 4)},{int(hasb)},{check},{vec2}>"
                        f"(cur, nxt, {w_p}, {b_p});")
            body.append("__syncthreads(); { float* t_ = cur; cur = nxt; nxt = t_; }")
        else:
            _, w, _, relu = st
            D_out, D_in = w.shape
            last = dense_i == n_dense - 1
            if i == first:                                    # split over the G blocks of this sample
                tmpl = f"{D_in},{_ro(R)},{int(bool(relu))},{int(hasb)}"
                if last:
                    body.append(f"dense_rows<{tmpl}>(cur, y + (size_t)n * {D_out}, {w_p}, {b_p}, o0, o1, o0);")
                    body.append("cp_async_wait<0>();")
                else:
                    body.append(f"""float* dst = gridDim.x == 1 ? nxt : h1 + (size_t)n * {D_out};
    dense_rows<{tmpl}>(cur, dst, {w_p}, {b_p}, o0, o1, o0);
    if (gridDim.x > 1) {{
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) s_last = atomicAdd(tickets + n, 1u) == gridDim.x - 1;
        __syncthreads();
        if (!s_last) {{ cp_async_wait<0>(); return; }}
        __threadfence();
        for (int i = threadIdx.x; i < {D_out}; i += NT) nxt[i] = __ldcg(h1 + (size_t)n * {D_out} + i);
        if (threadIdx.x == 0) tickets[n] = 0u;            // ready for the next launch
    }}
    cp_async_wait<0>();
    __syncthreads(); {{ float* t_ = cur; cur = nxt; nxt = t_; }}""")
            else:
                tmpl = f"{D_in},{_ro(D_out)},{int(bool(relu))},{int(hasb)}"
                dst = f"y + (size_t)n * {D_out}" if last else "nxt"
                body.append(f"dense_rows<{tmpl}>(cur, {dst}, {w_p}, {b_p}, 0, {D_out}, 0);")
                if not last:
                    body.append("__syncthreads(); { float* t_ = cur; cur = nxt; nxt = t_; }")
            dense_i += 1
        shape = out_shape
    D1 = stages[first][1].shape[0]
    args += ["float* __restrict__ y", "float* __restrict__ h1", "unsigned int* __restrict__ tickets", "int R"]
    src = (f"#define NT {CHAIN_THREADS}\n" + CHAIN_LIB + "\nextern \"C\" __global__ void __launch_bounds__(NT, 1)\n"
           "direct_chain(" + ", ".join(args) + ") {\n"
           "    extern __shared__ float4 smem4[];\n    float* sm = reinterpret_cast<float*>(smem4);\n"
           "    __shared__ unsigned int s_last;\n"
           f"    const int n = blockIdx.y, o0 = blockIdx.x * R, o1 = min({D1}, o0 + R);\n"
           f"    float* cur = sm; float* nxt = sm + {buf};\n"
           "    (void)s_last; (void)h1; (void)tickets;\n    " + "\n    ".join(body) + "\n}\n")
    return src, 4 * used
