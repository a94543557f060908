"""gdnflow's version, in one place: ``gdnflow.__version__`` and the files gdnflow writes
(a checkpoint's ``gdnflow_version``) read it from here. Imports nothing."""
#: gdnflow's version number.
__version__ = "0.1.0"
