"""Raise each kind of error the extension produces, one per process, to locate crashes on a new
toolchain: python bench/error_probe.py CASE (prints 'raised <type>' and exits 0 on success)."""
import sys

import torch

import pinstage
from pinstage import _C

CASES = {
    "python_fallback_error": lambda: pinstage.stage_to_device([1, 300], torch.uint8, device="cpu"),
    "c10_value_error": lambda: pinstage.configure(on_full="bogus"),
    "c10_type_error": lambda: pinstage.stage_to_device([1], torch.complex64, device="cpu"),
    "cache_index_error": lambda: _C.cache_index_plan(
        torch.zeros(2, 4, dtype=torch.int32), [10], [torch.zeros(1, dtype=torch.int64)], [0], [1], [1],
        torch.zeros(1, dtype=torch.int64)),
    "cuda_fallback_error": lambda: pinstage.stage_to_device([1, 300], torch.uint8),
}

if __name__ == "__main__":
    try:
        CASES[sys.argv[1]]()
    except Exception as exc:  # the point: report what was raised
        print("raised", type(exc).__name__, str(exc)[:120])
        sys.exit(0)
    print("nothing raised")
    sys.exit(1)
