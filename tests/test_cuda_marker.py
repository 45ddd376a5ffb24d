"""Every test that needs CUDA says so one way, the `cuda` marker on the test itself (`cuda(devices=2)`
for two GPUs), so that `pytest -m cuda` selects it and conftest skips it where too few GPUs are
visible; a test that
needs no GPU visible says so with `no_gpu`, which the README's test command runs with CUDA hidden. A
module-level pytest.skip, a skipif on CUDA either way or a device list whose "cuda" entry lacks the
marker would hide cases from a run, and a module-wide `pytestmark` would mark tests that need no GPU
along with those that do; this reads the test modules (no import, no GPU needed) and names
every such place."""

import ast
import pathlib

import pytest

TESTS = pathlib.Path(__file__).resolve().parent


def _is_attr(node, dotted):
    return isinstance(node, (ast.Attribute, ast.Name)) and ast.unparse(node) == dotted


def _is_call(node, dotted):
    return isinstance(node, ast.Call) and _is_attr(node.func, dotted)


def _has_cuda_mark(node):
    """Whether a mark expression (a mark, a list or tuple of marks) holds pytest.mark.cuda."""
    if node is None:
        return False
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_has_cuda_mark(n) for n in node.elts)
    return _is_attr(node, "pytest.mark.cuda") or _is_call(node, "pytest.mark.cuda")


def violations(source, name="<test>"):
    """'file:line: why' for each place in `source` that hides a CUDA case from the marker."""
    tree = ast.parse(source)
    found = []
    assigned = {}  # module-level name -> its value's source, to see through HAS_CUDA = ...
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    assigned[target.id] = ast.unparse(stmt.value)

    def condition(node):
        text = ast.unparse(node)
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        return text, text + " " + " ".join(assigned[n] for n in sorted(names) if n in assigned)

    def report(node, why):
        found.append("%s:%d: %s" % (name, node.lineno, why))

    # A module-level pytest.skip: the module's cases are never collected, so `-m cuda` never sees them.
    module_skips = set()
    for stmt in tree.body:
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for node in ast.walk(stmt):
                if _is_call(node, "pytest.skip"):
                    report(node, "module-level pytest.skip (mark each CUDA test with pytest.mark.cuda)")
                    module_skips.add(id(node))
        if isinstance(stmt, ast.Assign) and any(_is_attr(t, "pytestmark") for t in stmt.targets):
            if _has_cuda_mark(stmt.value):
                report(stmt, "module-wide pytestmark with pytest.mark.cuda (mark each CUDA test instead)")

    for node in ast.walk(tree):
        if _is_call(node, "pytest.mark.skipif") and node.args:
            text, resolved = condition(node.args[0])
            if "cuda" in resolved.lower():
                report(node, "skipif on CUDA: %s (use pytest.mark.cuda(devices=N) or pytest.mark.no_gpu)" % text)
        elif isinstance(node, ast.If) and any(
            _is_call(n, "pytest.skip") and id(n) not in module_skips for s in node.body for n in ast.walk(s)
        ):
            text, resolved = condition(node.test)
            if "cuda" in resolved.lower():
                report(node, "pytest.skip under `if %s` (use the cuda or no_gpu marker)" % text)
        elif _is_call(node, "pytest.param") and node.args:
            first = node.args[0]
            device = first.value if isinstance(first, ast.Constant) else ast.unparse(first)
            if isinstance(device, str) and device.startswith("cuda"):
                marks = next((k.value for k in node.keywords if k.arg == "marks"), None)
                if not _has_cuda_mark(marks):
                    report(node, "pytest.param(%r) without marks=pytest.mark.cuda" % device)
    return found


def test_no_test_module_hides_cuda_cases_from_the_marker():
    # conftest.py is where the marker turns into a skip without a GPU.
    paths = [p for p in sorted(TESTS.glob("*.py")) if p.name != "conftest.py"]
    found = [v for path in paths for v in violations(path.read_text(), path.name)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import pytest, torch\nif not torch.cuda.is_available():\n    pytest.skip('no')\n",
        "import pytest, torch\nif torch.cuda.device_count() < 2:\n    pytest.skip('two')\n",
        "import pytest, torch\n@pytest.mark.skipif(not torch.cuda.is_available(), reason='x')\ndef test_a(): pass\n",
        "import pytest, torch\nHAS = torch.cuda.is_available()\n"
        "D = [pytest.param('cuda', marks=pytest.mark.skipif(not HAS, reason='x'))]\n",
        "import pytest\nE = [pytest.param('cuda:1', id='one')]\n",
        "import pytest, torch\n@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='x')\ndef test_a(): pass\n",
        "import pytest, torch\n@pytest.mark.cuda\n@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='x')\n"
        "def test_a(): pass\n",
        "import pytest, torch\ndef test_a():\n    if not torch.cuda.is_available():\n        pytest.skip('x')\n",
        "import pytest, torch\n@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the CPU default')\n"
        "def test_a(): pass\n",
        "import pytest\npytestmark = pytest.mark.cuda\n",
        "import pytest\npytestmark = [pytest.mark.cuda(devices=2), pytest.mark.slow]\n",
    ],
    ids=[
        "module_skip",
        "module_skip_two_gpus",
        "skipif_available",
        "device_list_skipif",
        "param_without_mark",
        "two_gpus_without_marker",
        "two_gpus_skipif_beside_the_marker",
        "skip_in_body",
        "cpu_only_skipif_where_a_gpu_is",
        "module_mark",
        "module_mark_two_gpus",
    ],
)
def test_each_way_of_hiding_a_cuda_case_is_found(source):
    assert violations(source)


@pytest.mark.parametrize(
    "source",
    [
        "import pytest\n@pytest.mark.cuda\ndef test_a(): pass\n",
        "import pytest\n@pytest.mark.cuda(devices=2)\ndef test_a(): pass\n",
        "import pytest\nD = ['cpu', pytest.param('cuda', marks=pytest.mark.cuda)]\n",
        "import pytest\n@pytest.mark.no_gpu\ndef test_a(): pass\n",
    ],
    ids=["on_a_test", "two_gpus_on_a_test", "device_list", "no_gpu"],
)
def test_the_marker_ways_pass(source):
    assert violations(source) == []
