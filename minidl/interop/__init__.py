"""Weights from other frameworks into minidl's models.

    from minidl import interop, models
    model = models.resnet(18, input_shape=(3, 224, 224), classes=1000, preprocess=False)
    interop.load_torchvision_resnet(model, "resnet18.pth")       # or torchvision's state_dict()
"""
from .torchvision_resnet import load_torchvision_resnet, torchvision_names

__all__ = ["load_torchvision_resnet", "torchvision_names"]
