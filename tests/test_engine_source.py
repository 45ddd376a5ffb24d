"""bench/engines/source.py: an engine's copy that lacks a file now listed is not taken for the source;
where no source is found, the tests that need it skip, saying why."""

import os
import subprocess
import sys
from xml.etree import ElementTree

from support import ROOT

from bench.engines import source

FILES = ["pkg/a.py", "pkg/b.py"]


def _copy(root, files):
    folder = root / "pkg-1.0"
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("")
    (folder / source._COMPLETE).write_text("wheel\n")
    return folder


def test_a_carried_copy_lacking_a_listed_file_is_passed_over(tmp_path, monkeypatch):
    monkeypatch.setenv("PINSTAGE_ENGINE_SRC", str(tmp_path))
    folder = _copy(tmp_path, FILES[:1])  # made before pkg/b.py was listed
    carried, stale = source._carried("pkg-1.0", FILES)
    assert carried is None and stale == ["%s lacks pkg/b.py" % folder]
    _copy(tmp_path, FILES)
    assert source._carried("pkg-1.0", FILES) == (folder, [])
    # folder prefixes (SGLang's "sglang/srt/") ask only for a complete copy
    assert source._missing(folder, ["pkg/"]) == []
    assert source._missing(tmp_path / "absent", ["pkg/"]) == [source._COMPLETE]


BODY = """
import pytest
from bench.engines.source import engine_root

@pytest.fixture
def pkg():
    return engine_root("pinstage-absent-pkg", "1.0", ["pkg/a.py"])

def test_in_its_body():
    engine_root("pinstage-absent-pkg", "1.0", ["pkg/a.py"])

def test_in_a_fixture(pkg):
    pass
"""


def test_a_test_finding_no_source_skips_with_the_reason(tmp_path):
    """No carried copy, no cache, no package index: a test that asks for an engine's source, in its
    body or through a fixture, skips saying why (the tests' conftest loaded as a plugin)."""
    (tmp_path / "test_body.py").write_text(BODY)
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, ROOT]), PIP_NO_INDEX="1")
    env.update(PINSTAGE_ENGINE_CACHE=str(tmp_path / "cache"), PINSTAGE_ENGINE_SRC=str(tmp_path / "none"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "--junitxml=run.xml"]
    done = subprocess.run(cmd + ["test_body.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = {
        case.get("name"): case.find("skipped").get("message")
        for case in ElementTree.parse(tmp_path / "run.xml").iter("testcase")
        if case.find("skipped") is not None
    }
    assert sorted(skipped) == ["test_in_a_fixture", "test_in_its_body"], done.stdout
    for why in skipped.values():
        assert "pinstage-absent-pkg 1.0's source is not here" in why, why
