"""The direct family's x_affine (issue 29: a model's Normalize read into its first conv, inside the zero
padding): the GPU conv+pool and chain kernels against the CPU reference."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minidl.kernels.cpu import direct as cpu  # noqa: E402
from minidl.kernels.gpu import direct as gpu  # noqa: E402

A1, B1 = np.float32([1 / 0.3081]), np.float32([-0.1307 / 0.3081])     # MNIST's Normalize, one channel


def _lenet_stages(rng):
    def p(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)
    return [("conv", p(6, 1, 5, 5), p(6), 2, 2, True), ("conv", p(16, 6, 5, 5), p(16), 0, 2, True),
            ("dense", p(120, 400), p(120), True), ("dense", p(84, 120), p(84), True),
            ("dense", p(10, 84), p(10), False)]


def _gpu(stages):
    return [tuple(cp.asarray(v) if isinstance(v, np.ndarray) else v for v in st) for st in stages]


@pytest.mark.parametrize("n, C", [(1, 1), (7, 1), (300, 1), (9, 3)])     # one channel: scalars; more: a pass
def test_conv_pool_reads_x_through_the_affine_inside_the_padding(n, C):
    rng = np.random.default_rng(n)
    x = rng.random((n, C, 28, 28), np.float32)
    (_, w, b, pads, _, relu), *_ = _lenet_stages(rng)
    w = np.repeat(w, C, axis=1) / C
    A, B = (np.linspace(v, 1.5 * v, C, dtype=np.float32) for v in (A1[0], B1[0]))
    want = cpu.conv2d_bias_relu_maxpool2x2_fprop(x, w, b, pads, relu, x_affine=(A, B))
    got = gpu.conv2d_bias_relu_maxpool2x2_fprop(cp.asarray(x), cp.asarray(w), cp.asarray(b), pads, relu,
                                                x_affine=(A, B))          # host constants, as the schedule's
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-5, atol=1e-5)
    plain = cpu.conv2d_bias_relu_maxpool2x2_fprop((x * A[:, None, None] + B[:, None, None]).astype(np.float32), w, b,
                                                  pads, relu)
    np.testing.assert_allclose(want, plain, rtol=1e-5, atol=1e-5)       # the same as normalising first


@pytest.mark.parametrize("n", [1, 64])
def test_the_chain_reads_x_through_the_affine(n):
    rng = np.random.default_rng(n)
    x, stages = rng.random((n, 1, 28, 28), np.float32), _lenet_stages(rng)
    want = cpu.chain_fprop(x, stages, x_affine=(A1, B1))
    got = gpu.chain_fprop(cp.asarray(x), _gpu(stages), x_affine=(A1, B1))
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-4, atol=1e-5)
    without = gpu.chain_fprop(cp.asarray(x), _gpu(stages))
    assert not np.allclose(cp.asnumpy(without), want, atol=1e-3)         # the affine is applied, not ignored
