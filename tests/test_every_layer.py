"""Every layer minidl.layers defines, found through the layer registry, not a hand-kept list: exported
by minidl.layers, its backward checked against central differences in float64, its ONNX export run by
onnxruntime against minidl's forward, and its half-precision run against float32.

A new layer is checked here as soon as its module exists. A layer made with its defaults on an
(N, C, H, W) input needs nothing more (an activation); one that needs arguments or other inputs fails
until CASES says how to make it, and one a check cannot apply to is left out only with its reason.
"""
import importlib
import pkgutil

import numpy as np
import pytest

import minidl as dl
from minidl import layers as L
from minidl.graph import passes
from minidl.layers import registry
from tests.helpers.gradcheck import gradcheck

for _m in pkgutil.iter_modules(L.__path__):          # every module, so the registry holds every layer class
    importlib.import_module(f"{L.__name__}.{_m.name}")
NAMES = registry.defined_in(L.__name__)
SHAPE = (2, 3, 5, 5)                                  # the input of a layer made with its defaults

# how to make the layers whose defaults do not make one of an (N, C, H, W) input: (make, input shapes)
CASES = {
    "Add": (L.Add, [SHAPE, SHAPE]),
    "Cast": (lambda: L.Cast("float32"), [SHAPE]),
    "AvgPool2D": (lambda: L.AvgPool2D(3, stride=2, padding=1), [(2, 3, 6, 6)]),
    "Conv2D": (lambda: L.Conv2D(4, 3, padding=1), [SHAPE]),
    "Dense": (lambda: L.Dense(4), [(2, 6)]),
    "MaxPool2D": (lambda: L.MaxPool2D(2), [(2, 3, 6, 6)]),
    "Pad2D": (lambda: L.Pad2D((1, 0, 2, 1), value=0.5), [SHAPE]),
    "Softmax": (L.Softmax, [(2, 6)]),
}
# the layers a check leaves out, with the reason (and where they are checked instead)
NO_GRADIENT = {"Cast": "the graph's own edge of a precision policy, rounding by design (tests/test_precision.py)",
               "Dropout": "random in training (tests/test_dropout.py checks it with a fixed mask)"}
NO_ONNX = {"Cast": "never in an inference graph: the ONNX export is float32 throughout"}
NO_HALF = {"Cast": "it makes the precision policy's edges"}


def case(name):
    """(make, input shapes) of layer class `name`."""
    return CASES.get(name, (getattr(L, name), [SHAPE]))


def takes_images(name):
    return getattr(getattr(L, name), "takes_images", False)


def inputs(name, shapes, seed=0):
    """Values at least 0.05 from 0, so no difference straddles a kink; images in [0, 1] for a layer that
    takes images (`takes_images`: Normalize, docs/input.md)."""
    rng = np.random.default_rng(seed)
    images = takes_images(name)
    return [rng.uniform(0.05, 1.0, s) * (1.0 if images else rng.choice([-1.0, 1.0], s)) for s in shapes]


def one_layer_model(name, dtype="float32", seed=3):
    make, shapes = case(name)
    xs = [L.Input(s[1:]) for s in shapes]
    return dl.Model(xs[0] if len(xs) == 1 else xs, make()(*xs), dtype=dtype, seed=seed), shapes


def test_the_registry_finds_the_layers():
    assert {"ReLU", "Conv2D", "BatchNorm2D", "Dense", "Normalize"} <= set(NAMES)
    assert not {"Layer", "Input", "Node", "_Activation"} & set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_layer_class_is_exported_by_minidl_layers(name):
    cls = registry.find(name, registry.find(name).__module__)
    assert getattr(L, name, None) is cls and name in L.__all__, (
        f"minidl.layers lacks {name}: name it in its module's __all__ (activation.py) or import it in "
        f"minidl/layers/__init__.py")


@pytest.mark.parametrize("name", NAMES)
def test_every_layer_makes_a_model_of_its_case(name):
    try:
        one_layer_model(name)
    except (TypeError, ValueError) as e:
        pytest.fail(f"{name} is not made by its defaults on an input of shape {SHAPE} ({e}): say how to make it "
                    f"in tests/test_every_layer.py's CASES")


@pytest.mark.parametrize("name", sorted(set(NAMES) - set(NO_GRADIENT)))
def test_every_layers_backward_matches_central_differences_in_float64(name):
    make, shapes = case(name)
    errors = gradcheck(make(), shapes, inputs=inputs(name, shapes))
    assert errors and max(errors.values()) < 1e-6


@pytest.mark.parametrize("name", sorted(set(NAMES) - set(NO_ONNX)))
def test_every_layer_exports_to_onnx_as_minidl_computes_it(name):
    """onnxruntime runs the exported graph of the layer alone (each activation's declared operator, or its
    own onnx(...) method) and gives minidl's forward of the same inputs."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from minidl.inference.onnx_export import to_onnx
    model, shapes = one_layer_model(name)
    xs = [x.astype(np.float32) * (1 if takes_images(name) else 3) for x in inputs(name, shapes, seed=1)]
    rng = np.random.default_rng(2)
    for layer in model.layers:                        # parameters and statistics away from their start
        layer.set_weights({k: rng.uniform(0.5, 1.5, v.shape) for k, v in layer.get_weights().items()})
    proto = to_onnx(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {i.name: x for i, x in zip(session.get_inputs(), xs)}
    got = session.run(None, feed)[0]
    np.testing.assert_allclose(got, model.forward(*xs, training=False), rtol=1e-5, atol=1e-6)


REL_TOL = {"bfloat16": 1.2e-2, "float16": 1.5e-3}


def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(np.asarray(b, np.float64)), 1e-30))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(set(NAMES) - set(NO_HALF)))
def test_every_layer_under_a_half_precision_policy_stays_near_float32(name, dtype):
    """The layer lowered into a policy's compute region (it computes in `dtype`, or keeps float32 where it
    declares so): outputs, input gradients and parameter gradients within the dtype's rounding of float32's."""
    model, shapes = one_layer_model(name)
    ref, half = model.lower(lambda g: g), model.lower(lambda g: passes.cast(g, dtype))
    xs = [x.astype(np.float32) for x in inputs(name, shapes, seed=4)]
    outs = []
    for net in (ref, half):
        model.device.rng.offset.fill(0)                                   # dropout: the same mask both times
        y = net.forward(*xs, training=True)
        gy = np.random.default_rng(5).standard_normal(y.shape).astype(np.float32)
        net.zero_grad()
        gx = net.backward(gy)
        outs.append((y, gx if len(xs) > 1 else [gx], model.get_grads()))
    (y0, gx0, g0), (y1, gx1, g1) = outs
    tol = REL_TOL[dtype]
    assert y1.dtype == np.float32 and _rel(y1, y0) <= tol
    for a, b in zip(gx1, gx0):
        assert _rel(a, b) <= tol
    for k in g0:
        assert _rel(g1[k], g0[k]) <= tol, k
