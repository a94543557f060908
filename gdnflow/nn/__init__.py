"""Layers: modules holding parameters, each calling one operator."""
from gdnflow.nn.module import Module, Parameter
from gdnflow.nn.layers import (AvgPool2d, BatchNorm2d, Dropout, Flatten, GlobalAvgPool2d,
                              Identity, Linear, LogSoftmax, MaxPool2d, ReLU, ReLU6, Sequential,
                              Softmax)
from gdnflow.nn.gdn import GDN
from gdnflow.nn.conv import Conv2d, ConvTranspose2d, DepthwiseConv2d
