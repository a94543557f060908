"""``train``: one training run in a run folder that it owns from start to end."""
from pathlib import Path

from gdnflow.train.run_folder import RunExistsError, RunFolder
from gdnflow.train.stopping import StopSignals
from gdnflow.train.trainer import Trainer


def train(config, resume=None, force=False, log=print):
    """Train ``config``'s run in its folder ``config.out_dir``, owned for the whole run.

    The folder is checked, locked and prepared before the data is read (see
    :class:`~gdnflow.train.run_folder.RunFolder`): a folder holding a run is
    refused (RunExistsError) unless ``resume`` (True: its checkpoint; or a
    checkpoint's path) continues it or ``force`` moves it aside. A signal
    stops the run as :meth:`Trainer.run` says, or at once before training
    starts (RunStopped either way); the lock is released in every case.
    ``log`` prints the notices. Returns the Trainer.
    """
    if resume and force:
        raise ValueError("--resume continues the run in the folder and --force moves it aside: "
                         "pass one of them")
    config.check()
    with StopSignals(defer=False), \
            RunFolder(config.out_dir).owned("resume" if resume else "force" if force else "new") \
            as folder:
        trainer = Trainer(config)
        elsewhere = resume not in (None, True) and \
            Path(resume).resolve() != trainer.checkpoint_path().resolve()
        if elsewhere and folder.run_files():
            # Resuming rewrites the folder's histories and checkpoint: never another run's.
            raise RunExistsError(
                f"--out {folder.path} holds a run ({', '.join(folder.run_files())}) and "
                f"--resume {resume} is another run's checkpoint: continue it in an empty --out")
        if resume:
            path = None if resume is True else resume
            step = trainer.resume(path)
            log(f"resumed at step {step} from {path or trainer.checkpoint_path()}")
        trainer.run()
    return trainer


__all__ = ["train"]
