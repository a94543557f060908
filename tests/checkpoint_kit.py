"""Helpers of tests that need checkpoints as older gdnflow versions wrote them."""
import json

import h5py


def drop_train_config_fields(path, *fields):
    """Remove ``fields`` from the training configuration recorded in checkpoint ``path``
    (in place), as a checkpoint written before those fields existed has it."""
    with h5py.File(path, "r+") as f:
        for key, value in f.attrs.items():
            if isinstance(value, str) and '"train_config"' in value:
                record = json.loads(value)
                for field in fields:
                    record["train_config"].pop(field)
                f.attrs[key] = json.dumps(record)
