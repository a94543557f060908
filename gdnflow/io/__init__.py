"""Reading and writing: checkpoints (HDF5, through h5py)."""
from gdnflow.io.checkpoint import (CheckpointError, load_checkpoint, read_checkpoint_info,
                                   save_checkpoint)

__all__ = ["save_checkpoint", "load_checkpoint", "read_checkpoint_info", "CheckpointError"]
