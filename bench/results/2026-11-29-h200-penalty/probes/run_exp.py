import os, sys, random, time, statistics
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "bench"))
import torch
from torch.utils.cpp_extension import load
ext = load("gather_exp", [os.path.join(ROOT, "scratch/gather_exp.cpp")], extra_cflags=["-O3"],
           build_directory=os.environ.get("EXP_BUILD", None), verbose=False)
import importlib.util
spec = importlib.util.spec_from_file_location("requests_mod", os.path.join(ROOT, "pinstage/builders/requests.py"))
rm = importlib.util.module_from_spec(spec); spec.loader.exec_module(rm)
Request = rm.Request
class B:
    @staticmethod
    def decode_requests(rng, bs):
        return [Request([rng.randrange(1 << 17) for _ in range(rng.randint(16, 64))],
                        [rng.randrange(1 << 17) for _ in range(rng.randint(1, 32))], req_pool_idx=i)
                for i in range(bs)]

def scattered(rng, bs):
    # Requests built one step at a time with other allocations between, as in a long-running engine.
    junk = []
    reqs = [Request([rng.randrange(1 << 17) for _ in range(rng.randint(16, 64))], [], req_pool_idx=i) for i in range(bs)]
    for step in range(32):
        order = list(range(bs)); rng.shuffle(order)
        for i in order:
            if rng.random() < 0.7:
                reqs[i].output_ids.append(rng.randrange(1 << 17))
                junk.append([object() for _ in range(3)])
    return reqs, junk

print(sys.version, torch.__version__, flush=True)
variants = ["old", "reader", "hint", "group8"]
for bs in (256, 1024):
    for kind in ("bench", "scattered"):
        if kind == "bench":
            reqs, keep = B.decode_requests(random.Random(bs), bs), None
        else:
            reqs, keep = scattered(random.Random(bs), bs)
        expected = torch.tensor([(r.output_ids or r.origin_input_ids)[-1] for r in reqs])
        out = torch.empty(bs, dtype=torch.int64)
        reps = max(20, 200000 // bs)
        samples = {v: [] for v in variants + ["python"]}
        for v in variants:
            ext.run(reqs, v, 5, out); assert torch.equal(out, expected), v
        for _ in range(15):
            for v in variants:
                samples[v].append(ext.run(reqs, v, reps, out))
            t = time.perf_counter_ns()
            for _ in range(reps // 4 + 1):
                [(r.output_ids or r.origin_input_ids)[-1] for r in reqs]
            samples["python"].append((time.perf_counter_ns() - t) / (reps // 4 + 1))
        med = {v: statistics.median(s) / bs for v, s in samples.items()}
        print(f"bs {bs:5d} {kind:9s} ns/request: " + "  ".join(f"{v} {med[v]:.1f}" for v in samples))
