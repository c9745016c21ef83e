"""The kernel-family contract: what every backend's families offer, by name, signature and dtype.

A backend (minidl/backends/) holds one module per family, `kernels/<backend>/<family>.py`; a
layer, an optimizer or the inference schedule reaches it as `device.kernels.<family>`. Each family
is written here once as a Protocol: its functions, their parameters (names, order, defaults), one
line of what each computes. tests/test_kernel_contract.py checks every backend's modules against
it (the GPU's from their source, so the check runs without CuPy), so the CPU and GPU twins cannot
drift apart.

`Kernels` (kernels/families.py) holds a backend's families, each typed by its Protocol here, with
what else is said of it: the dtypes the library calls it in (a backend's module declares `DTYPES`
where it computes in fewer: the layer is refused at build, Device.dtype_problem), the functions a
backend may lack (`extras`), whether a backend may lack the whole family. Any family may also answer
`dtype_problem(dtype) -> reason or None` where the library at hand decides (cuDNN's double engines).
Backend-specific knobs are keyword parameters with defaults that other backends accept and ignore
(a convolution's `cl`, the direct kernels' `config`), so one signature serves every backend.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .. import precision

if TYPE_CHECKING:
    from .._types import Array
    from ..rng import CounterRNG
    from .shapes import ConvPlan, PoolPlan

WIDE = ("float32", "float64")                           # float32 under every policy (keeps_fp32), float64 checks
HALF = WIDE + tuple(d.name for d in precision.HALF)     # the families a precision policy's compute region calls


class Conv(Protocol):
    """2-D convolution (cross-correlation, cuDNN's words): a plan from shapes at build, then passes."""
    def conv2d_plan(self, x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int],
                    padding: int | str | Sequence[int], dilation: Sequence[int]) -> ConvPlan:
        """The plan: pads and output shape (kernels/shapes.py)."""
    def conv2d_fprop(self, plan: ConvPlan, x: Array, w: Array, b: Array | None = None, out: Array | None = None,
                     cl: bool = False) -> Array:
        """x (N, C, H, W), w (K, C, kH, kW), b (K,) -> y (N, K, oH, oW); cl: channels-last y where the backend can."""
    def conv2d_dgrad(self, plan: ConvPlan, gy: Array, w: Array, out: Array | None = None,
                     cl: bool | None = None) -> Array:
        """gy (N, K, oH, oW), w -> gx (N, C, H, W)."""
    def conv2d_wgrad(self, plan: ConvPlan, x: Array, gy: Array, gw: Array, accumulate: bool = True) -> None:
        """Adds dL/dw into gw (K, C, kH, kW); accumulate=False overwrites it."""
    def conv2d_bias_relu_fprop(self, plan: ConvPlan, x: Array, w: Array, b: Array | None, out: Array | None = None,
                               cl: bool = False) -> Array:
        """max(conv(x, w) + b, 0) in one call (inference): an extra, Conv2D asks Device.has."""
    def conv2d_bias_add_act_fprop(self, plan: ConvPlan, x: Array, w: Array, b: Array | None, z: Array,
                                  relu: bool = True, out: Array | None = None, cl: bool = False) -> Array:
        """act(conv(x, w) + b + z), z of the output's shape, in one call (inference: a residual add in the
        conv's epilogue): an extra, Conv2D asks Device.has."""


class Dense(Protocol):
    """Fully connected layers and the per-channel bias gradient."""
    def dense_fprop(self, x: Array, w: Array, b: Array | None = None, out: Array | None = None) -> Array:
        """x (N, C), w (K, C), b (K,) -> y = x w^T + b (N, K)."""
    def dense_dgrad(self, gy: Array, w: Array, out: Array | None = None) -> Array:
        """gy (N, K), w (K, C) -> gx (N, C)."""
    def dense_wgrad(self, x: Array, gy: Array, gw: Array, accumulate: bool = True) -> None:
        """Adds gy^T x into gw (K, C)."""
    def bias_grad(self, gy: Array, gb: Array, accumulate: bool = True) -> None:
        """Adds gy summed over every axis but 1 into gb."""


class Activation(Protocol):
    """Elementwise activations. Each is written once, in its layer, as expressions over the array module
    (minidl/layers/activation.py), which `elementwise` computes; the fused pairs below run instead where a
    backend has them (extras but ReLU's; backward reads the output where that suffices)."""
    def elementwise(self, fn: Callable[..., Array], *arrays: Array) -> Array:
        """fn(xp, *arrays), xp the backend's array module (NumPy's API), over arrays of one shape: in the first
        array's dtype and memory order, on float32 copies of half-precision arrays, rounded once."""
    def relu_fprop(self, x: Array, out: Array | None = None) -> Array: """y = max(x, 0)."""
    def relu_bprop(self, y: Array, gy: Array, out: Array | None = None) -> Array: """gx = gy where y > 0."""
    def leaky_relu_fprop(self, x: Array, alpha: float, out: Array | None = None) -> Array:
        """y = x if x > 0 else alpha x."""
    def leaky_relu_bprop(self, x: Array, gy: Array, alpha: float, out: Array | None = None) -> Array:
        """gx = gy if x > 0 else alpha gy."""
    def sigmoid_fprop(self, x: Array, out: Array | None = None) -> Array: """y = 1 / (1 + exp(-x))."""
    def sigmoid_bprop(self, y: Array, gy: Array, out: Array | None = None) -> Array: """gx = gy y (1 - y)."""
    def tanh_fprop(self, x: Array, out: Array | None = None) -> Array: """y = tanh(x)."""
    def tanh_bprop(self, y: Array, gy: Array, out: Array | None = None) -> Array: """gx = gy (1 - y^2)."""


class Merge(Protocol):
    """Sums of same-shape inputs (residual adds)."""
    def add_fprop(self, xs: Sequence[Array], out: Array | None = None, relu: bool = False) -> Array:
        """y = x0 + x1 + ..., then max(y, 0) if relu."""


class Pad(Protocol):
    """Constant padding of H and W."""
    def pad2d_fprop(self, x: Array, pads: tuple[int, int, int, int], value: float = 0.0,
                    out: Array | None = None) -> Array:
        """x (N, C, H, W) -> (N, C, H+top+bottom, W+left+right), new cells = value."""
    def pad2d_bprop(self, gy: Array, pads: tuple[int, int, int, int], out: Array | None = None) -> Array:
        """gx = the centre of gy."""


class Pool(Protocol):
    """Max, average and global average pooling (NCHW, floor output size)."""
    def pool2d_plan(self, x_shape: Sequence[int], ksize: int | Sequence[int], stride: int | Sequence[int],
                    padding: int | str | Sequence[int]) -> PoolPlan:
        """The plan of a kH x kW window (kernels/shapes.py)."""
    def maxpool2d_fprop(self, plan: PoolPlan, x: Array, out: Array | None = None) -> Array:
        """y = the max of each window."""
    def maxpool2d_bprop(self, plan: PoolPlan, x: Array, y: Array, gy: Array, out: Array | None = None) -> Array:
        """gx: each gy to the first max of its window."""
    def avgpool2d_fprop(self, plan: PoolPlan, x: Array, out: Array | None = None) -> Array:
        """y = window sum / (kH kW)."""
    def avgpool2d_bprop(self, plan: PoolPlan, gy: Array, out: Array | None = None) -> Array:
        """gx: gy / (kH kW) over each window."""
    def global_avgpool_fprop(self, x: Array, out: Array | None = None) -> Array:
        """x (N, C, H, W) -> (N, C, 1, 1), the mean over H, W."""
    def global_avgpool_bprop(self, gy: Array, x_shape: Sequence[int], out: Array | None = None) -> Array:
        """gx = gy / (H W) at every pixel."""


class Norm(Protocol):
    """Batch normalisation over N, H, W; float32 parameters and statistics, x and gy in the compute dtype."""
    def bn_fprop_train(self, x: Array, gamma: Array, beta: Array, running_mean: Array, running_var: Array,
                       momentum: float, eps: float, out: Array | None = None,
                       relu: bool = False) -> tuple[Array, Array, Array]:
        """-> (y, mean, invstd), the running statistics updated."""
    def bn_fprop_infer(self, x: Array, gamma: Array, beta: Array, running_mean: Array, running_var: Array,
                       eps: float, out: Array | None = None, relu: bool = False) -> Array:
        """y = gamma (x - running_mean) / sqrt(running_var + eps) + beta."""
    def bn_bprop(self, x: Array, gy: Array, gamma: Array, mean: Array, invstd: Array, ggamma: Array, gbeta: Array,
                 out: Array | None = None, y: Array | None = None, relu: bool = False,
                 accumulate: bool = True) -> Array:
        """gx, adding into ggamma and gbeta (C,)."""


class Lrn(Protocol):
    """Across-channel local response normalisation."""
    def lrn_fprop(self, x: Array, size: int, alpha: float, beta: float, k: float,
                  out: Array | None = None) -> tuple[Array, Array]:
        """-> (y, scale)."""
    def lrn_bprop(self, x: Array, y: Array, scale: Array, gy: Array, size: int, alpha: float, beta: float, k: float,
                  out: Array | None = None) -> Array:
        """-> gx."""


class Dropout(Protocol):
    """Dropout from the counter-based generator: the same draws on every backend."""
    def philox_uniform(self, n: int, key: tuple[int, int], offset: int) -> Array:
        """n float32 draws in [0, 1) at counters offset .. offset+n-1."""
    def dropout_fprop(self, x: Array, rate: float, rng: CounterRNG, out: Array | None = None) -> tuple[Array, Array]:
        """-> (y = x mask, mask); advances rng."""
    def dropout_bprop(self, gy: Array, mask: Array, out: Array | None = None) -> Array: """gx = gy mask."""


class Softmax(Protocol):
    """Softmax over axis 1, the fused softmax cross-entropy of the loss, and a step's running books of it."""
    def softmax_fprop(self, x: Array, out: Array | None = None) -> Array: """y = exp(x - max x) / sum."""
    def softmax_bprop(self, y: Array, gy: Array, out: Array | None = None) -> Array: """gx = y (gy - sum(gy y))."""
    def softmax_xent(self, z: Array, labels: Array, gz: Array | None = None,
                     smoothing: float = 0.0) -> tuple[Array, Array, Array]:
        """Cross-entropy of logits z (N, K) against int labels (N,), its gradient written into gz."""
    def loss_tally(self, loss_sum: Array, correct: Array, finite: Array, steps: Array | None, loss_total: Array,
                   correct_total: Array) -> None:
        """A training step's books, in place on 0-d arrays: finite &= isfinite(loss_sum), steps += finite
        (None: counted by the caller), loss_total (float64) += loss_sum, correct_total (int64) += correct."""


class Controls(NamedTuple):
    """What a controlled update reads besides its hyper-parameters (minidl.optim.base builds it).

    lrs (P,): each element's multiplier of the step's lr; 0 freezes it (its weight, weight decay and
    optimizer state all stay as they were). wds (P,): each element's weight decay, which replaces the
    update's `wd`. gmul: the gradient's multiplier (a 0-d device array or a number: grad_scale times the
    clip-norm factor), which replaces `scale`. clip: gradients are clipped to [-clip, clip] after the
    multiply (0: not). decoupled: the decay is p -= lr wd p before the update (AdamW) rather than g + wd p.
    """
    lrs: Array
    wds: Array
    gmul: Array | float
    clip: float
    decoupled: bool


class Optim(Protocol):
    """Fused optimizer updates over the flat arenas, in place; `ok` False changes nothing (the NaN gate).
    `ctl` (Controls) adds freezing, per-element lr and decay, clipping and decoupled decay; None: none.

    Each optimizer writes its update once, as `rule` over the array module (minidl/optim/reference.py
    runs it on any backend); the updates here are extras a backend may offer to override a rule, and it
    lists those its optimizers should call in `FUSED` (the GPU's four, compared with the rules in the GPU
    tests; the CPU has none). A new optimizer needs nothing here."""
    FUSED: tuple[str, ...]
    def sgd_update(self, p: Array, g: Array, lr: float | Array, wd: float = 0.0, ok: bool | Array = True,
                   scale: float = 1.0, ctl: Controls | None = None) -> None:
        """p -= lr (scale g + wd p)."""
    def momentum_update(self, p: Array, g: Array, v: Array, lr: float | Array, mu: float, wd: float = 0.0,
                        nesterov: bool = False, ok: bool | Array = True, scale: float = 1.0,
                        ctl: Controls | None = None) -> None:
        """v = mu v + d;  p -= lr (d + mu v if nesterov else v)."""
    def adam_update(self, p: Array, g: Array, m: Array, v: Array, lr: float | Array, b1: float, b2: float, eps: float,
                    wd: float, t: int | Array, ok: bool | Array = True, scale: float = 1.0,
                    ctl: Controls | None = None) -> None:
        """Adam at step t >= 1."""
    def rmsprop_update(self, p: Array, g: Array, s: Array, lr: float | Array, rho: float, eps: float,
                       wd: float = 0.0, ok: bool | Array = True, scale: float = 1.0,
                       ctl: Controls | None = None) -> None:
        """s = rho s + (1-rho) d²;  p -= lr d / (√s + eps)."""
    def sq_norm(self, g: Array, lrs: Array) -> Array:
        """Σ g² over the elements where lrs != 0, a 0-d float64 device array (clip_norm's, no host read)."""


class Cast(Protocol):
    """Casts between arenas of different dtypes (a precision policy's copies, graph/arena.py)."""
    def cast_copy(self, dst: Array, src: Array) -> None: """dst[...] = src rounded to dst's dtype."""
    def cast_copy_where(self, dst: Array, src: Array, mask: Array) -> None: """The same where mask holds."""
    def filter_view(self, a: Array, shape: Sequence[int], krsc: bool) -> Array:
        """A 1-D range as (K, C, kH, kW), lying K, kH, kW, C if krsc (kernels/shapes.py)."""
    def cast_filters_krsc(self, dst: Array, src: Array, filters: tuple[tuple[int, ...], ...]) -> None:
        """Filters (offset, K, C, kH, kW) cast and permuted to K, kH, kW, C."""
    def cast_filters_kcrs(self, dst: Array, src: Array, filters: tuple[tuple[int, ...], ...]) -> None:
        """The inverse, back to (K, C, kH, kW)."""


class Direct(Protocol):
    """Fused inference kernels for small shapes (inference/schedule.py); float32. X_AFFINE: whether the
    conv+pool and chain functions take `x_affine` (a model's Normalize read as they stage x)."""
    X_AFFINE: bool
    def pads4(self, pads: int | Sequence[int]) -> tuple[int, int, int, int]: """(top, bottom, left, right)."""
    def conv_geometry(self, x_shape: Sequence[int], w_shape: Sequence[int], pads: int | Sequence[int],
                      pool: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(conv output, pooled output) of a stride-1 conv."""
    def supported_conv(self, x_shape: Sequence[int], w_shape: Sequence[int], pads: int | Sequence[int],
                       pool: int) -> bool:
        """Whether the direct conv kernel takes it (kernels/shapes.py: one answer on every backend)."""
    def supported_chain(self, x_shape: Sequence[int], stages: Sequence[tuple]) -> bool:
        """Whether the chain kernel takes these stages."""
    def conv2d_bias_relu_fprop(self, x: Array, w: Array, b: Array | None, pads: int | Sequence[int] = 0,
                               relu: bool = True, out: Array | None = None,
                               config: Sequence[int] | None = None) -> Array:
        """relu(conv(x, w) + b), stride 1; config: the GPU kernel's launch choice."""
    def conv2d_bias_relu_maxpool2x2_fprop(self, x: Array, w: Array, b: Array | None, pads: int | Sequence[int] = 0,
                                          relu: bool = True, out: Array | None = None,
                                          config: Sequence[int] | None = None,
                                          x_affine: tuple[Array, Array] | None = None) -> Array:
        """maxpool2x2(relu(conv(x, w) + b)); x_affine (a, b), host float32 arrays (C,): x read as a x + b
        per channel inside the zero padding (a Normalize before the conv, inference/schedule.py)."""
    def mlp_fprop(self, x: Array, ws: Sequence[Array], bs: Sequence[Array | None], relus: Sequence[bool],
                  out: Array | None = None) -> Array:
        """A chain of dense layers."""
    def chain_fprop(self, x: Array, stages: Sequence[tuple], out: Array | None = None,
                    blocks: int | None = None, x_affine: tuple[Array, Array] | None = None) -> Array:
        """Conv stages, a flatten, dense stages in one call; blocks: the GPU kernel's grid; x_affine: as
        the conv's, before the first conv stage."""
    def add_relu_fprop(self, xs: Sequence[Array], out: Array | None = None) -> Array: """max(sum of xs, 0)."""
    def bias_act_fprop(self, y: Array, b: Array | None, relu: bool, out: Array | None = None) -> Array:
        """y + b, then max(., 0) if relu."""
    def chain_blocks(self, N: int, D1: int, sms: int | None = None) -> int:
        """An extra: the GPU chain kernel's grid for N samples."""
    def choose_conv(self, N: int, C: int, K: int, kH: int, kW: int, P: int, pH: int, pW: int, rows: int, cols: int,
                    sms: int | None = None) -> tuple:
        """An extra: the GPU direct conv kernel's launch choice."""


class Augment(Protocol):
    """A training batch gathered from the data set, and per-image random shifts and flips of it, drawn
    from the counter-based generator."""
    def gather_batch(self, x: Array, y: Array, idx: Array) -> tuple[Array, Array]:
        """(x[idx], y[idx]): the images and labels of indices idx (B,) in [0, N), x (N, ...), y (N,)."""
    def random_shift(self, x: Array, max_shift: int, fill: float, rng: CounterRNG, out: Array | None = None) -> Array:
        """Each image moved by (dy, dx) in [-max_shift, max_shift], `fill` where it falls outside."""
    def random_flip(self, x: Array, rng: CounterRNG, out: Array | None = None) -> Array:
        """Each image mirrored left-right with probability 1/2."""
    def shift_draws(self, N: int, max_shift: int, key: tuple[int, int], offset: int) -> tuple[Array, Array]:
        """An extra: the shifts' draws, on the host (the CPU's, for tests)."""
    def flip_draws(self, N: int, key: tuple[int, int], offset: int) -> Array:
        """An extra: the flips' draws, on the host."""


class Communicator(Protocol):
    """In-place collectives among data-parallel ranks (`collectives.Communicator(mpi_comm)`)."""
    def allreduce(self, a: Array, op: str) -> None: """a = op over the ranks (sum, min, max, and)."""
    def start(self, a: Array, op: str, wire: Array | None = None) -> None: """The same, begun; wire: its dtype."""
    def reduce_scatter(self, a: Array, op: str, wire: Array | None = None) -> None:
        """On rank r, chunk r of a's N equal chunks = op over the ranks of it, begun (the rest: r's own)."""
    def all_gather(self, a: Array) -> None: """Every chunk of a = its rank's, begun."""
    def wait(self) -> None: """Every started reduction done."""
    def broadcast(self, a: Array, root: int = 0) -> None: """a = root's a."""
    def close(self) -> None: """Release the communicator."""
