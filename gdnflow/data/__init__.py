"""Training data: image folders, random crops, and a background batch loader.

For example::

    data = ImageFolder("photos/", crop=256)          # or ImageFolder(None): sample photos
    vary = Augmentation(flip="horizontal", scale_range=(0.25, 1.0))
    with BackgroundLoader(lambda step: data.batch(seed, step, 16, augmentation=vary),
                          start=0) as batches:
        for batch in batches:                         # float32 (16, 3, 256, 256) in [0, 1]
            ...
"""
from gdnflow.data.augment import Augmentation
from gdnflow.data.images import (IMAGE_EXTENSIONS, CropPlan, ImageFolder, ImageReadError,
                                 ImageTooLargeError, NoImagesError, image_size, list_images,
                                 load_image, open_image, pad_to_multiple, read_rgb8, sample_photos,
                                 shard_slice)
from gdnflow.data.loader import BackgroundLoader

__all__ = ["ImageFolder", "Augmentation", "CropPlan", "BackgroundLoader", "NoImagesError",
           "ImageReadError", "ImageTooLargeError", "IMAGE_EXTENSIONS", "load_image", "read_rgb8",
           "open_image", "image_size", "list_images", "pad_to_multiple", "sample_photos",
           "shard_slice"]
