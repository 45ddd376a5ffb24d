"""csrc/'s folders include only their own layer and the layers below (scripts/check_layers.py)."""

import importlib.util
import os

from support import ROOT

_spec = importlib.util.spec_from_file_location("check_layers", os.path.join(ROOT, "scripts", "check_layers.py"))
check_layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_layers)


def test_csrc_includes_point_down_only():
    assert check_layers.upward_includes(os.path.join(ROOT, "csrc")) == []


def test_the_check_finds_an_upward_include(tmp_path):
    (tmp_path / "ring").mkdir()
    (tmp_path / "copy").mkdir()
    (tmp_path / "ring" / "a.h").write_text('#include "copy/target.h"\n#include "ring/b.h"\n')
    (tmp_path / "copy" / "target.h").write_text('#include "ring/a.h"\n')
    (tmp_path / "values").mkdir()  # left empty: holds nothing to check
    (tmp_path / "extras").mkdir()
    (tmp_path / "extras" / "x.cpp").write_text("int x;\n")
    assert check_layers.upward_includes(str(tmp_path)) == [
        (str(tmp_path / "extras"), "<a folder not in the layer list>"),
        (os.path.join("ring", "a.h"), "copy"),
    ]
