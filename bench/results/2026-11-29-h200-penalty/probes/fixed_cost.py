import os, sys, statistics, time, random
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch
from torch.utils.cpp_extension import load
ext = load("launch_exp", [os.path.join(ROOT, "scratch/launch_exp.cu")], extra_cuda_cflags=["-O3", "-arch=sm_90"], verbose=False)
import pinstage
from pinstage import _C
from pinstage.builders import Request, build_penalty_last_token_ids
dst = torch.zeros(32768, dtype=torch.uint8, device="cuda")
pinned = torch.randint(0, 255, (64 * 4096 + 32768,), dtype=torch.uint8).pin_memory()
cpp = ["memcpy", "memcpy_event", "is_capturing", "guard", "current_stream", "alloc", "alloc_wrap", "event_query", "get_device"]
for _ in range(1):
    res = {}
    for v in cpp:
        res[v] = statistics.median(ext.run(v, 64, 2000, dst, pinned) for _ in range(7)) / 1e3
    torch.cuda.synchronize()
    print("C++ us/op:", "  ".join(f"{k} {v:.3f}" for k, v in res.items()), flush=True)

reqs1 = [Request([1, 2, 3], [7], req_pool_idx=0)]
rng = random.Random(0)
reqs256 = [Request([rng.randrange(1 << 17) for _ in range(rng.randint(16, 64))],
                   [rng.randrange(1 << 17) for _ in range(rng.randint(1, 32))], req_pool_idx=i) for i in range(256)]
data16 = list(range(16)); out16 = torch.empty(16, dtype=torch.int64, device="cuda")
stream = torch.cuda.current_stream()
calls = {
    "noop_py": lambda: None,
    "ext_noop_memcpy0": lambda: ext.run("get_device", 0, 1, dst, pinned),
    "stage_into16": lambda: pinstage.stage_into(data16, out16),
    "stage_to_device1": lambda: pinstage.stage_to_device([5], torch.int64),
    "stage_to_device1_dev": lambda: pinstage.stage_to_device([5], torch.int64, device="cuda"),
    "stage_to_device16": lambda: pinstage.stage_to_device(data16, torch.int64),
    "C_decode1_none": lambda: _C._stage_last_token_ids(reqs1, None, None),
    "C_decode1_cuda": lambda: _C._stage_last_token_ids(reqs1, None, "cuda"),
    "C_decode1_stream": lambda: _C._stage_last_token_ids(reqs1, stream, None),
    "penalty1": lambda: build_penalty_last_token_ids(reqs1, device="cuda"),
    "C_decode256_none": lambda: _C._stage_last_token_ids(reqs256, None, None),
    "penalty256": lambda: build_penalty_last_token_ids(reqs256, device="cuda"),
    "listcomp256": lambda: [(r.output_ids or r.origin_input_ids)[-1] for r in reqs256],
    "pinned256": lambda: build_penalty_last_token_ids(reqs256, backend="pinned", device="cuda"),
}
for c in calls.values():
    for _ in range(2000): c()
torch.cuda.synchronize()
samples = {k: [] for k in calls}
for _ in range(15):
    for k, c in calls.items():
        n = 2000
        t = time.perf_counter_ns()
        for _ in range(n): c()
        samples[k].append((time.perf_counter_ns() - t) / n / 1e3)
    torch.cuda.synchronize()
for k, s in samples.items():
    print(f"{k:24s} {statistics.median(s):7.2f} us")
print(pinstage.stats())
