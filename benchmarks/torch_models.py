"""PyTorch reference models for the benchmarks: minidl's zoo LeNet-5 and ResNets, layer for layer.

`torch_model(case)` builds the PyTorch twin of a benchmark case's minidl model; `torch_from_minidl`
copies a minidl model's weights into it (matched by layer order, checked by shape).
"""
import numpy as np
import torch
import torch.nn as nn

from minidl import layers as L
from minidl.models.resnet import RESNET_DEPTHS


def torch_model(case):
    """The PyTorch twin of the case's minidl model (its "model" and "depth")."""
    if case["model"] == "lenet":
        return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
    return _torch_resnet(case["depth"])


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



def _torch_param_modules(tmodel):
    """The conv, BN and linear modules of a torch_model() in minidl's layer order (in a residual
    block minidl orders the projection shortcut first, then the branch)."""
    kinds = (nn.Conv2d, nn.BatchNorm2d, nn.Linear)
    for child in tmodel.children():
        if hasattr(child, "short") and hasattr(child, "body"):
            for part in (child.short, child.body):
                yield from (m for m in part.modules() if isinstance(m, kinds))
        elif isinstance(child, kinds):
            yield child


def torch_from_minidl(case, model, device="cuda"):
    """torch_model(case) holding `model`'s weights (matched by layer order, checked by shape), eval mode."""
    tmodel = torch_model(case)
    src = [layer for layer in model.layers if isinstance(layer, (L.Conv2D, L.BatchNorm2D, L.Dense))]
    dst = list(_torch_param_modules(tmodel))
    if len(src) != len(dst):
        raise ValueError(f"{model.name}: {len(src)} minidl layers with weights, {len(dst)} PyTorch modules")
    w = model.get_weights()

    def put(param, key):
        a = torch.from_numpy(np.ascontiguousarray(w[key], dtype=np.float32))
        if tuple(param.shape) != tuple(a.shape):
            raise ValueError(f"{key}: minidl {tuple(a.shape)} vs PyTorch {tuple(param.shape)}")
        param.copy_(a)

    with torch.no_grad():
        for layer, mod in zip(src, dst):
            n = layer.name
            if isinstance(layer, L.BatchNorm2D) != isinstance(mod, nn.BatchNorm2d):
                raise ValueError(f"layer {n} ({type(layer).__name__}) meets PyTorch {type(mod).__name__}")
            if isinstance(layer, L.BatchNorm2D):
                for key, param in (("gamma", mod.weight), ("beta", mod.bias), ("running_mean", mod.running_mean),
                                   ("running_var", mod.running_var)):
                    put(param, f"{n}/{key}")
                mod.eps = layer.eps
            else:
                put(mod.weight, f"{n}/w")
                if f"{n}/b" in w:
                    put(mod.bias, f"{n}/b")
                elif mod.bias is not None:
                    mod.bias.zero_()
    return tmodel.to(device).eval()
