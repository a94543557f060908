"""The error of gdnflow.distributed."""
from gdnflow.errors import GdnflowError


class DistributedError(GdnflowError, RuntimeError):
    """A collective failed: ranks disagree, a peer raised, died or did not answer in time.

    ``failed_rank`` is the rank the error is about (None when unknown);
    ``from_peer`` is true when this process learnt of the failure from
    another rank (it then does not report it further).
    """

    def __init__(self, message, failed_rank=None, from_peer=False):
        super().__init__(message)
        self.failed_rank = failed_rank
        self.from_peer = from_peer
