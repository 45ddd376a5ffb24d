"""PINSTAGE_SGLANG=1: pinstage's SGLang integration in every process SGLang starts.

pinstage-sglang.pth (installed beside pinstage in site-packages) runs install() at interpreter start
where PINSTAGE_SGLANG is set to anything but 0; otherwise nothing is imported. install() watches the
imports: once every SGLang module that the integration patches has been imported (SGLang's scheduler
process imports them all), it calls pinstage.integrations.sglang.enable() there. So the scheduler
children that SGLang spawns enable it themselves, which an enable() in the launching process cannot
do. This module imports neither torch nor pinstage until then.
"""

import importlib.abc
import os
import sys
import warnings

SWITCH = "PINSTAGE_SGLANG"
# The modules pinstage.integrations.sglang patches (a test keeps this list equal to its own).
MODULES = frozenset(
    (
        "sglang.srt.managers.schedule_batch",
        "sglang.srt.layers.logits_processor",
        "sglang.srt.sampling.sampling_batch_info",
        "sglang.srt.mem_cache.allocation",
        "sglang.srt.mem_cache.memory_pool",
    )
)


def switched_on():
    return os.environ.get(SWITCH, "").strip().lower() not in ("", "0", "off", "false", "no")


class _Loaded:
    """A module's own loader; once the module has run, tells the watcher."""

    def __init__(self, loader, watcher):
        self._loader, self._watcher = loader, watcher

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader  # as if never watched
        self._loader.exec_module(module)
        self._watcher.loaded(module.__name__)


class _Watcher(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.pending = set(MODULES)

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loaded(spec.loader, self)
                return spec
        return None

    def loaded(self, name):
        self.pending.discard(name)
        if self.pending:
            return
        sys.meta_path.remove(self)
        try:
            from pinstage.integrations import sglang

            sglang.enable()
        except Exception as exc:  # SGLang runs as shipped rather than not at all
            warnings.warn(
                "%s is set but pinstage's SGLang integration stays off: %s" % (SWITCH, exc),
                RuntimeWarning,
                stacklevel=2,
            )


def install():
    """Watches for SGLang's modules in this process (once)."""
    if not any(isinstance(finder, _Watcher) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Watcher())
