"""The import rules of docs/architecture.md, checked on every module of the package (imports
inside functions included): a layer may use the layers below it, never the ones above."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mmsparse

ROOT = Path(mmsparse.__file__).parent

# module prefix -> layer (the longest matching prefix wins)
LAYERS = {
    "mmsparse": "api",                       # the package itself: lazy re-exports of the API
    "mmsparse.cli": "cli", "mmsparse.cli_ui": "cli", "mmsparse.cli_fields": "cli", "mmsparse.commands": "cli",
    "mmsparse.api": "api",
    "mmsparse.methods": "methods", "mmsparse.trainer": "methods", "mmsparse.vocab": "methods",
    "mmsparse.indexes": "indexes",
    "mmsparse.metrics": "metrics",
    "mmsparse.backbones": "encoders", "mmsparse.data": "encoders",
    "mmsparse.formats": "formats",
    "mmsparse._version": "core", "mmsparse.errors": "core", "mmsparse.atomic": "core", "mmsparse.provenance": "core",
    "mmsparse.settings": "core", "mmsparse.checks": "core", "mmsparse.progress": "core",
    "mmsparse.options": "core", "mmsparse.runtime": "core",
    "mmsparse.bench": "tools",              # benchmark programs
    "mmsparse.serve": "tools",              # the search web application (FastAPI)
    "mmsparse.pyterrier": "api",            # PyTerrier transformers over the API
    "mmsparse.distributed": "api",          # Ray Data: the same stages on many workers
}
CLI_ONLY = ("typer", "click", "rich")
MODEL_CODE = ("torch", "transformers")
# layer -> layers it must not import
FORBIDDEN = {
    "core": {"cli", "api", "methods", "indexes", "metrics", "encoders", "formats", "tools"},
    "formats": {"cli", "api", "methods", "indexes", "metrics", "encoders", "tools"},
    "encoders": {"cli", "api", "methods", "indexes", "metrics", "tools"},
    "metrics": {"cli", "api", "methods", "indexes", "tools"},
    "methods": {"cli", "api", "indexes", "tools"},
    "indexes": {"cli", "api", "methods", "tools"},
    "api": {"cli", "tools"},
    "tools": {"cli"},
    "cli": set(),
}


def layer(module: str) -> str | None:
    best = None
    for prefix, name in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, name)
    return best[1] if best else None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(mod: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in module `mod`'s source, relative ones resolved."""
    package = mod if is_package else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            out.append((node.lineno, name))
            out += [(node.lineno, f"{name}.{a.name}") for a in node.names if layer(f"{name}.{a.name}")]
    return out


def violations(mod: str, source: str, is_package: bool = False) -> list[str]:
    """Every import of `mod` that breaks a rule, as readable lines."""
    own = layer(mod)
    bad = []
    for line, name in imports(mod, source, is_package):
        top = name.split(".")[0]
        target = layer(name) if top == "mmsparse" else None
        if top in CLI_ONLY and own != "cli":
            bad.append(f"line {line}: {name} (typer/click/rich belong to the command line)")
        if own == "formats" and (top in MODEL_CODE or target in ("methods", "encoders")):
            bad.append(f"line {line}: {name} (formats import no model code)")
        if target in FORBIDDEN[own]:
            bad.append(f"line {line}: {name} ({own} must not import {target})")
        if mod.startswith("mmsparse.commands.") and name.startswith("mmsparse.commands.") and name != mod:
            bad.append(f"line {line}: {name} (command modules never import each other)")
    return bad


FILES = sorted(ROOT.rglob("*.py"))


def test_every_module_has_a_layer():
    missing = [module_name(p) for p in FILES if layer(module_name(p)) is None]
    assert not missing, f"assign these modules a layer in LAYERS and docs/architecture.md: {missing}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: module_name(p))
def test_import_rules(path):
    mod = module_name(path)
    bad = violations(mod, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    assert not bad, f"{mod}: " + "; ".join(bad)


def test_the_rules_can_fail():
    src = "import torch\nfrom ..methods import get_method\nfrom rich.console import Console\n"
    bad = violations("mmsparse.formats.probe", src)
    assert bad[0] == "line 1: torch (formats import no model code)"
    assert "line 2: mmsparse.methods (formats must not import methods)" in bad
    assert bad[-1] == "line 3: rich.console (typer/click/rich belong to the command line)"
    assert violations("mmsparse.methods.probe", "from ..indexes import open_index\n")
    assert violations("mmsparse.commands.probe", "from . import search\n")
    assert violations("mmsparse.metrics.probe", "from ..trainer import fit\n")
    assert not violations("mmsparse.api.probe", "from ..methods import get_method\nfrom ..indexes import open_index\n")
