"""The package's architecture, checked on its source (docs/architecture.md):
each layer imports only the layers below it, no module imports another's
private names, there is no import cycle (lazy imports included), modules and
functions stay small, each rule has one implementation, and docstrings point
only inside the repository."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "allocscope"

# Which group each module belongs to, by the longest matching prefix.
GROUPS = {
    "allocscope._format": "foundation", "allocscope._units": "foundation", "allocscope._progress": "foundation",
    "allocscope._native": "foundation", "allocscope._decode": "foundation", "allocscope._torch_hook": "foundation", "allocscope._version": "foundation",
    "allocscope._bootstrap": "foundation", "allocscope._C": "foundation", "allocscope._analysis": "foundation",
    "allocscope.reader": "capture", "allocscope.writer": "capture", "allocscope.stacks": "capture",
    "allocscope.allocator": "allocator",
    "allocscope.attribution": "attribution",
    "allocscope.reports": "reports",
    "allocscope.interop": "interop",
    "allocscope.vgpu": "vgpu",
    "allocscope.recording": "recording", "allocscope.watcher": "recording", "allocscope._metadata": "recording",
    "allocscope._autostart": "recording", "allocscope._autowatch": "recording", "allocscope._phases": "recording",
    "allocscope.cli": "entry", "allocscope.__main__": "entry", "allocscope._bootstrap.sitecustomize": "entry",
    "allocscope": "entry",
}
_ANALYSIS = ["foundation", "capture", "allocator", "attribution", "reports", "interop"]
# What each group may import (itself included). The analysis side is a stack;
# the recording side sits on the foundation, the virtual GPU and the
# allocator's settings grammar (the metadata records PYTORCH_CUDA_ALLOC_CONF).
ALLOWED = {group: set(_ANALYSIS[:i + 1]) for i, group in enumerate(_ANALYSIS)}
ALLOWED["vgpu"] = {"foundation", "vgpu"}
ALLOWED["recording"] = {"foundation", "vgpu", "allocator", "recording"}
ALLOWED["entry"] = set(ALLOWED) | {"entry"}

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100
LONGER = {  # path relative to the package: why it is longer (none today)
}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()
NATIVE = {"allocscope._C", "allocscope._analysis"}  # the compiled extensions (csrc/): modules, not .py files


def _group(module: str) -> str:
    best = max((p for p in GROUPS if module == p or module.startswith(p + ".")), key=len)
    return GROUPS[best]


def _imports(module: str, path: pathlib.Path) -> list[tuple[str, str, int]]:
    """(imported module, imported name or '', line) of every import of an
    allocscope module, at any depth (lazy imports count)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in _walk_runtime(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "allocscope"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "allocscope":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub, "", node.lineno) if sub in MODULES or sub in NATIVE else (target, a.name, node.lineno))
    return out


def _walk_runtime(tree: ast.AST):
    """ast.walk, less `if TYPE_CHECKING:` blocks (imports for annotations only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                todo += child.orelse
                continue
            todo.append(child)


def test_the_groups_cover_every_module():
    assert {m: _group(m) for m in MODULES}  # every module has a group (max() of nothing would raise)


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for module, path in MODULES.items():
        for target, _name, line in _imports(module, path):
            if _group(target) not in ALLOWED[_group(module)]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {_group(module)} imports {target} ({_group(target)})")
    assert not wrong, "\n".join(wrong)


def test_the_allocator_model_does_not_need_the_attribution():
    for module, path in MODULES.items():
        if _group(module) == "allocator":
            assert not [t for t, _, _ in _imports(module, path) if _group(t) not in ("foundation", "capture",
                                                                                    "allocator")], module


def test_no_private_names_are_imported_across_modules():
    wrong = []
    for module, path in MODULES.items():
        for target, name, line in _imports(module, path):
            if name.startswith("_") and not name.startswith("__") and target != module:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: imports {target}.{name}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    graph = {m: sorted({t for t, _, _ in _imports(m, p) if t in MODULES and t != m}) for m, p in MODULES.items()}
    assert "allocscope.allocator.expandable" in graph["allocscope.allocator.model"]  # the walk sees imports
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in graph[m]:
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t):] + [m, t]) if t in path else f"{m} -> {t}")
            elif t not in state:
                visit(t, path + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])
    assert not cycles, "\n".join(cycles)


def test_modules_and_functions_stay_small():
    long = []
    for path in MODULES.values():
        rel = str(path.relative_to(PKG))
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES and rel not in LONGER:
            long.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in LONGER:
                    long.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert not long, "\n".join(long)


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                names |= {e.id for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


# Names every document module or command module defines by convention.
_CONVENTIONS = {"__all__", "SCHEMA", "render", "K", "NAME", "HELP", "DESCRIPTION", "prepare_parser", "run",
                "activate"}


@pytest.mark.parametrize("rule", ["round_size", "MIN_BLOCK", "SMALL_SIZE", "parse_alloc_conf", "settings_items",
                                  "bucket_peaks", "baseline_segments", "user_frame", "table"])
def test_each_rule_has_one_implementation(rule):
    where = [str(p.relative_to(PKG)) for p in MODULES.values() if rule in _top_level_names(ast.parse(p.read_text()))]
    assert len(where) == 1, f"{rule} is defined in {where}"


def test_public_names_are_defined_once():
    seen: dict[str, list[str]] = {}
    for path in MODULES.values():
        for name in _top_level_names(ast.parse(path.read_text())):
            if not name.startswith("_") and name not in _CONVENTIONS:
                seen.setdefault(name, []).append(str(path.relative_to(PKG)))
    assert not {k: v for k, v in seen.items() if len(v) > 1}


def test_public_modules_have_a_docstring_and_an_accurate_all():
    missing = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        if not ast.get_docstring(tree):
            missing.append(f"{module}: no docstring")
        public = not any(part.startswith("_") for part in module.split(".")) and "cli" not in module.split(".")
        if public and module not in ("allocscope.pytest_plugin",):
            exported = next((n for n in tree.body if isinstance(n, ast.Assign)
                             and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)), None)
            if exported is None:
                missing.append(f"{module}: no __all__")
                continue
            defined = _top_level_names(tree) | {a.asname or a.name for n in tree.body
                                                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
            missing += [f"{module}: __all__ names {name!r}, which it does not define"
                        for name in ast.literal_eval(exported.value) if name not in defined]
    assert not missing, "\n".join(missing)


def test_sources_point_only_inside_the_repository():
    outside = re.compile(r"\.\./shared|/work/|\.\./\.\./")
    wrong = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in [*PKG.rglob("*.py"), *(ROOT / "csrc").rglob("*.[ch]*")]
             for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if outside.search(line)]
    assert not wrong, "\n".join(wrong)


def test_the_torch_version_guard_is_defined_once_in_csrc():
    defs = [p.relative_to(ROOT) for p in (ROOT / "csrc").rglob("*.[ch]*")
            if "#define ALLOCSCOPE_TORCH_AT_LEAST" in p.read_text(errors="replace")]
    assert [str(p) for p in defs] == ["csrc/torch_version.h"]
