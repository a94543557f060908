"""The error of ``gdnflow classify``, ``convert`` and ``info FILE``."""
from gdnflow.errors import GdnflowError


class ClassifyError(GdnflowError, ValueError):
    """Something the user can fix (a file, an option); the message names it."""
