"""The codec's latents quantised and dequantised on the GPU (``cuda_src/codec_latents.cu``).

On a GPU codec whose image is one tile, the analysis's y stays on the device:
it is quantised there and only the integer latents come back, and the decoded
latents go up as integers and become y_hat there, which the synthesis reads
in place. On the host those two steps cost more than the transforms (a
2048x1536 photo: about 13 ms to quantise y and 8 ms to make y_hat, on the
H200 host). The values are :func:`~gdnflow.codec.codec.quantize_latents` and
the host's y_hat, bit for bit (the kernel file says why).
"""
import numpy as np

from gdnflow.backends import cuda
from gdnflow.codec.format import MAX_SYMBOL, CodecError
from gdnflow.tensor import Tensor

SOURCE = "codec_latents.cu"


def _medians(medians, channels, what):
    medians = np.ascontiguousarray(medians, np.float32)
    if medians.shape != (channels,):
        raise ValueError(f"{what}: {channels} channels and {medians.shape[0]} medians")
    return cuda.get_runtime().from_numpy(medians)


def quantize_on_device(y, medians):
    """q int32 (C, h, w) on the host: round(y - medians[c]) of the cuda tensor y (1, C, h, w),
    half to even; CodecError (as the host's) for a value beyond +-MAX_SYMBOL or not finite."""
    _, channels, height, width = y.shape
    if y.dtype != np.float32:
        raise ValueError(f"quantize_on_device: y must be float32, got {y.dtype}")
    runtime = cuda.get_runtime()
    device_medians = _medians(medians, channels, "quantize_on_device")
    q = runtime.empty((channels, height, width), np.int32)
    flag = runtime.from_numpy(np.zeros(1, np.int32))
    cuda.kernel(SOURCE, "quantize_latents", "PPiifPP").launch(
        q.size, y.data.ptr, device_medians.ptr, q.size, height * width, float(MAX_SYMBOL),
        q.ptr, flag.ptr)
    if runtime.to_numpy(flag)[0]:
        raise CodecError(f"latent values beyond +-{MAX_SYMBOL} or not finite (a diverged "
                         "model?): nothing to code")
    return runtime.to_numpy(q)


def dequantized_on_device(q, medians):
    """y_hat (1, C, h, w) float32 cuda Tensor: q + medians[c] of the integer latents q
    (C, h, w), a host array or an int32 device array."""
    channels, height, width = q.shape
    runtime = cuda.get_runtime()
    device_q = q if hasattr(q, "ptr") else runtime.from_numpy(np.ascontiguousarray(q, np.int32))
    device_medians = _medians(medians, channels, "dequantized_on_device")
    y_hat = runtime.empty((1, channels, height, width), np.float32)
    cuda.kernel(SOURCE, "dequantize_latents", "PPiiP").launch(
        y_hat.size, device_q.ptr, device_medians.ptr, y_hat.size, height * width, y_hat.ptr)
    return Tensor.wrap(y_hat, "cuda")
