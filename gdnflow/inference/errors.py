"""The errors of inference plans."""
from gdnflow.errors import GdnflowError


class PlanError(GdnflowError, RuntimeError):
    """An inference plan could not be built, or did not reproduce the model."""


class StalePlanError(PlanError):
    """A plan was called after the weights it was built from changed."""
