"""pinstage inside SGLang: its per-step host-to-device tensors on the scheduler's path through
pinstage's ring, with every SGLang output unchanged.

    from pinstage.integrations import sglang as pinstage_sglang
    pinstage_sglang.enable()          # in the scheduler process, before it builds batches
    with pinstage_sglang.enabled():   # or for a block
        ...

SGLang starts its scheduler in processes of its own: PINSTAGE_SGLANG=1 in the environment it starts
in enables the integration in each of them (pinstage-sglang.pth and _pinstage_hook; docs/integrations.md).

What changes while enabled (SGLang 0.5.23):
- SamplingBatchInfo.from_schedule_batch: the sampling tensors in one stage_many (pinstage's own
  implementation; batches with logit bias, custom logit processors, sampling masks or watermarks
  are left to SGLang's), and its _rows_to_device_indices helper;
- mem_cache.allocation.write_cache_indices: pinstage's cache-index kernel;
- ScheduleBatch.prepare_for_extend, filter_batch and cumulate_penalty_output_tokens (the penalty
  last-token ids of prepare_for_decode) and LogitsProcessor._get_pruned_states (sample and logprob
  indices): SGLang's own code with each pinned tensor + non_blocking copy replaced by
  pinstage.stage_to_device (see _sglang_sites).
disable() puts every original back. Importing pinstage never imports SGLang; this module does.
"""

import contextlib
import importlib
import importlib.metadata
import threading

from ._patches import Patches
from ._sglang_cache import make_write_cache_indices
from ._sglang_sampling import make_from_schedule_batch, rows_to_device_indices
from ._sglang_sites import with_staged_copies

TESTED_VERSIONS = ("0.5.23",)

# (module, class or None, attribute, host-to-device expressions rewritten in place)
_REWRITTEN = (
    ("sglang.srt.managers.schedule_batch", "ScheduleBatch", "prepare_for_extend", 5),
    ("sglang.srt.managers.schedule_batch", "ScheduleBatch", "filter_batch", 1),
    ("sglang.srt.managers.schedule_batch", "ScheduleBatch", "cumulate_penalty_output_tokens", 1),
    ("sglang.srt.layers.logits_processor", "LogitsProcessor", "_get_pruned_states", 2),
)
_SAMPLING_BATCH_INFO = "sglang.srt.sampling.sampling_batch_info"
_ALLOCATION = "sglang.srt.mem_cache.allocation"
_POOL = "sglang.srt.mem_cache.memory_pool"

_lock = threading.Lock()
_patches = Patches()


def installed_version():
    """The installed SGLang's version (from its package metadata), or None."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def is_enabled():
    return bool(_patches)


def enable():
    """Routes SGLang's per-step staging through pinstage. Raises RuntimeError naming the tested
    versions when the installed SGLang is another one (or missing); a second call does nothing."""
    with _lock:
        if _patches:
            return
        version = installed_version()
        # A local build tag (0.5.23+cu130) leaves the released source as it was.
        if version is None or version.split("+")[0] not in TESTED_VERSIONS:
            found = "is not installed" if version is None else f"is version {version}"
            raise RuntimeError(
                f"pinstage.integrations.sglang was tested with SGLang {', '.join(TESTED_VERSIONS)} only; SGLang {found}"
            )
        patches = _replacements()  # everything built before anything is replaced
        for owner, attribute, replacement in patches:
            _patches.replace(owner, attribute, replacement)


def disable():
    """Puts back every SGLang function that enable() replaced, except where other code has
    replaced pinstage's function since (that wrapper stays). Harmless when not enabled."""
    with _lock:
        _patches.restore()


@contextlib.contextmanager
def enabled():
    """enable() for the block, then disable() (unless it was enabled before the block)."""
    was_enabled = is_enabled()
    enable()
    try:
        yield
    finally:
        if not was_enabled:
            disable()


def _replacements():
    """[(owner, attribute, replacement)] for the tested SGLang; owners are classes or modules."""
    out = []
    for module_name, class_name, attribute, sites in _REWRITTEN:
        owner = getattr(importlib.import_module(module_name), class_name)
        out.append((owner, attribute, with_staged_copies(owner.__dict__[attribute], sites)))

    sampling = importlib.import_module(_SAMPLING_BATCH_INFO)
    info = sampling.SamplingBatchInfo
    out.append(
        (info, "from_schedule_batch", make_from_schedule_batch(info.__dict__["from_schedule_batch"].__func__, sampling))
    )
    out.append((sampling, "_rows_to_device_indices", rows_to_device_indices))

    allocation = importlib.import_module(_ALLOCATION)
    table_write = importlib.import_module(_POOL).ReqToTokenPool.write
    replacement = make_write_cache_indices(allocation.write_cache_indices, table_write)
    out.append((allocation, "write_cache_indices", replacement))
    return out
