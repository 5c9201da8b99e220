"""The exceptions elastic training turns on, where Horovod keeps them
(horovod.common.exceptions)."""
from hora._lib import HoraInternalError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]

# A failed collective: elastic training restores the last commit and resets.
HorovodInternalError = HoraInternalError


class HostsUpdatedInterrupt(RuntimeError):
    """Raised together on every rank at a commit point when the membership is
    to change (processes wait to join): elastic training resets without
    restoring, and syncs the state unless skip_sync."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's membership changes at this commit point"
                         + (" (no state sync needed)" if skip_sync else ""))
        self.skip_sync = skip_sync
