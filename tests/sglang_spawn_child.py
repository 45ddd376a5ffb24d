"""What a process that SGLang spawns sees: run in a multiprocessing "spawn" child (as SGLang starts
its scheduler processes) by test_sglang_switch.py. Imports nothing heavy before it looks."""

import sys


def report(root):
    """Imports SGLang's scheduler modules from `root` (stand-ins for its heavy dependencies) and says
    whether pinstage's integration enabled itself in this process."""
    before = {"hook": "_pinstage_hook" in sys.modules, "pinstage": "pinstage" in sys.modules}
    from bench.engines import sglang_stubs

    sg = sglang_stubs.import_sglang(root)
    from pinstage.integrations import sglang

    filter_batch = sg.ScheduleBatch.__dict__["filter_batch"]
    return {
        **before,
        "enabled": sglang.is_enabled(),
        "filter_batch_replaced": getattr(filter_batch, "__wrapped__", None) is not None,
    }
