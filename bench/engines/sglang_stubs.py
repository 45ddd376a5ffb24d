"""Import-only stand-ins for SGLang's heavy dependencies, so that its scheduler modules import and
run where only torch and numpy are installed (CI, and the GPU machine, where nothing downloads).

A stubbed package answers every attribute and submodule with a placeholder class: enough for
module-level imports, decorators and subclassing; the scheduler paths under test never call one.
msgspec is the exception: SGLang declares SamplingParams and its settings as msgspec Structs and
runs them, so `msgspec` here is a small dataclass-based equivalent of the parts SGLang uses (and
`regex` is the standard `re`, `dill` is `pickle`: module-level code calls them).

`installed()` puts the stand-ins in sys.modules while SGLang is imported and then restores what was
there, so that other tests importing the real packages (transformers, ...) are unaffected.
`import_sglang()` imports the scheduler modules that way; `SchedulerWorld` is a scheduler's memory
made of SGLang's own classes, for the tests and bench/sglang_host.py.
"""

import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import pickle
import re
import sys
import types
import warnings
from array import array

import torch

VERSION = "0.5.23"
# The wheel's files the scheduler modules import (a carried copy must hold at least these).
PREFIXES = ["sglang/srt/", "sglang/kernels/", "sglang/utils.py", "sglang/version.py", "sglang/_version.py"]

STUBBED = (
    "sglang.kernels.jit",  # JIT-compiled CUDA sources, kept beside the wheel's .py files
    "msgspec",
    "psutil",
    "zmq",
    "sgl_kernel",
    "flashinfer",
    "transformers",
    "orjson",
    "huggingface_hub",
    "pybase64",
    "partial_json_parser",
    "openai",
    "requests",
    "starlette",
    "pydantic",
    "pydantic_core",
    "torchvision",
    "IPython",
    "tqdm",
    "dill",
    "tvm_ffi",
    "sentencepiece",
    "safetensors",
    "compressed_tensors",
    "regex",
    "gguf",
)


class _PlaceholderMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(name)

    def __getitem__(cls, item):
        return cls

    def __setitem__(cls, item, value):
        pass

    def __or__(cls, other):
        return cls

    __ror__ = __or__


class _Placeholder(metaclass=_PlaceholderMeta):
    def __init_subclass__(cls, **options):
        pass

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Placeholder()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(name)


def _placeholder(name):
    return _PlaceholderMeta(name, (_Placeholder,), {})


# ---------------------------------------------------------------------------------------- msgspec


def _default(value):
    """msgspec copies a mutable default per instance; dataclasses want a factory for that."""
    if isinstance(value, (list, dict, set)) and not value:
        return dataclasses.field(default_factory=type(value))
    if isinstance(value, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(value)(value))
    return value


def _as_dataclass(cls, frozen=False, kw_only=False):
    for name in cls.__dict__.get("__annotations__", {}):
        if name in cls.__dict__:
            setattr(cls, name, _default(cls.__dict__[name]))
    dataclasses.dataclass(cls, frozen=frozen, kw_only=kw_only)
    cls.__struct_fields__ = tuple(f.name for f in dataclasses.fields(cls))
    return cls


class _Struct:
    def __init_subclass__(cls, frozen=False, kw_only=False, **options):
        _as_dataclass(cls, frozen, kw_only)


def _field(*, default=dataclasses.MISSING, default_factory=dataclasses.MISSING, name=None):
    return dataclasses.field(default=default, default_factory=default_factory)


def _defstruct(name, fields, *, bases=None, module=None, namespace=None, frozen=False, **options):
    spec = [
        f
        if isinstance(f, str) or len(f) < 3 or isinstance(f[2], dataclasses.Field)
        else (
            f[0],
            f[1],
            dataclasses.field(default=f[2]) if not isinstance(_default(f[2]), dataclasses.Field) else _default(f[2]),
        )
        for f in fields
    ]
    namespace = {k: v for k, v in (namespace or {}).items() if k != "__init_subclass__"}
    cls = dataclasses.make_dataclass(name, spec, bases=tuple(bases or ()), namespace=namespace, kw_only=True)
    if module is not None:
        cls.__module__ = module
    return _as_dataclass(cls, frozen, kw_only=True)


_BEHAVING = {
    "msgspec": {
        "Struct": _Struct,
        "field": _field,
        "defstruct": _defstruct,
        "NODEFAULT": dataclasses.MISSING,
        "UNSET": dataclasses.MISSING,
    },
    "msgspec.structs": {
        "fields": dataclasses.fields,
        "replace": dataclasses.replace,
        "asdict": lambda obj: {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)},
        "force_setattr": object.__setattr__,
    },
    # Module-level code pickles a class by reference and compiles patterns.
    "dill": {"dumps": pickle.dumps, "loads": pickle.loads},
    "regex": {k: v for k, v in vars(re).items() if not k.startswith("_")},
}


# ---------------------------------------------------------------------------------------- finder


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(name)
        setattr(self, name, value)
        return value


def _is_stubbed(fullname):
    return any(fullname == name or fullname.startswith(name + ".") for name in STUBBED)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if _is_stubbed(fullname):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__dict__.update(_BEHAVING.get(spec.name, {}))
        return module

    def exec_module(self, module):
        pass


@contextlib.contextmanager
def installed():
    """The stand-ins in sys.modules for the duration of the block (SGLang's imports)."""
    saved = {name: mod for name, mod in sys.modules.items() if _is_stubbed(name)}
    for name in saved:
        del sys.modules[name]
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if _is_stubbed(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


# ---------------------------------------------------------------------------------------- SGLang


def import_sglang(root):
    """SGLang's scheduler modules from the source folder `root` (see source.py), imported
    with the stand-ins above, with default server settings published (as a scheduler process does
    at start). Returns a namespace of the modules and classes the tests and benchmark use."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    with installed(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platform notices about quantization kernels
        from sglang.srt.layers import logits_processor
        from sglang.srt.managers import overlap_utils, schedule_batch
        from sglang.srt.mem_cache import allocation, base_prefix_cache, memory_pool, radix_cache
        from sglang.srt.mem_cache.allocator import token
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.runtime_context import get_context
        from sglang.srt.sampling import sampling_batch_info, sampling_params
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    context = get_context()
    if not context.is_config_namespace_published("exec"):
        context.set_server_args(ServerArgs(model_path="pinstage-test", device="cpu"))
    return types.SimpleNamespace(
        schedule_batch=schedule_batch,
        sampling_batch_info=sampling_batch_info,
        allocation=allocation,
        logits_processor=logits_processor,
        overlap_utils=overlap_utils,
        ScheduleBatch=schedule_batch.ScheduleBatch,
        Req=schedule_batch.Req,
        SamplingParams=sampling_params.SamplingParams,
        SamplingBatchInfo=sampling_batch_info.SamplingBatchInfo,
        ReqToTokenPool=memory_pool.ReqToTokenPool,
        TokenToKVPoolAllocator=token.TokenToKVPoolAllocator,
        RadixCache=radix_cache.RadixCache,
        RadixKey=radix_cache.RadixKey,
        InsertParams=base_prefix_cache.InsertParams,
        CacheInitParams=CacheInitParams,
        ForwardMode=ForwardMode,
        SpeculativeAlgorithm=SpeculativeAlgorithm,
        LogitsProcessor=logits_processor.LogitsProcessor,
    )


def logits_metadata(sg, batch):
    """What LogitsProcessor._get_pruned_states reads of a prefill with input logprobs, from the
    batch's extend lengths (a ForwardBatch's LogitsMetadata carries the same lists)."""
    return types.SimpleNamespace(
        forward_mode=sg.ForwardMode.EXTEND,
        extend_return_logprob=True,
        extend_seq_lens_cpu=batch.extend_lens,
        extend_logprob_start_lens_cpu=batch.extend_logprob_start_lens,
    )


class SchedulerWorld:
    """The memory a scheduler owns, made of SGLang's own classes on one device: the request-to-token
    table, the KV slot allocator and the radix prefix cache (page size 1)."""

    EOS = 2

    def __init__(self, sg, device, rows=2048, max_context_len=256, kv_slots=1 << 17, vocab_size=1024):
        self.sg = sg
        self.device = device
        self.pool = sg.ReqToTokenPool(rows, max_context_len, device, False)
        self.allocator = sg.TokenToKVPoolAllocator(kv_slots, torch.int64, device, None, False)
        self.tree = sg.RadixCache(
            sg.CacheInitParams(
                disable=False, req_to_token_pool=self.pool, token_to_kv_pool_allocator=self.allocator, page_size=1
            )
        )
        self.model_config = types.SimpleNamespace(vocab_size=vocab_size, is_encoder_decoder=False)
        self.vocab_size = vocab_size
        self.tokenizer = types.SimpleNamespace(eos_token_id=self.EOS, additional_stop_token_ids=None)
        self._rids = 0

    def cache_prompt(self, token_ids):
        """Puts a finished prompt's KV slots in the prefix cache, so that later prompts hit it."""
        slots = self.allocator.alloc(len(token_ids))
        self.tree.insert(self.sg.InsertParams(key=self.sg.RadixKey(array("q", token_ids)), value=slots))

    def request(self, token_ids, params, return_logprob=False, logprob_start_len=-1):
        """A new SGLang Req with SamplingParams(**params), checked as SGLang checks them."""
        sampling = self.sg.SamplingParams(**params)
        sampling.verify(self.vocab_size)
        self._rids += 1
        req = self.sg.Req(
            f"r{self._rids}",
            "",
            array("q", token_ids),
            sampling,
            return_logprob=return_logprob,
            vocab_size=self.vocab_size,
            eos_token_ids={self.EOS},
        )
        req.tokenizer = self.tokenizer  # the min-new-tokens penalty reads its stop tokens
        if return_logprob:
            req.logprob_start_len = logprob_start_len
        return req

    def admit(self, req, chunk=None):
        """Matches a waiting request against the prefix cache and sets how far this round extends it
        (at most `chunk` tokens: chunked prefill), as the scheduler's admission does."""
        req.init_next_round_input(self.tree)
        self.extend_to(req, chunk)

    @staticmethod
    def extend_to(req, chunk=None):
        full = len(req.full_untruncated_fill_ids)
        req.extend_end = full if chunk is None else min(full, req.prefix_len + chunk)

    def prefill_batch(self, reqs):
        """ScheduleBatch.init_new + prepare_for_extend over admitted requests."""
        batch = self.sg.ScheduleBatch.init_new(
            reqs, self.pool, self.allocator, self.tree, self.model_config, False, self.sg.SpeculativeAlgorithm.NONE
        )
        batch.prepare_for_extend()
        return batch


def write_carried_copy(root, dest):
    """Copies into `dest`, marked complete, the .py files of every folder of `root` from which
    importing SGLang's scheduler modules loads a module (whole folders: on a GPU, SGLang imports a
    few other siblings), and the package metadata: the folder to carry to a machine without a
    package index (source.engine_root finds it at .engines/<name>-<version>)."""
    import pathlib
    import shutil

    from . import source

    root, dest = pathlib.Path(root).resolve(), pathlib.Path(dest)
    import_sglang(root)
    loaded = {pathlib.Path(m.__file__).resolve() for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    folders = {f.parent for f in loaded if f.is_relative_to(root)}
    files = {f for folder in folders for f in folder.glob("*.py")} | set(root.glob("*.dist-info/METADATA"))
    shutil.rmtree(dest, ignore_errors=True)
    for file in files:
        target = dest / file.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, target)
    (dest / source._COMPLETE).write_text(f"subset of {root}: {len(files)} files\n")
    return len(files), sum(f.stat().st_size for f in files)


if __name__ == "__main__":
    # python -m bench.engines.sglang_stubs: the SGLang subset the tests import, into .engines/ for the GPU machine
    import shutil

    from .source import REPO, engine_root

    folder = f"sglang-{VERSION}"
    shutil.rmtree(REPO / ".engines" / folder, ignore_errors=True)  # else engine_root would offer it as the source
    count, size = write_carried_copy(engine_root("sglang", VERSION, PREFIXES), REPO / ".engines" / folder)
    print(f".engines/{folder}: {count} files, {size / 2**20:.1f} MiB")
