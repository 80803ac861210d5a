"""nebulgym's ``model_engines.utils``: its recursion guard, which dualtrain does not need.

nebulgym replaced a decorated class's ``__call__``, so compiling the model called back into
the decorator; ``CallMethodFixingEnvRunner`` unset the ``_nebulgym_backend`` attribute
(``ATTRIBUTE_NAME``) meanwhile. dualtrain replaces only the instance's ``forward``, so both
names raise `RetiredError` saying so.
"""

from __future__ import annotations

from typing import Any

from dualtrain.compat.retired import retire

__all__: list[str] = []

_WHY = (
    "nebulgym's guard against its decorator calling itself; dualtrain's decorator replaces "
    "only each instance's forward (nn.Module.__call__ still runs), so nothing recurses: call "
    "the model, or read model.forward.explain()"
)
_RETIRED = {"CallMethodFixingEnvRunner": _WHY, "ATTRIBUTE_NAME": _WHY}


def __getattr__(name: str) -> Any:
    retire(__name__, name, _RETIRED)
