"""SGLang's own functions with each `torch.tensor(values, dtype=d, pin_memory=p).to(device,
non_blocking=True)` replaced by one `pinstage.stage_to_device(values, d, device=device)`.

Where a method builds one or two small tensors in the middle of a long body (filter_batch's keep
indices, prepare_for_extend's lengths), replacing the whole method would mean maintaining a second
copy of it. Instead the installed source of that one function is parsed, only those expressions are
rewritten, and the result is compiled with the function's own globals, file name and line numbers:
every other line runs as SGLang wrote it, and tracebacks point into SGLang's file. The number of
sites found must equal the number expected for the tested version, else nothing is patched.
"""

import __future__

import ast
import functools
import inspect
import textwrap
import types

import pinstage

_STAGE = "_pinstage_stage_to_device"  # the one free name the rewritten function reads


def with_staged_copies(function, expected_sites):
    """A copy of `function` (a plain function or a method's function) whose host-to-device tensor
    expressions go through pinstage. Raises RuntimeError when the source does not have exactly
    `expected_sites` of them or cannot be rewritten safely."""
    name = function.__qualname__
    if function.__code__.co_freevars:  # zero-argument super() or a closure: not rebuildable alone
        raise RuntimeError(f"pinstage: {name} reads enclosing variables {function.__code__.co_freevars}")
    definition = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    if not isinstance(definition, ast.FunctionDef) or definition.decorator_list:
        raise RuntimeError(f"pinstage: {name} is not a plain function definition")
    rewriter = _HostToDeviceSites()
    rewriter.visit(definition)
    if rewriter.sites != expected_sites:
        raise RuntimeError(
            f"pinstage: {name} has {rewriter.sites} host-to-device tensor expressions where "
            f"{expected_sites} were expected: this is not the source pinstage was tested with"
        )
    # def outer(_pinstage_stage_to_device): <definition>; return <name>  -- a closure, so that the
    # rewritten function uses SGLang's module globals untouched.
    outer = ast.FunctionDef(
        name="_pinstage_outer",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(_STAGE)], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[definition, ast.Return(ast.Name(definition.name, ast.Load()))],
        decorator_list=[],
    )
    module = ast.fix_missing_locations(ast.Module(body=[outer], type_ignores=[]))
    ast.increment_lineno(module, function.__code__.co_firstlineno - 1)
    code = compile(
        module, function.__code__.co_filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True
    )
    outer_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    rewritten = types.FunctionType(outer_code, function.__globals__)(pinstage.stage_to_device)
    rewritten.__defaults__ = function.__defaults__
    rewritten.__kwdefaults__ = function.__kwdefaults__
    return functools.update_wrapper(rewritten, function)


class _HostToDeviceSites(ast.NodeTransformer):
    """torch.tensor(VALUES, dtype=D[, pin_memory=P]).to(DEVICE, non_blocking=True)
    -> _pinstage_stage_to_device(VALUES, D, device=DEVICE). The pin_memory expression (a query with
    no effect) is dropped; an expression without an explicit dtype is left alone (torch infers
    it from the values, pinstage needs it)."""

    def __init__(self):
        self.sites = 0

    def visit_Call(self, node):
        self.generic_visit(node)
        parts = _site(node)
        if parts is None:
            return node
        self.sites += 1
        values, dtype, device = parts
        return ast.copy_location(
            ast.Call(ast.Name(_STAGE, ast.Load()), [values, dtype], [ast.keyword("device", device)]), node
        )


def _site(call):
    """(values, dtype, device) of a matching expression, else None."""
    to = call.func
    if not (isinstance(to, ast.Attribute) and to.attr == "to" and isinstance(to.value, ast.Call)):
        return None
    make = to.value
    if not (
        isinstance(make.func, ast.Attribute)
        and make.func.attr == "tensor"
        and isinstance(make.func.value, ast.Name)
        and make.func.value.id == "torch"
    ):
        return None
    made = {k.arg: k.value for k in make.keywords}
    if len(make.args) != 1 or "dtype" not in made or not set(made) <= {"dtype", "pin_memory"}:
        return None
    moved = {k.arg: k.value for k in call.keywords}
    blocking = moved.pop("non_blocking", None)
    if not (isinstance(blocking, ast.Constant) and blocking.value is True):
        return None
    if call.args and not moved and len(call.args) == 1:
        device = call.args[0]
    elif not call.args and set(moved) == {"device"}:
        device = moved["device"]
    else:
        return None
    return make.args[0], made["dtype"], device
