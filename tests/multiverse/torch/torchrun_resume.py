"""The restart law's universe run by torchrun: ``python -m torch.distributed.run
--max-restarts 1 ... -m tests.multiverse.torch.torchrun_resume FOLDER STEPS EVERY KILL_AT``.

Multiverse joins torchrun's run; rank 0 saves the final parameters to FOLDER/params.npz.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from dualtrain import Multiverse
from tests.multiverse.torch import restart_universes as ru

if __name__ == "__main__":
    folder, steps, every, kill_at = sys.argv[1], *map(int, sys.argv[2:5])
    result = Multiverse(ru.resumes, 2)(folder, steps, every, kill_at)
    if result is not None:
        np.savez(Path(folder) / "params.npz", restarts=result["restarts"], **result["params"])
