"""Fails when a csrc/ folder includes a folder above it: the layers only point down.

Lowest first: python (CPython objects, the GIL, naming errors), convert (values -> typed bytes),
ring (pinned memory and fences), copy (device/stream targets, copies through the ring), tensor
(stage_to_device & co., StaticInputs), ops (the builders' compiled work: torch.ops.pinstage's operator,
the logits indices), bindings (the Python module).
Usage: python scripts/check_layers.py [csrc folder]; prints each upward include, exits 1 if any.
"""

import os
import re
import sys

LAYERS = ["python", "convert", "ring", "copy", "tensor", "ops", "bindings"]
SOURCES = (".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^/"]+)/[^"]+"', re.M)


def upward_includes(csrc):
    """(file, included folder) for every include of a higher layer, or of a folder not in LAYERS."""
    found = []
    for folder in sorted(os.listdir(csrc)):
        path = os.path.join(csrc, folder)
        sources = [n for n in os.listdir(path) if n.endswith(SOURCES)] if os.path.isdir(path) else []
        if not sources:  # not a folder, or one left empty (it includes nothing)
            continue
        if folder not in LAYERS:
            found.append((path, "<a folder not in the layer list>"))
            continue
        for name in sorted(sources):
            with open(os.path.join(path, name), encoding="utf-8") as f:
                for included in INCLUDE.findall(f.read()):
                    if included not in LAYERS or LAYERS.index(included) > LAYERS.index(folder):
                        found.append((os.path.join(folder, name), included))
    return found


def main(argv):
    csrc = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "csrc")
    found = upward_includes(csrc)
    for where, included in found:
        print("%s includes %s/, a layer above it (order: %s)" % (where, included, " < ".join(LAYERS)))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
