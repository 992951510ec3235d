"""The layout holds: product and lab apart, one-way imports, no hidden configuration.

* no import cycle between the project's files (module-level and function-level imports alike);
* `kernels/` is the product only: at most 16 files, no ``__main__`` block, no environment
  read, no shell script; no library module (`ioaware`, `kernels`, `sim`) writes ``os.environ``;
* `sim` imports neither `kernels` nor `benchmarks`; nothing in the product imports `benchmarks`
  or `dashboard`;
* the README stays an entry point (at most 300 lines); `results/` holds at most 25 files, each
  listed in `results/README.md`.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ioaware", "kernels", "sim", "benchmarks", "dashboard")
LIBRARY = ("ioaware", "kernels", "sim")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages."""
    mods = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


def _imports(name: str, path: Path, modules=()):
    """(line, imported dotted name) of every import in a file, relative ones resolved; ``from
    package import module`` names the module only (when it is one of ``modules``)."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                prefix = base[:len(base) - node.level + 1]
                mod = ".".join(prefix + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = [f"{mod}.{alias.name}" for alias in node.names]
            if not all(x in modules for x in subs):
                yield node.lineno, mod
            for x in subs:                      # `from pkg import module`
                if x in modules:
                    yield node.lineno, x
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            yield node.lineno, str(node.args[0].value)  # importlib.import_module("pkg.module")


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        for _, target in _imports(m, path, mods):
            if target in mods and target != m:
                graph[m].add(target)
    return graph


def test_no_import_cycle_between_files():
    graph = _graph()
    assert len(graph) > 40
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, cycles[:5]


def test_the_layers_import_one_way():
    """sim imports neither kernels nor benchmarks; the product (ioaware, kernels, sim) never
    imports the lab (benchmarks) or the dashboard."""
    bad = []
    mods = _modules()
    for m, path in mods.items():
        top = m.split(".")[0]
        for line, target in _imports(m, path, mods):
            t = target.split(".")[0]
            if (top == "sim" and t in ("kernels", "benchmarks")) or \
                    (top in LIBRARY and t in ("benchmarks", "dashboard")):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, bad


def test_kernels_is_the_product_only():
    files = sorted(p.name for p in (ROOT / "kernels").iterdir()
                   if p.is_file() and not p.name.endswith(".pyc"))
    assert all(f.endswith(".py") for f in files), files
    # every module is imported by the package itself or used as a library (``from kernels
    # import x`` / ``kernels.x``) by the tests or the lab: nothing is run as a script
    imported = set()
    for folder in ("kernels", "ioaware", "sim", "benchmarks", "tests"):
        for f in (ROOT / folder).glob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 1 and folder == "kernels":
                    if node.module:
                        imported.add(node.module.split(".")[0] + ".py")
                    else:
                        imported.update(a.name + ".py" for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module == "kernels":
                    imported.update(a.name + ".py" for a in node.names)
                elif isinstance(node, (ast.ImportFrom, ast.Import)):
                    names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                    imported.update(n.split(".")[1] + ".py" for n in names
                                    if n and n.startswith("kernels.") and n.count(".") >= 1)
    assert set(files) - {"__init__.py"} <= imported, sorted(set(files) - {"__init__.py"} - imported)
    for f in (ROOT / "kernels").glob("*.py"):
        text = f.read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) \
                    and node.left.id == "__name__":
                raise AssertionError(f"{f.name}: a __main__ block")
        assert "os.environ" not in text and "getenv" not in text, f"{f.name} reads the environment"


def test_no_library_module_writes_the_environment():
    bad = []
    for pkg in LIBRARY:
        for f in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                target = None
                if isinstance(node, (ast.Assign, ast.AugAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    target = next((t for t in targets if isinstance(t, ast.Subscript)
                                   and ast.unparse(t.value) == "os.environ"), None)
                elif isinstance(node, ast.Call) and ast.unparse(node.func) in (
                        "os.environ.setdefault", "os.environ.update", "os.environ.pop",
                        "os.putenv", "os.unsetenv"):
                    target = node
                if target is not None:
                    bad.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    assert not bad, bad


def test_readme_is_an_entry_point():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)


def test_results_hold_current_evidence_each_listed():
    files = sorted(p.name for p in (ROOT / "results").iterdir() if p.is_file())
    assert "README.md" in files
    assert len(files) <= 25, files
    listing = (ROOT / "results" / "README.md").read_text()
    missing = [f for f in files if f != "README.md" and f"`{f}`" not in listing]
    assert not missing, f"not listed in results/README.md: {missing}"
