"""PINSTAGE_SGLANG=1 enables pinstage's SGLang integration in every process that imports SGLang's
scheduler modules, through pinstage-sglang.pth (site-packages runs it at interpreter start) and
_pinstage_hook: tested in a child started as SGLang starts its scheduler (multiprocessing spawn)."""

import multiprocessing
import os
import shutil
import subprocess
import sys

import pytest
import sglang_spawn_child

import _pinstage_hook
from bench.engines.sglang_stubs import PREFIXES, VERSION
from bench.engines.source import REPO, engine_root
from pinstage.integrations import sglang as pinstage_sglang


def _spawned_child(tmp_path, monkeypatch, switch):
    """report() from a spawn child whose interpreter ran pinstage-sglang.pth at start, as it would
    from site-packages (here a site dir that sitecustomize adds, since tests run from a checkout)."""
    root = engine_root("sglang", VERSION, PREFIXES)
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    shutil.copy(REPO / "pinstage-sglang.pth", site_dir)
    (tmp_path / "sitecustomize.py").write_text("import site\nsite.addsitedir(%r)\n" % str(site_dir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(REPO), str(REPO / "tests")]))
    if switch is None:
        monkeypatch.delenv(_pinstage_hook.SWITCH, raising=False)
    else:
        monkeypatch.setenv(_pinstage_hook.SWITCH, switch)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply_async(sglang_spawn_child.report, (str(root),)).get(timeout=600)


@pytest.mark.parametrize("switch, on", [("1", True), (None, False), ("0", False)], ids=["set", "unset", "zero"])
def test_the_switch_reaches_a_spawned_scheduler_child(tmp_path, monkeypatch, switch, on):
    seen = _spawned_child(tmp_path, monkeypatch, switch)
    assert seen == {"hook": on, "pinstage": False, "enabled": on, "filter_batch_replaced": on}


def test_the_hook_watches_the_modules_the_integration_patches():
    patched = {module for module, *_ in pinstage_sglang._REWRITTEN}
    patched |= {pinstage_sglang._SAMPLING_BATCH_INFO, pinstage_sglang._ALLOCATION, pinstage_sglang._POOL}
    assert _pinstage_hook.MODULES == patched


def test_the_pth_line_imports_nothing_without_the_switch(tmp_path):
    """Python runs the .pth line in every process of the environment: without the switch it must
    not even import the hook."""
    line = (REPO / "pinstage-sglang.pth").read_text().strip()
    assert line.startswith("import ") and "\n" not in line  # site runs a .pth line that starts with import
    code = "import sys; exec(%r); print('_pinstage_hook' in sys.modules, 'torch' in sys.modules)" % line
    env = {k: v for k, v in os.environ.items() if k != _pinstage_hook.SWITCH}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_setup_puts_the_pth_beside_the_package(tmp_path):
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pinstage-sglang.pth").read_text() == (REPO / "pinstage-sglang.pth").read_text()
    assert (tmp_path / "_pinstage_hook.py").exists() and (tmp_path / "pinstage" / "__init__.py").exists()
