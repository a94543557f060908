"""``train``: one training run in a run folder that it owns from start to end, in one process
or in each rank of a data-parallel run (:mod:`gdnflow.train.distributed_run`)."""
import contextlib
from pathlib import Path

from gdnflow import distributed as dist
from gdnflow.io.checkpoint import read_checkpoint_info
from gdnflow.train.distributed_run import DistributedTrainer, quiet_unless
from gdnflow.train.run_folder import RunExistsError, RunFolder
from gdnflow.train.stopping import StopSignals
from gdnflow.train.trainer import Trainer

#: The quick look on a CPU that examples/train_gdn_autoencoder.py suggests.
CPU_SIZE = "--N 16 --M 24 --crop 64 --batch-size 4 --lr 1e-3"


def cpu_hint(config, device):
    """A one-line hint when a run of ``config``'s size on ``device`` would be very slow, else None.

    On NumPy a step costs in proportion to batch x crop^2 x N; past 8 times the
    CPU_SIZE run (about 0.5 s a step on two cores) the hint names that size.
    """
    if device != "numpy" or config.batch_size * config.crop ** 2 * config.N <= 8 * 4 * 64 ** 2 * 16:
        return None
    return (f"note: training on NumPy (no usable GPU): N={config.N} with {config.batch_size} "
            f"crops of {config.crop}x{config.crop} takes seconds to minutes a step on a CPU; for a "
            f"quick look try {CPU_SIZE}")


def check_initial_weights(config, force):
    """Raise unless ``config.init`` is a readable checkpoint that survives the folder's
    preparation (--force moves the run in ``config.out_dir`` aside, with any file in it)."""
    init, out_dir = Path(config.init).resolve(), Path(config.out_dir).resolve()
    if force and out_dir in init.parents:
        raise ValueError(f"--init {config.init} is in --out {config.out_dir}, which --force "
                         "moves aside: copy it out of the folder first")
    if not init.is_file():
        raise FileNotFoundError(f"--init {config.init}: no such file")
    read_checkpoint_info(init)      # CheckpointError naming the file


def train(config, resume=None, force=False, log=print):
    """Train ``config``'s run in its folder ``config.out_dir``, owned for the whole run.

    The folder is checked, locked and prepared before the data is read (see
    :class:`~gdnflow.train.run_folder.RunFolder`): a folder holding a run is
    refused (RunExistsError) unless ``resume`` (True: its checkpoint; or a
    checkpoint's path) continues it or ``force`` moves it aside. ``config.init``
    (fine-tuning) is checked first: it must be readable and not inside the folder
    ``force`` moves, and it is refused with ``resume``. A signal
    stops the run as :meth:`Trainer.run` says, or at once before training
    starts (RunStopped either way); the lock is released in every case.
    ``log`` prints the notices. Returns the Trainer.

    Launched as several ranks (:func:`gdnflow.distributed.init`), each runs
    a :class:`DistributedTrainer`; only rank 0 owns the folder and speaks.
    """
    if resume and force:
        raise ValueError("--resume continues the run in the folder and --force moves it aside: "
                         "pass one of them")
    if resume and config.init is not None:
        raise ValueError("--init starts a new run from other weights and --resume continues "
                         "the run in the folder (from the weights its checkpoint holds): pass "
                         "one of them")
    config.check()
    if config.init is not None:
        check_initial_weights(config, force)
    world = dist.init()         # before any CUDA tensor: it picks this rank's GPU
    lead = world.rank == 0
    mode = "resume" if resume else "force" if force else "new"
    with StopSignals(defer=False), quiet_unless(lead), \
            (RunFolder(config.out_dir).owned(mode) if lead else contextlib.nullcontext()) as folder:
        trainer = DistributedTrainer(config, world) if world.size > 1 else Trainer(config)
        hint = cpu_hint(config, trainer.device)
        if hint:
            log(hint)
        elsewhere = resume not in (None, True) and \
            Path(resume).resolve() != trainer.checkpoint_path().resolve()
        if elsewhere and lead and folder.run_files():
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
