#!/usr/bin/env python3
"""Row writes into a device-resident block table: pinstage's StaticInputs.write_rows against vLLM
0.33's StagedWriteTensor and FusedStagedWriter (its released buffer_utils.py, loaded from the wheel
as the tests load it; their Triton kernel needs the GPU).

One step changes k rows (1, 8, 64) with 1-16 new entries each, at random columns, in an int32 table
[256, 512] or [1024, 4096]:
  pinstage        write_rows(rows, starts, values) + stage(): one ring region, one kernel
  vllm_staged     StagedWriteTensor.stage_write per row + apply_write() (default depth 2)
  vllm_fused      the same stage_write calls + FusedStagedWriter.apply([table])
Host us per step: perf_counter_ns around a loop of steps queued behind a sleeping kernel (the host
never waits). Device us per step: CUDA events around each step, queued behind a sleep so that the
steps run back to back. Methods interleaved, order rotated every repeat, warm-up first; medians.
Race: 8 steps queued behind a busy kernel, a snapshot of the table after each; once the stream has
drained every snapshot is compared with the same writes applied by torch indexing (wrong values per
method). Without a GPU pinstage's host part runs on the CPU, against the same writes by torch
indexing (torch_index) in the same run.
"""

import argparse
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _report  # noqa: E402
import _timing  # noqa: E402
import torch  # noqa: E402
from microbench import MAX_QUEUED_COPIES, GpuBusy, ratio  # noqa: E402
from static_inputs import measure_cell, median  # noqa: E402

from pinstage import Field, StaticInputs  # noqa: E402

TABLES = [(256, 512), (1024, 4096)]
ROWS_PER_STEP = [1, 8, 64]
METHODS = ["pinstage", "vllm_staged", "vllm_fused", "torch_index"]
VARIANTS = 32  # distinct steps cycled through in a loop: the values are made before the timing
RACE_STEPS = 8
RACE_SLEEP_MS = 50.0
# Targets (issue 32): host <= 0.5x vLLM's per step, device <= 1.0x, no wrong value.
HOST_RATIO, DEVICE_RATIO = 0.5, 1.0


def make_steps(shape, k, count, seed):
    """count steps of k writes: distinct rows, 1-16 entries each at a random start."""
    rng = random.Random("%s-%d-%d" % (shape, k, seed))
    rows_total, width = shape
    steps = []
    for _ in range(count):
        rows = rng.sample(range(rows_total), k)
        lengths = [rng.randint(1, 16) for _ in rows]
        starts = [rng.randrange(0, width - n + 1) for n in lengths]
        values = [[rng.randrange(1 << 30) for _ in range(n)] for n in lengths]
        steps.append((rows, starts, values))
    return steps


class PinstageTable:
    def __init__(self, shape, device):
        self.inputs = StaticInputs({"block_table": Field(torch.int32, shape[1:], persistent=True)}, shape[0], device)
        self.table = self.inputs["block_table"]

    def step(self, rows, starts, values):
        self.inputs.write_rows("block_table", rows, starts, values)
        self.inputs.stage({}, 0)


class TorchIndexTable:
    """Each write a torch indexing assignment: the plain way on the CPU, and the race's reference."""

    def __init__(self, shape, device):
        self.table = torch.zeros(shape, dtype=torch.int32, device=device)

    def step(self, rows, starts, values):
        for row, start, v in zip(rows, starts, values):
            self.table[row, start : start + len(v)] = torch.tensor(v, dtype=torch.int32)


class VllmStaged:
    def __init__(self, vllm, shape, device):
        self.t = vllm.buffer_utils.StagedWriteTensor(shape, torch.int32, device)
        self.table = self.t.gpu

    def step(self, rows, starts, values):
        for row, start, v in zip(rows, starts, values):
            self.t.stage_write(row, start, v)
        self.apply()

    def apply(self):
        self.t.apply_write()


class VllmFused(VllmStaged):
    def __init__(self, vllm, shape, device):
        super().__init__(vllm, shape, device)
        self.writer = vllm.buffer_utils.FusedStagedWriter(device, max_writes=shape[0])
        # As vLLM's block tables pass them: each table's address and row stride, on the device.
        self.ptrs = torch.tensor([self.table.data_ptr()], dtype=torch.int64, device=device)
        self.strides = torch.tensor([self.table.stride(0)], dtype=torch.int64, device=device)

    def apply(self):
        self.writer.apply([self.t], self.ptrs, self.strides)


def makers(vllm):
    out = {"pinstage": PinstageTable}
    if vllm is not None:
        out["vllm_staged"] = lambda shape, device: VllmStaged(vllm, shape, device)
        out["vllm_fused"] = lambda shape, device: VllmFused(vllm, shape, device)
    return out


def cycling(table, steps):
    state = {"i": 0}

    def call():
        rows, starts, values = steps[state["i"] % len(steps)]
        state["i"] += 1
        table.step(rows, starts, values)

    return call


def race(make, shape, k, busy, device):
    """Wrong values over RACE_STEPS snapshots taken behind a busy kernel, against torch indexing."""
    table = make(shape, device)
    steps = make_steps(shape, k, RACE_STEPS, seed=99)
    # The reference first: its host copies of a 16 MB table outlasted the busy kernel on a slow host.
    ref, expected = TorchIndexTable(shape, "cpu"), []
    for rows, starts, values in steps:
        ref.step(rows, starts, values)
        expected.append(ref.table.clone())
    torch.cuda.synchronize()
    done = busy.launch(RACE_SLEEP_MS * 1000.0)
    snapshots = []
    for rows, starts, values in steps:
        table.step(rows, starts, values)
        snapshots.append(table.table.clone())
    covered = not done.query()  # the steps were all issued behind the busy kernel: a race could show
    torch.cuda.synchronize()
    wrong = [int((got.cpu() != want).sum()) for got, want in zip(snapshots, expected)]
    return {
        "wrong_per_step": wrong,
        "wrong": sum(wrong),
        "values_checked": RACE_STEPS * shape[0] * shape[1],
        "covered": covered,
    }


def run_gpu(args, vllm, report):
    device = torch.device("cuda", torch.cuda.current_device())
    busy = GpuBusy()
    report["meta"]["sleep_cycles_per_us"] = busy.cycles_per_us
    loop_steps = MAX_QUEUED_COPIES // 4  # a vLLM step enqueues up to 4 operations
    cells = []
    for shape in args.tables:
        for k in args.rows:
            makes = makers(vllm)
            steps = make_steps(shape, k, VARIANTS, seed=1)
            calls = {name: cycling(make(shape, device), steps) for name, make in makes.items()}
            result = measure_cell(calls, args.repeats, loop_steps, busy, args.warmup)
            races = {name: race(make, shape, k, busy, device) for name, make in makes.items()}
            cells.append(
                {"shape": list(shape), "rows": k, "steps_per_loop": loop_steps, "methods": result, "race": races}
            )
            print(
                "  %s k=%d: pinstage host %s us, device %s us, race wrong %s"
                % (
                    list(shape),
                    k,
                    _report.fmt_us(result["pinstage"]["host"]["median_us"]),
                    _report.fmt_us(result["pinstage"]["device"]["median_us"]),
                    {name: r["wrong"] for name, r in races.items()},
                ),
                file=sys.stderr,
            )
    report["sections"]["gpu"] = cells


def run_cpu(args, report):
    """pinstage's host part on the CPU: write_rows + stage() into CPU tensors, interleaved with the
    same writes by torch indexing (vLLM's need a GPU)."""
    cells = []
    for shape in args.tables:
        for k in args.rows:
            steps = make_steps(shape, k, VARIANTS, seed=1)
            calls = {"pinstage": cycling(PinstageTable(shape, "cpu"), steps)}
            calls["torch_index"] = cycling(TorchIndexTable(shape, "cpu"), steps)
            result = _timing.interleaved(calls, args.repeats, sample_ms=2.0)
            methods = {name: {"host": samples} for name, samples in result.items()}
            cells.append({"shape": list(shape), "rows": k, "methods": methods})
    report["sections"]["cpu"] = cells


def table_rows(report, section):
    methods = [m for m in METHODS if any(m in c["methods"] for c in report["sections"][section])]
    kinds = ["host", "device"] if section == "gpu" else ["host"]
    header = ["table", "rows/step"]
    for kind in kinds:
        header += ["%s %s us" % (m, kind) for m in methods]
        if section == "gpu":
            header += ["%s x staged" % kind, "%s x fused" % kind]
    if section == "gpu":
        header += ["wrong values (%s)" % ", ".join(methods)]
    rows = [header]
    for c in report["sections"][section]:
        row = ["%dx%d" % tuple(c["shape"]), str(c["rows"])]
        for kind in kinds:
            row += [_report.fmt_us(median(c, m, kind)) for m in methods]
            if section == "gpu":
                row += [
                    _report.fmt_ratio(ratio(median(c, "pinstage", kind), median(c, "vllm_staged", kind))),
                    _report.fmt_ratio(ratio(median(c, "pinstage", kind), median(c, "vllm_fused", kind))),
                ]
        if section == "gpu":
            row.append(" / ".join(str(c["race"][m]["wrong"]) for m in methods))
        rows.append(row)
    return rows


def checks(report):
    out = []
    for c in report["sections"].get("gpu", []):
        what = "%dx%d, %d rows" % (tuple(c["shape"]) + (c["rows"],))
        for kind, need in (("host", HOST_RATIO), ("device", DEVICE_RATIO)):
            ours = median(c, "pinstage", kind)
            ratios = (ratio(ours, median(c, base, kind)) for base in ("vllm_staged", "vllm_fused"))
            worst = max((r for r in ratios if r is not None), default=None)
            out.append(
                _report.check(
                    "%s: pinstage %s us / vLLM's (the faster of staged, fused)" % (what, kind),
                    worst,
                    "<= %.2f" % need,
                    None if worst is None else worst <= need,
                )
            )
        wrong = c["race"]["pinstage"]["wrong"]
        out.append(_report.check("%s: pinstage wrong values in the race" % what, wrong, "0", wrong == 0))
        uncovered = sum(not r["covered"] for r in c["race"].values())
        out.append(_report.check("%s: races that outlived the busy kernel" % what, uncovered, "0", uncovered == 0))
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    p.add_argument("--repeats", type=int, default=None, help="timed samples per method and cell (default 15)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds of every method first")
    p.add_argument("--rows", type=int, nargs="+", default=ROWS_PER_STEP, help="rows changed per step")
    p.add_argument("--cpu-only", action="store_true", help="pinstage's host part on the CPU, even with a GPU")
    p.add_argument("--out", default=os.path.join(HERE, "out"), help="folder for row_writes.json and row_writes.md")
    args = p.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 15)
    args.tables = TABLES
    if any(not 1 <= k <= 256 for k in args.rows):
        p.error("rows per step must be in [1, 256]")
    return args


def load_vllm():
    from bench.engines import vllm_stubs
    from bench.engines.source import Unavailable

    try:
        return vllm_stubs.load_vllm()
    except Unavailable as why:
        sys.exit("row_writes: vLLM's source is needed for its baselines: %s" % why)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    use_gpu = torch.cuda.is_available() and not args.cpu_only
    report = {
        "meta": dict(
            _report.machine_meta(),
            repeats=args.repeats,
            warmup=args.warmup,
            tables=[list(t) for t in args.tables],
            rows_per_step=args.rows,
            mode="gpu" if use_gpu else "cpu",
        ),
        "sections": {},
    }
    if use_gpu:
        vllm = load_vllm()
        print("Row writes into a block table on %s (torch %s)" % (report["meta"]["gpu"], torch.__version__))
        run_gpu(args, vllm, report)
        rows = table_rows(report, "gpu")
    else:
        reason = "--cpu-only given" if args.cpu_only else "no GPU is visible"
        print(
            "Row writes: the comparison with vLLM needs a GPU (its Triton kernel); %s, so pinstage's host "
            "part runs on the CPU, against torch indexing" % reason
        )
        run_cpu(args, report)
        rows = table_rows(report, "cpu")
    print()
    _report.print_table(rows)
    report["checks"] = checks(report)
    _report.print_checks(report["checks"])
    os.makedirs(args.out, exist_ok=True)
    _report.write_json(os.path.join(args.out, "row_writes.json"), report)
    path = os.path.join(args.out, "row_writes.md")
    with open(path, "w") as f:
        f.write("Host and device us per step (medians); wrong values over %d snapshots in the race.\n\n" % RACE_STEPS)
        f.write(_report.markdown_table(rows) + "\n")
    print("wrote %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
