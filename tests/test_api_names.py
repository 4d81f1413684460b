"""One name, one thing: every public name of `mmsparse` and `mmsparse.api` is the documented
function, also once every stage module is imported (a module named after a function it defines
would replace that function on its package), and the README names only names that exist."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re

from test_readme import README, python_api_block  # the README's Python API example

import mmsparse
import mmsparse.api as api


def _import_every_stage_module() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(api.__path__)]
    for name in names:
        importlib.import_module(f"mmsparse.api.{name}")
    return names


def test_module_names_are_not_function_names():
    modules = _import_every_stage_module()
    assert set(api._WHERE.values()) <= set(modules)
    clash = sorted(set(modules) & (set(api.__all__) | set(mmsparse.__all__)))
    assert not clash, f"mmsparse.api modules named like public functions: {clash}; name the module for its stage"


def test_every_public_name_is_its_documented_function():
    _import_every_stage_module()
    assert set(mmsparse.__all__) == {"__version__", *api.__all__}
    for name in api.__all__:
        fn = getattr(api, name)
        assert inspect.isfunction(fn), f"mmsparse.api.{name} is {fn!r}, not a function"
        assert fn is getattr(mmsparse, name), f"mmsparse.{name} is not mmsparse.api.{name}"
        assert fn is getattr(importlib.import_module(f"mmsparse.api.{api._WHERE[name]}"), name)
        assert (inspect.getdoc(fn) or "").strip(), f"mmsparse.{name} has no docstring"


def _resolve(dotted: str):
    """The object `dotted` (mmsparse.a.b) names, importing submodules on the way; AttributeError if none."""
    obj = importlib.import_module(dotted.split(".")[0])
    for part in dotted.split(".")[1:]:
        if not hasattr(obj, part) and hasattr(obj, "__path__"):
            importlib.import_module(f"{obj.__name__}.{part}")
        obj = getattr(obj, part)
    return obj


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def test_readme_python_api_names_exist():
    tree = ast.parse(python_api_block())
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            used |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            used |= {a.name for a in node.names}
        elif isinstance(node, ast.Attribute) and (d := _dotted(node)) and d.startswith("mmsparse."):
            used.add(d)
    assert {f"mmsparse.{n}" for n in api.__all__} & used, "the README example calls no stage function"
    for name in sorted(used):
        if name.startswith("mmsparse"):
            _resolve(name)  # raises AttributeError / ImportError for a name that does not exist
    # the stage table at the top: `mmsparse.NAME` per stage, each a public function
    table = re.search(r"```\n(encode-dense .*?)```", README.read_text(encoding="utf-8"), re.S).group(1)
    for name in re.findall(r"\bmmsparse\.(\w+)", table):
        assert name in mmsparse.__all__ and inspect.isfunction(getattr(mmsparse, name)), name
