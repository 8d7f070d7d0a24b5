"""`Frozen`: objects whose attributes are set once, in `__init__`.

Losses and advantage estimators are configuration plus math: nothing about them changes after
construction. Making that a rule lets one instance be a default argument (`advantage=GRPO()`)
shared by every caller without one caller's change leaking into the others' defaults.
"""

from __future__ import annotations

from typing import Any


class Frozen:
    """Each attribute may be assigned once (in `__init__`); reassigning it raises AttributeError."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__:
            cls = type(self).__name__
            raise AttributeError(
                f"{cls}.{name} is read-only after construction (one instance may be a default shared by "
                f"many callers); build a new {cls}(..., {name}=...) instead"
            )
        object.__setattr__(self, name, value)
