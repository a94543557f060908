"""The GPU algorithms of conv2d and conv_transpose2d, offered to
:class:`~gdnflow.ops.conv.planning.ConvPlanner` (see :mod:`gdnflow.ops.conv`)."""
