"""Graph passes: the training lowering (ReLU applied by the BN or Add before it, the final
Softmax dropped) and overwrite-mode gradients change the number of kernels, never the numbers;
the inference passes fold and fuse by what layers declare."""
import numpy as np

import minidl as dl
from minidl import layers as L
from minidl import optim
from minidl.graph import Graph, passes


def net(seed=0, softmax=True):
    x = L.Input((2, 6, 6))
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(4, 3, padding=1, bias=False)(x)))
    r = L.BatchNorm2D()(L.Conv2D(4, 3, padding=1)(h))
    h = L.ReLU()(L.Add()(h, r))
    h = L.ReLU()(L.Conv2D(4, 1)(h))                  # a ReLU after a conv: not fused
    y = L.Dense(3)(L.Flatten()(h))
    model = dl.Model(x, L.Softmax()(y) if softmax else y, dtype="float64", seed=seed)
    rng = np.random.default_rng(seed)
    for p in model.params.values():
        p.data[...] += rng.uniform(-0.3, 0.3, p.shape)
    return model


def run(model, x, gy, training):
    y = model.forward(x, training=training)
    model.zero_grad()
    gx = model.backward(gy)
    return y, gx, model.get_grads()


def test_training_lowering_fuses_only_sole_reader_relus_into_bn_and_add():
    model = net()
    low = model.lower(passes.training)
    acts = {layer.name: layer.activation for layer in low.layers if hasattr(layer, "activation")}
    assert acts == {"conv2d": None, "fbn": "relu", "conv2d_1": None, "fbn_1": None, "add_1": "relu",
                    "conv2d_2": None, "dense": None}
    assert [layer.kind for layer in low.layers].count("relu") == 1            # after the 1x1 conv: kept
    assert low.outputs[0].kind == "dense"                              # the Softmax is dropped: logits
    assert all(low.params[k] is p for k, p in model.params.items())   # the same parameters


def test_lowered_model_equals_the_model_in_training_and_eval():
    x = np.random.default_rng(1).standard_normal((5, 2, 6, 6))
    gz = np.random.default_rng(2).standard_normal((5, 3))
    for training in (True, False):
        head, low = net(softmax=False), net().lower(passes.training)     # the same weights
        z = head.forward(x, training=training)
        head.zero_grad()
        gx = head.backward(gz)
        low.zero_grad()
        np.testing.assert_allclose(low.forward(x, training=training), z, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(low.backward(gz), gx, rtol=1e-12, atol=1e-14)
        for k, g in head.get_grads().items():
            np.testing.assert_allclose(low.get_grads()[k], g, rtol=1e-12, atol=1e-14, err_msg=k)


def pool_net(seed=0):
    """ReLUs before max-pools (2x2, and 3x3 stride 1 pad 1: overlapping), one before an average
    pool and one read twice; integer weights and inputs, so windows hold many ties."""
    x = L.Input((2, 8, 8))
    h = L.MaxPool2D(2)(L.ReLU()(L.Conv2D(4, 3, padding=1)(x)))
    h = L.MaxPool2D(3, 1, 1)(L.ReLU()(L.Conv2D(4, 3, padding=1)(h)))
    h = L.AvgPool2D(2)(L.ReLU()(L.Conv2D(4, 1)(h)))
    r = L.ReLU()(L.Conv2D(4, 1)(h))
    h = L.Add()(L.MaxPool2D(1)(r), r)
    model = dl.Model(x, L.Dense(3)(L.Flatten()(h)), dtype="float64", seed=seed)
    rng = np.random.default_rng(seed)
    for p in model.params.values():
        p.data[...] = rng.integers(-2, 3, p.shape)
    return model


def test_training_lowering_moves_a_relu_after_the_max_pool_reading_it():
    low = pool_net().lower(passes.training)
    kinds = [layer.kind for layer in low.layers]
    assert kinds[:6] == ["conv2d", "pool", "relu", "conv2d", "pool", "relu"]
    assert kinds[6:9] == ["conv2d", "relu", "avgpool"]                # an average does not commute
    assert kinds[9:13] == ["conv2d", "relu", "pool", "add"]           # read twice: stays
    rng = np.random.default_rng(3)
    x, gz = rng.integers(-2, 3, (5, 2, 8, 8)).astype(float), rng.standard_normal((5, 3))
    head = pool_net()
    head.zero_grad()
    low.zero_grad()
    np.testing.assert_array_equal(low.forward(x, training=True), head.forward(x, training=True))
    np.testing.assert_array_equal(low.backward(gz), head.backward(gz))     # the same cells, exactly
    for k, g in head.get_grads().items():    # sums over the batch may run in another memory order
        np.testing.assert_allclose(low.get_grads()[k], g, rtol=1e-14, atol=1e-14, err_msg=k)


def test_inference_passes_fold_and_fuse_by_declaration():
    x = L.Input((2, 6, 6))
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(4, 3, padding=1)(L.Pad2D(1)(x))))
    h = L.Dropout(0.3)(h)
    y = L.Softmax()(L.Dense(3, activation=None)(L.Flatten()(h)))
    model = dl.Model(x, y, dtype="float64")
    g = passes.inference(Graph.of(model, weights=model.get_weights()))
    assert [n.kind for n in g.nodes] == ["conv2d", "flatten", "dense"]
    conv = g.nodes[0].layer
    assert conv.padding == (2, 2, 2, 2) and conv.activation == "relu" and conv.use_bias
    assert sorted(g.weights) == ["conv2d/b", "conv2d/w", "dense/b", "dense/w"]
    assert dict(g.stats) == {"dropout_removed": 1, "softmax_removed": 1, "pad_folded": 1,
                             "batchnorm_folded": 1, "relu_fused": 1}
    assert [n.kind for n in model.nodes][:3] == ["pad", "conv2d", "batchnorm"]   # the model is untouched


def test_a_users_layer_takes_part_through_its_declarations():
    class Gate(L.Layer):                      # an activation the passes know only by declaration
        kind, fusable_activation = "gate", "relu"

        def build(self, in_shapes, device):
            return in_shapes[0]

        def forward(self, xs, training):
            return np.maximum(xs[0], 0)

    x = L.Input((3,))
    model = dl.Model(x, Gate()(L.Dense(2)(x)))
    g = passes.inference(Graph.of(model, weights=model.get_weights()))
    assert [n.kind for n in g.nodes] == ["dense"] and g.nodes[0].layer.activation == "relu"


def test_graph_code_names_no_layer_type():
    import inspect
    import io
    import tokenize
    from minidl.graph import ir, model as gm
    for mod in (passes, ir, gm):
        toks = tokenize.generate_tokens(io.StringIO(inspect.getsource(mod)).readline)
        names = {t.string for t in toks if t.type == tokenize.NAME}      # code, not docstrings
        # Cast is the one layer the graph inserts itself (the edges of a precision policy), as it makes Nodes
        assert not names & set(L.__all__) - {"Input", "Node", "Layer", "Need", "Parameter", "Cast"}, mod.__name__


def test_overwrite_mode_equals_zero_grad_then_accumulate():
    x = np.random.default_rng(1).standard_normal((5, 2, 6, 6))
    gy = np.random.default_rng(2).standard_normal((5, 3))
    model = net()
    assert model.overwrites_grads
    _, _, want = run(model, x, gy, True)
    model.grads[...] = 123.0                          # stale values must not survive
    model.forward(x, training=True)
    model.backward(gy, accumulate=False)
    for k, g in model.get_grads().items():
        np.testing.assert_allclose(g, want[k], rtol=1e-12, err_msg=k)


def test_trainer_overwrites_gradients_and_trains_like_the_reference_loop():
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (64, 6, 6), dtype=np.uint8), rng.integers(0, 3, 64).astype(np.uint8)
    images = np.repeat(images[:, None], 2, axis=1)    # (N, 2, 6, 6)
    a, b = net(), net()
    trainer = dl.Trainer(a, optim.Momentum(0.05), progress=False, log=lambda s: None)
    assert trainer._step.overwrite
    trainer.fit((images, labels), steps=6, batch_size=16, monitor=100)
    ref = dl.Trainer(b, optim.Momentum(0.05), progress=False, log=lambda s: None)
    ref._step.overwrite = False
    ref.fit((images, labels), steps=6, batch_size=16, monitor=100)
    for k, w in b.get_weights().items():
        np.testing.assert_allclose(a.get_weights()[k], w, rtol=1e-12, atol=1e-15, err_msg=k)


def test_channels_last_pass_marks_every_convolution_and_keeps_the_parameters():
    """The layout pass sets `channels_last` on the layers that declare the layout (the convolutions),
    shares their parameters, and changes no result on the CPU (which computes in its own order)."""
    model = net()
    low = model.lower(lambda g: passes.channels_last(passes.training(g)))
    convs = [layer for layer in low.layers if "channels_last" in layer.layouts]
    assert [layer.name for layer in convs] == ["conv2d", "conv2d_1", "conv2d_2"]
    assert all(layer.channels_last for layer in convs)
    assert not any(getattr(layer, "channels_last", False) for layer in model.layers)
    assert all(low.params[k] is p for k, p in model.params.items())
    assert low.layers[0].config()["channels_last"] is True                 # recorded: artifacts keep it
    x = np.random.default_rng(1).standard_normal((5, 2, 6, 6))
    plain = model.lower(passes.training)
    np.testing.assert_array_equal(low.forward(x, training=True), plain.forward(x, training=True))


def test_the_cpu_never_asks_for_channels_last():
    dev = dl.get_device("cpu")
    assert dev.channels_last("float32") is False and dev.channels_last("bfloat16", requested=True) is False
    trainer = dl.Trainer(net(softmax=False), optim.SGD(0.1), progress=False, log=lambda s: None,
                         channels_last=True)
    assert trainer.channels_last is False
