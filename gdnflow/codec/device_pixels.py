"""The codec's 8-bit pixels to and from float32 on the GPU (``cuda_src/codec_pixels.cu``).

On a GPU codec the conversions between the uint8 image and the transforms'
float32 pixels cost more on the host than the transforms do on the device (a
2048x1536 photo: about 90 ms to gather, convert and upload float32 tiles, about
55 ms for :func:`~gdnflow.codec.codec.to_uint8`, against about 10 ms of g_a).
Here the uint8 image goes up once (a large image's tiles one by one) and each
tile is gathered and converted on the device; the synthesis's float32 pixels
are rounded there and come back as uint8.
The values are those of :func:`~gdnflow.codec.codec.image_to_array` and
:func:`~gdnflow.codec.codec.to_uint8`, bit for bit (the kernel file says why).
"""
import numpy as np

from gdnflow.backends import cuda
from gdnflow.tensor import Tensor

SOURCE = "codec_pixels.cu"


class DeviceImage:
    """A uint8 (H, W, 3) image on the GPU, from which float32 tiles are gathered.

    ``DeviceImage(image)`` uploads it once; :meth:`tile` gives the float32
    (1, 3, h, w) tensor of rows x columns (source indices, so that a
    reflection padding is an index pattern).
    """

    def __init__(self, image):
        self.width = image.shape[1]
        self.data = cuda.get_runtime().from_numpy(np.ascontiguousarray(image))

    def tile(self, rows, columns):
        """float32 (1, 3, len(rows), len(columns)) cuda Tensor: image[rows][:, columns] / 255,
        channels first."""
        runtime = cuda.get_runtime()
        rows, columns = (runtime.from_numpy(np.ascontiguousarray(v, np.int32))
                         for v in (rows, columns))
        x = runtime.empty((1, 3, rows.size, columns.size), np.float32)
        cuda.kernel(SOURCE, "unit_pixels", "PPPPiii").launch(
            x.size, self.data.ptr, rows.ptr, columns.ptr, x.ptr, rows.size, columns.size,
            self.width)
        return Tensor.wrap(x, "cuda")


def uint8_pixels(x, top, left, height, width):
    """uint8 (height, width, 3) of the cuda tensor x (1, 3, H, W) from (top, left):
    :func:`~gdnflow.codec.codec.to_uint8` of that crop, computed on the GPU."""
    _, channels, full_height, full_width = x.shape
    if x.dtype != np.float32:
        raise ValueError(f"uint8_pixels: the pixels must be float32, got {x.dtype}")
    if channels != 3 or not (0 <= top and top + height <= full_height and 0 <= left
                             and left + width <= full_width):
        raise ValueError(f"uint8_pixels: a {height}x{width} crop at ({top}, {left}) of "
                         f"pixels of shape {x.shape}")
    runtime = cuda.get_runtime()
    out = runtime.empty((height, width, 3), np.uint8)
    cuda.kernel(SOURCE, "uint8_pixels", "PPiiiiii").launch(
        out.size, x.data.ptr, out.ptr, full_height, full_width, top, left, height, width)
    return runtime.to_numpy(out)
