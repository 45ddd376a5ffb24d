import os, statistics, torch
from torch.utils.cpp_extension import load
ROOT = os.path.dirname(os.path.abspath(__file__))
ext = load("launch_exp", [os.path.join(ROOT, "launch_exp.cu")], extra_cuda_cflags=["-O3", "-arch=sm_90"], verbose=False)
dst = torch.zeros(32768, dtype=torch.uint8, device="cuda")
pinned = torch.randint(0, 255, (64 * 4096 + 32768,), dtype=torch.uint8).pin_memory()
variants = ["memcpy", "memcpy_event", "empty_kernel", "param", "param4k", "param32k"]
for n in (8, 128, 512, 2048, 4096, 16384):
    for busy in (False, True):
        samples = {v: [] for v in variants}
        for v in variants:
            ext.run(v, n, 200, dst, pinned)
        torch.cuda.synchronize()
        for _ in range(11):
            for v in variants:
                if busy:
                    torch.cuda._sleep(20_000_000)
                samples[v].append(ext.run(v, n, 500, dst, pinned))
                torch.cuda.synchronize()
        print(f"n={n:6d} busy={int(busy)} us/call: " + "  ".join(f"{v} {statistics.median(s)/1e3:.2f}" for v, s in samples.items()), flush=True)
# correctness of the param path
for n in (8, 2048, 4096, 16384):
    dst.zero_(); ext.run("param", n, 1, dst, pinned); torch.cuda.synchronize()
    assert torch.equal(dst[:n].cpu(), pinned[:n]), n
print("param path correct")
