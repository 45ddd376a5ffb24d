"""What the benchmarks print and write: machine description, tables, checks, JSON and plots."""

import datetime
import json
import os
import platform
import shlex
import statistics
import sys

import torch


def machine_meta():
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable)] + sys.argv),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gpu": gpu,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }


def fmt_us(value, spread=None):
    """A median in microseconds, with its min-max spread in brackets when given."""
    if value is None:
        return "-"
    text = "%.2f" % value if value < 10 else "%.1f" % value if value < 1000 else "%.0f" % value
    if spread:
        lo, hi = spread
        text += " [%s-%s]" % (("%.1f" % lo if lo < 100 else "%.0f" % lo), ("%.1f" % hi if hi < 100 else "%.0f" % hi))
    return text


def fmt_us_pm(value, spread):
    """A median in microseconds and the samples' largest distance from it, in percent: "9.30 ±3%"."""
    if value is None:
        return "-"
    lo, hi = spread
    return "%s ±%.0f%%" % (fmt_us(value), 100.0 * max(hi - value, value - lo) / value if value > 0 else 0.0)


def fmt_ratio(value):
    return "-" if value is None else "%.2fx" % value


def median_range(values):
    """(median, [min, max]) of per-round values, or (None, None) when there are none."""
    return (statistics.median(values), [min(values), max(values)]) if values else (None, None)


def fmt_ratio_range(value, spread):
    """A ratio with the min-max of the rounds' ratios: "0.93x [0.88-0.97]"."""
    return "-" if value is None else "%s [%.2f-%.2f]" % (fmt_ratio(value), *spread)


def print_table(rows):
    """rows[0] is the header; columns right-aligned but the first."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]

    def line(r):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    print(line(rows[0]))
    print("  ".join("-" * w for w in widths))
    for r in rows[1:]:
        print(line(r))


def check(what, measured, need, ok, detail=""):
    return {"check": what, "measured": measured, "need": need, "ok": ok, "detail": detail}


def check_line(c):
    """One check as '[met] what: measured (need ...); detail'."""
    verdict = {True: "met", False: "MISSED", None: "not measured"}[c["ok"]]
    m = c["measured"]
    measured = "-" if m is None else ("%.3g" % m if isinstance(m, float) else str(m))
    line = "[%s] %s: %s (need %s)" % (verdict, c["check"], measured, c["need"])
    return line + "; " + c["detail"] if c.get("detail") else line


def print_checks(checks):
    if not checks:
        return
    print()
    print("Checks")
    for c in checks:
        print("  " + check_line(c))


def markdown_table(rows):
    """A header row and data rows as a markdown table (the first column left-aligned, the rest right)."""
    cells = [[str(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(cells[0]) + " |", "|" + "|".join(["---"] + ["---:"] * (len(cells[0]) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells[1:]])


def markdown_checks(checks):
    return "\n".join("- " + check_line(c) for c in checks)


def write_json(path, report):
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    # Whole or not at all: a run killed while writing leaves the previous file, not half of one.
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print("wrote %s" % path)


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plot written)")
        return None
    return plt


def _title(meta):
    return "%s, torch %s" % (meta.get("gpu") or "CPU only (%s)" % meta.get("cpu"), meta.get("torch"))


def plot_panels(
    path, panels, meta, *, xlabel, ylabel="host us per call", title="", panel_width=5.0, dashed=(), yscale="log"
):
    """panels: [(panel title, {line label: [(x, y), ...]})]: one panel each (log x, `yscale` y), a
    line per label (dashed for the labels in `dashed`), the machine in the figure's title."""
    plt = _pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(panel_width * len(panels), 3.8), squeeze=False)
    labels = list(dict.fromkeys(label for _, lines in panels for label in lines))
    handles = {}  # one colour per label across panels, and every label in the legend
    for ax, (panel_title, lines) in zip(axes[0], panels):
        for label, points in lines.items():
            if points:
                (handles[label],) = ax.plot(
                    *zip(*sorted(points)),
                    marker="o",
                    label=label,
                    color="C%d" % labels.index(label),
                    linestyle="--" if label in dashed else "-",
                )
        ax.set_xscale("log")
        ax.set_yscale(yscale)
        ax.set_title(panel_title, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    ordered = [label for label in labels if label in handles]
    axes[0][-1].legend([handles[label] for label in ordered], ordered, fontsize=7)
    fig.suptitle("%s (%s)" % (title, _title(meta)) if title else _title(meta), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print("wrote %s" % path)
