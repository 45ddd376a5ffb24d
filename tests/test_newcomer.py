"""What a new user meets first: the README's opening (what pinstage is, the two commands, where their
output goes) and its links, installing without torch, a checkout that shadows an installed pinstage,
the checkout importable from .venv after the README's commands."""

import os
import re
import shutil
import subprocess
import sys

import pytest
from support import ROOT

import pinstage

PACKAGE = os.path.dirname(os.path.abspath(pinstage.__file__))

README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")


def _read(path):
    with open(path) as f:
        return f.read()


def test_the_readme_says_what_and_for_whom_then_the_two_commands_in_at_most_250_lines():
    text = _read(README)
    lines = text.splitlines()
    assert len(lines) <= 250, len(lines)
    opening = " ".join(lines[:3])
    assert "PyTorch" in opening and "inference engines" in opening and "GPU" in opening, opening
    before_first_section = text[: text.index("\n## ")]
    commands = re.findall(r"^bash (scripts/\S+)", before_first_section, re.M)
    assert commands == ["scripts/bench.sh", "scripts/test.sh"], commands
    for where in ("bench/out/", "bench/results/cpu/", "bench/results/h200/"):
        assert where in before_first_section, where


def _anchors(markdown):
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_of_the_readme_and_docs_resolves():
    documents = [README] + [os.path.join(DOCS, n) for n in sorted(os.listdir(DOCS)) if n.endswith(".md")]
    broken = []
    for doc in documents:
        for target in re.findall(r"\]\(([^)\s]+)\)", _read(doc)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not os.path.exists(path):
                broken.append((doc, target))
            elif anchor and (not path.endswith(".md") or anchor not in _anchors(_read(path))):
                broken.append((doc, target))
    assert broken == []


# Makes `import torch` fail as it does in a Python without torch (ModuleNotFoundError naming torch).
_WITHOUT_TORCH = """
import importlib.abc, runpy, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError("No module named %r" % name, name=name)
sys.meta_path.insert(0, NoTorch())
sys.argv = ["setup.py", "--version"]
runpy.run_path("setup.py", run_name="__main__")
"""


def test_setup_without_torch_says_to_install_torch_first():
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "pinstage setup: torch must be installed first" in proc.stderr
    assert "pip install --no-build-isolation ." in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_source_folder_that_shadows_a_built_pinstage_says_so(tmp_path):
    checkout, installed = tmp_path / "checkout", tmp_path / "site-packages"
    no_build = shutil.ignore_patterns("_C*.so", "_C*.pyd", "__pycache__")
    shutil.copytree(PACKAGE, checkout / "pinstage", ignore=no_build)
    shutil.copytree(PACKAGE, installed / "pinstage", ignore=no_build)
    (installed / "pinstage" / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")  # found, never loaded
    proc = subprocess.run(
        [sys.executable, "-c", "import pinstage"],
        cwd=checkout,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(installed)),
        timeout=120,
    )
    assert proc.returncode != 0
    message = proc.stderr.splitlines()[-1]
    assert "is not built in %s" % (checkout / "pinstage") in message
    assert "shadows the built pinstage at %s" % (installed / "pinstage") in message
    assert "Run from another directory" in message and "build_ext --inplace" in message


def test_an_unbuilt_checkout_alone_is_not_called_shadowing(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "pinstage", ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    # Only torch's folder on the path (no site .pth files, no PYTHONPATH): no other pinstage to find.
    torch_only = [p for p in sys.path if os.path.isdir(os.path.join(p, "torch"))]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", "import sys; sys.path[:0] = [''] + %r; import pinstage" % (torch_only,)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "is not built. Build it with `pip install --no-build-isolation .`" in proc.stderr
    assert "shadows" not in proc.stderr


@pytest.mark.skipif(
    os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv")),
    reason="the test command puts the checkout on the import path of the .venv it made; this is another Python",
)
def test_the_venv_imports_this_checkout_from_anywhere(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", "import pinstage; print(pinstage.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert os.path.realpath(proc.stdout.strip()) == os.path.realpath(os.path.join(PACKAGE, "__init__.py"))


def test_fetch_handle_readers_are_documented():
    for reader in (pinstage.FetchHandle.numpy, pinstage.FetchHandle.tolist):
        assert reader.__doc__ and "wait" in reader.__doc__ and "fetch_many" in reader.__doc__, reader
