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

pytestmark = pytest.mark.torch_agnostic

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "allocscope"

# Which group each module belongs to, by the longest matching prefix: folders,
# not files (test_no_loose_modules keeps it so).
GROUPS = {
    "allocscope._version": "foundation", "allocscope._C": "foundation", "allocscope._analysis": "foundation",
    "allocscope.common": "foundation",
    "allocscope.capture": "capture",
    "allocscope.allocator": "allocator",
    "allocscope.attribution": "attribution",
    "allocscope.reports": "reports",
    "allocscope.interop": "interop",
    "allocscope.vgpu": "vgpu",
    "allocscope.recording": "recording",
    "allocscope.harness": "harness",
    "allocscope.cli": "entry", "allocscope.__main__": "entry", "allocscope": "entry",
    # The framework callbacks: entry points into a run the framework drives.
    "allocscope.integrations": "entry",
    # Imported by a child's interpreter at start-up (as `sitecustomize`), not by allocscope.
    "allocscope.bootstrap": "entry",
}
_ANALYSIS = ["foundation", "capture", "allocator", "attribution", "reports", "interop"]
# What each group may import (itself included). The analysis side is a stack;
# the recording side sits on the foundation, the capture format, the virtual
# GPU and the allocator's settings grammar (the metadata records
# PYTORCH_CUDA_ALLOC_CONF); the harness runs programs under both and reports
# on what they recorded.
ALLOWED = {group: set(_ANALYSIS[:i + 1]) for i, group in enumerate(_ANALYSIS)}
ALLOWED["vgpu"] = {"foundation", "vgpu"}
ALLOWED["recording"] = {"foundation", "capture", "vgpu", "allocator", "recording"}
ALLOWED["harness"] = set(_ANALYSIS) | {"vgpu", "recording", "harness"}
ALLOWED["entry"] = set(ALLOWED) | {"entry"}
# The only modules outside a folder: the package's face and its version.
TOP_LEVEL = {"allocscope", "allocscope.__main__", "allocscope._version"}

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


def _imports(module: str, path: pathlib.Path, *, typing: bool = True) -> list[tuple[str, str, int]]:
    """(imported module, imported name or '', line) of every import of an
    allocscope module, at any depth (lazy imports count; those made for
    annotations only, under `if TYPE_CHECKING:`, unless typing=False)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    tree = ast.parse(path.read_text())
    for node in (ast.walk(tree) if typing else _walk_runtime(tree)):
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


def test_no_loose_modules():
    """Every module but the package's face lives in its stage's folder, so
    the groups above name folders, never files."""
    loose = sorted(m for m in MODULES if m.count(".") == 1 and m not in TOP_LEVEL and m + ".__init__" not in MODULES
                   and not (PKG / m.split(".")[1] / "__init__.py").exists())
    assert not loose, loose
    assert all(g.count(".") <= 1 for g in GROUPS), "groups name folders"


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


def _graph(typing: bool) -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m, p, typing=typing) if t in MODULES and t != m} for m, p in MODULES.items()}


def test_no_import_cycles():
    """Annotation-only imports count too: they are cycles to a reader and to a
    type checker (the allocator's mixins annotate `self` with a Protocol,
    allocator/core.py, not with the class that imports them)."""
    graph = {m: sorted(targets) for m, targets in _graph(True).items()}
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
        if public and module not in ("allocscope.harness.pytest_plugin", "allocscope.bootstrap.sitecustomize"):
            exported = next((n for n in tree.body if isinstance(n, ast.Assign)
                             and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
                             or isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                             and n.target.id == "__all__"), None)
            if exported is None:
                missing.append(f"{module}: no __all__")
                continue
            defined = _top_level_names(tree) | {a.asname or a.name for n in _imports_for_names(tree) for a in n.names}
            missing += [f"{module}: __all__ names {name!r}, which it does not define"
                        for name in ast.literal_eval(exported.value) if name not in defined]
    assert not missing, "\n".join(missing)


def _imports_for_names(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """A module's top-level imports, with those under `if TYPE_CHECKING:` (a
    name the module serves lazily, through its __getattr__, is imported there
    for the type checker)."""
    body = [*tree.body, *(n for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                          and node.test.id == "TYPE_CHECKING" for n in node.body)]
    return [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_the_package_serves_the_harness_lazily():
    """`import allocscope` (a training script's first line) loads neither the
    harness nor the reports: `fit` and the notebook magic come on first use."""
    import subprocess
    import sys

    code = ("import sys, allocscope; loaded = sorted(m for m in sys.modules if m.startswith(('allocscope.harness', "
            "'allocscope.reports', 'allocscope.attribution'))); assert not loaded, loaded; "
            "from allocscope import fit; assert fit.__module__ == 'allocscope.harness.fit'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_allocator_provides_what_its_mixins_use():
    """The mixins' Protocol (allocator/core.py) lists only what
    DeviceAllocator has, with the same parameters."""
    import inspect

    from allocscope.allocator.config import AllocatorConfig
    from allocscope.allocator.core import AllocatorCore
    from allocscope.allocator.model import DeviceAllocator

    allocator = DeviceAllocator(AllocatorConfig())
    for name in AllocatorCore.__annotations__:
        assert hasattr(allocator, name), name
    methods = {n: v.__func__ if isinstance(v, staticmethod) else v for n, v in vars(AllocatorCore).items()
               if not n.startswith("__") and (inspect.isfunction(v) or isinstance(v, staticmethod))}
    assert len(methods) > 10
    for name, method in methods.items():
        want = inspect.signature(method)
        got = inspect.signature(getattr(DeviceAllocator, name))
        assert list(want.parameters) == list(got.parameters), name


def test_the_bootstrap_folder_is_where_children_look():
    from allocscope.common.startup import BOOTSTRAP_DIR

    assert pathlib.Path(BOOTSTRAP_DIR, "sitecustomize.py").is_file()
    assert pathlib.Path(BOOTSTRAP_DIR) == PKG / "bootstrap"


def test_sources_point_only_inside_the_repository():
    outside = re.compile(r"\.\./shared|/work/|\.\./\.\./")
    wrong = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in [*PKG.rglob("*.py"), *(ROOT / "csrc").rglob("*.[ch]*")]
             for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if outside.search(line)]
    assert not wrong, "\n".join(wrong)


def test_the_torch_version_guard_is_defined_once_in_csrc():
    defs = [p.relative_to(ROOT) for p in (ROOT / "csrc").rglob("*.[ch]*")
            if "#define ALLOCSCOPE_TORCH_AT_LEAST" in p.read_text(errors="replace")]
    assert [str(p) for p in defs] == ["csrc/recorder/torch_version.h"]


def test_csrc_has_one_folder_per_binary():
    """setup.py builds each binary from its own folder (and the format they
    share), and every C++ source is built into something."""
    import setup

    products = {"recorder": setup._RECORDER_SOURCES + setup._RECORDER_CUDA_SOURCES + setup._FORMAT_SOURCES,
                "analysis": setup._ANALYSIS_SOURCES,
                "testing": setup._TESTING_SOURCES + setup._TESTING_CUDA_SOURCES}
    for folder, sources in products.items():
        own = {s for s in sources if s.startswith(f"csrc/{folder}/")}
        shared = {s for s in sources if s.startswith("csrc/format/")}
        # The test harness also compiles the recorder's stack walker, to check it.
        borrowed = {"csrc/recorder/pystack.cpp"} if folder == "testing" else set()
        assert set(sources) == own | shared | borrowed, folder
        assert own, folder
    built = {s for sources in products.values() for s in sources}
    built |= {f"csrc/vgpu/{s}" for lib in setup._vgpu_libraries(13) for s in lib[1]}
    built.add("csrc/testing/pystack_harness.cpp")  # built by tests/unit/test_pystack.py, with each Python
    every = {str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cpp")}
    assert every == built, every ^ built
    # The analysis imports nothing of torch's (it runs where torch is absent).
    for path in (ROOT / "csrc" / "analysis").iterdir():
        assert not re.search(r"#include [<\"](torch|c10|ATen)/", path.read_text()), path.name
    # The test harness is no part of the package: no package data, no extension of allocscope's names it.
    assert "testing" not in " ".join(setup._RECORDER_SOURCES + setup._ANALYSIS_SOURCES)


def test_the_public_names_and_entry_points_keep_working():
    """What users type stays where it was when modules move: the package's
    names, the console script, the pytest plugin, `python -m allocscope`."""
    import importlib.metadata
    import subprocess
    import sys

    import allocscope
    from allocscope.cli import main

    for name in ("record", "load", "watch", "mark", "fit", "Recording", "Watch", "Capture", "InputError", "vgpu"):
        assert name in allocscope.__all__ and getattr(allocscope, name) is not None, name
    (plugin,) = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "allocscope"]
    assert plugin.load().__name__ == "allocscope.harness.pytest_plugin"
    (script,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "allocscope"]
    assert script.load() is main
    version = subprocess.run([sys.executable, "-m", "allocscope", "--version"], capture_output=True, text=True)
    assert version.stdout.strip() == f"allocscope {allocscope.__version__}"
