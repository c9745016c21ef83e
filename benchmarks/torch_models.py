"""PyTorch reference models for the benchmarks: minidl's zoo, layer for layer.

`torch_model(case)` builds the PyTorch twin of a benchmark case's minidl model (LeNet-5, the ResNets,
and the cuDNN-vs-PyTorch study's SimpleNet, Caffe's LeNet, ReLUNet and LargeNet); `torch_from_minidl`
copies a minidl model's weights into it by the names minidl.checkpoint.torch_names gives (strict: every
parameter and statistic, each of the right shape). A minidl model that carries its preprocessing
(layers.Normalize) gets a twin that applies it too (`Preprocessed`), so both take the same images
(docs/input.md); its mean and std are no state_dict entries, so the names stay minidl.checkpoint.torch_names'.
"""
import torch
import torch.nn as nn

from minidl.checkpoint import torch_names
from minidl.models.resnet import RESNET_DEPTHS


def _caffe_net(convs, hidden, features, relu):
    """conv (no padding) [-> ReLU] -> max-pool 2 for each (C, K, k) in convs; Flatten; the head."""
    layers = []
    for C, K, k in convs:
        layers += [nn.Conv2d(C, K, k)] + ([nn.ReLU()] if relu else []) + [nn.MaxPool2d(2)]
    head = [nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 10)] if hidden else [nn.Linear(features, 10)]
    return nn.Sequential(*layers, nn.Flatten(), *head)


# model name -> the twin of minidl.models.get(name), layer for layer (a final Softmax left out)
TWINS = {
    "lenet": lambda: nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                                   nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                   nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                   nn.Linear(84, 10)),
    "simplenet": lambda: _caffe_net([(1, 20, 5)], 0, 2880, relu=False),
    "lenet-caffe": lambda: _caffe_net([(1, 20, 5), (20, 50, 5)], 500, 800, relu=False),
    "relunet": lambda: _caffe_net([(1, 20, 5), (20, 50, 5)], 500, 800, relu=True),
    "largenet": lambda: _caffe_net([(1, 20, 3), (20, 50, 3), (50, 70, 3)], 500, 70, relu=False),
}


class Preprocessed(nn.Sequential):
    """An nn.Sequential whose input is first normalised, (x - mean) / std per channel: a twin of a
    minidl model that starts with layers.Normalize. The two are non-persistent buffers (they move with
    .to(device), and the state_dict, hence load_state_dict(strict=True), has the twin's names only)."""

    def __init__(self, net, mean, std):
        super().__init__(*net)
        C = -1
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).reshape(1, C, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).reshape(1, C, 1, 1), persistent=False)

    def forward(self, x):
        return super().forward((x - self.mean) / self.std)


def torch_model(case, normalize=None):
    """The PyTorch twin of the case's minidl model (its "model" and, for a ResNet, "depth");
    normalize: (mean, std) of the minidl model's layers.Normalize, which the twin then applies first."""
    net = TWINS[case["model"]]() if case["model"] in TWINS else _torch_resnet(case["depth"])
    return net if normalize is None else Preprocessed(net, *normalize)


def _torch_resnet(depth):
    """minidl's zoo ResNet in PyTorch: the same layers, explicit pads before strided 3x3 convs."""
    block, counts = RESNET_DEPTHS[depth]

    def conv_bn(cin, cout, k, stride=1, pad=0):
        layers = [nn.ZeroPad2d(pad)] if stride > 1 and k == 3 else []
        layers += [nn.Conv2d(cin, cout, k, stride, 0 if layers else pad, bias=False), nn.BatchNorm2d(cout)]
        return layers

    class Block(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            if block == "bottleneck":
                cout = width * 4
                body = conv_bn(cin, width, 1) + [nn.ReLU()] + conv_bn(width, width, 3, stride, 1) + \
                    [nn.ReLU()] + conv_bn(width, cout, 1)
            else:
                cout = width
                body = conv_bn(cin, width, 3, stride, 1) + [nn.ReLU()] + conv_bn(width, width, 3, 1, 1)
            self.body = nn.Sequential(*body)
            self.short = nn.Sequential(*conv_bn(cin, cout, 1, stride)) if stride > 1 or cin != cout else nn.Identity()
            self.relu, self.cout = nn.ReLU(), cout

        def forward(self, x):
            return self.relu(self.short(x) + self.body(x))

    layers = [nn.ZeroPad2d(3), nn.Conv2d(1, 64, 7, 2, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, (n, width) in enumerate(zip(counts, (64, 128, 256, 512))):
        for j in range(n):
            b = Block(cin, width, 2 if (i > 0 and j == 0) else 1)
            layers.append(b)
            cin = b.cout
    layers += [nn.Flatten(), nn.Linear(cin, 10)]
    return nn.Sequential(*layers)


def torch_from_minidl(case, model, device="cuda"):
    """torch_model(case) holding `model`'s weights (by minidl.checkpoint.torch_names, strict), in eval mode."""
    from minidl.data.loader import preprocessing
    pre = preprocessing(model)
    tmodel = torch_model(case, None if pre is None else (list(pre.mean), list(pre.std)))
    state = {k: torch.from_numpy(v) for k, v in torch_names.to_torch(model).items()}
    tmodel.load_state_dict(state, strict=True)
    modules = dict(tmodel.named_modules())
    paths = torch_names.module_paths(model)
    for node in model.nodes:
        if node.kind == "batchnorm":
            modules[paths[node.layer.name]].eps = node.layer.eps
    return tmodel.to(device).eval()
