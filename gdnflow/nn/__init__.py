"""Layers: modules holding parameters, each calling one operator."""
from gdnflow.nn.module import Module, Parameter
