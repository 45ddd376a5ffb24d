"""The attributes an integration replaced, and how they go back.

restore() puts an original back only where pinstage's replacement is still in place: a wrapper that
other code installed over a replaced function after enable() stays where it is.
"""

import sys
import types
from typing import Any, List, Tuple


def _modules():
    return [module for module in list(sys.modules.values()) if isinstance(module, types.ModuleType)]


class Patches:
    def __init__(self) -> None:
        self._made: List[Tuple[Any, str, Any, Any]] = []  # (holder, name, original, replacement), in order

    def __bool__(self):
        return bool(self._made)

    def replace(self, owner, name, replacement, importers=False):
        """owner.name = replacement. With importers (owner a module): also in every loaded module
        that holds owner's original under that name (`from owner import name`)."""
        original = owner.__dict__[name]
        holders = [owner]
        if importers:
            holders += [module for module in _modules() if module is not owner and vars(module).get(name) is original]
        for holder in holders:
            self._made.append((holder, name, original, replacement))
            setattr(holder, name, replacement)

    def restore(self):
        """Puts every original back where its replacement still is, also in modules that took a
        replacement by name after it was made; leaves alone what others installed since."""
        made, self._made = self._made, []
        back = {id(replacement): (replacement, original) for _, _, original, replacement in made}
        names = {name for _, name, _, _ in made}
        for module in _modules():
            for name in names:
                held = vars(module).get(name)
                entry = back.get(id(held))
                if entry is not None and entry[0] is held:
                    setattr(module, name, entry[1])
        for holder, name, original, replacement in reversed(made):
            if holder.__dict__.get(name) is replacement:
                setattr(holder, name, original)
