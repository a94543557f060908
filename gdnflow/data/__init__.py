"""Training data: image folders, random crops, and a background batch loader.

For example::

    data = ImageFolder("photos/", crop=256)          # or ImageFolder(None): sample photos
    with BackgroundLoader(lambda step: data.batch(seed, step, 16), start=0) as batches:
        for batch in batches:                         # float32 (16, 3, 256, 256) in [0, 1]
            ...
"""
from gdnflow.data.images import (IMAGE_EXTENSIONS, ImageFolder, ImageReadError,
                                 ImageTooLargeError, NoImagesError, image_size, list_images,
                                 load_image, open_image, pad_to_multiple, read_rgb8, sample_photos,
                                 shard_slice)
from gdnflow.data.loader import BackgroundLoader

__all__ = ["ImageFolder", "BackgroundLoader", "NoImagesError", "ImageReadError",
           "ImageTooLargeError", "IMAGE_EXTENSIONS", "load_image", "read_rgb8", "open_image",
           "image_size", "list_images", "pad_to_multiple", "sample_photos", "shard_slice"]
