"""The package's layers, read from its import graph (AST; function-level imports included).

``docs/design.rst`` has the picture. "Which layer" is a module's first path component under
``householderla/``; bottom to top::

    0  _lib/                             namespaces, dtypes, checks, linear-algebra shims, jit
    1  _agnostic/ | _kernels/ | _interop/    backend-neutral math | compiled kernels | Dask, DLPack
    2  _autodiff/                        route/call and one rule table per framework
    3  _operator/                        the CWY operator machinery
    4  public modules                    the top-level names ``__init__`` imports
    5  adapters                          the top-level names it does not (torch/, jax/, lineax,
                                         peft/)
    6  __init__

The package top holds ``__init__``, the layer packages and public (unprefixed) modules or
packages only. A module may import from a lower layer, or from its own group of the same layer
(a module of ``_agnostic`` from another one of ``_agnostic``, a public module from another
public module), never upwards and never across the three groups of layer 1. The graph has no
cycle, no private name (``_x``) is imported or read from another module, a module past
``TOPIC_LINES`` says in its docstring why it is one topic, and ``import householderla``
imports no framework.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "householderla"
#: A module is one topic; one longer than this says why in its docstring ("one topic: ...").
TOPIC_LINES = 700

#: The layer packages (a module's first path component) and their (rank, group).
LAYERS = {
    "_lib": (0, "_lib"),
    "_agnostic": (1, "_agnostic"),
    "_kernels": (1, "_kernels"),
    "_interop": (1, "_interop"),
    "_autodiff": (2, "_autodiff"),
    "_operator": (3, "_operator"),
}
#: Modules that may import a framework at module level (they are imported only lazily).
FRAMEWORK_MODULES = {
    "householderla._autodiff.torch": {"torch"},
    "householderla._autodiff.jax": {"jax"},
    "householderla._autodiff._jax_linear": {"jax"},
    "householderla._kernels.numba_loops": {"numba"},
    "householderla.torch": {"torch"},
    "householderla.jax": {"jax"},
    "householderla.lineax": {"jax", "lineax", "equinox"},
    "householderla.torch._optim": {"torch"},
    "householderla.torch._muon": {"torch"},
    "householderla.jax._optax_muon": {"jax"},
    "householderla.torch._param": {"torch"},
    "householderla.torch._layer": {"torch"},
    "householderla.jax._optax": {"jax"},
    "householderla.peft": {"peft"},
    "householderla.peft._registry": {"peft"},
    "householderla.peft._hra": {"torch", "peft"},
    "householderla.peft._oft": {"torch", "peft"},
}
FRAMEWORKS = {
    "torch",
    "jax",
    "jaxlib",
    "cupy",
    "cupyx",
    "numba",
    "dask",
    "lineax",
    "equinox",
    "peft",
    "transformers",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _top_level_imports_of_init() -> set[str]:
    """The first path components that ``householderla/__init__.py`` imports at module level."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
    return out


PUBLIC = _top_level_imports_of_init()


def layer(module: str) -> tuple[int, str]:
    """(rank, group) of a module of the package, from its first path component."""
    parts = module.split(".")[1:]
    if not parts:
        return 6, "__init__"
    head = parts[0]
    if head in LAYERS:
        return LAYERS[head]
    if head.startswith("_"):
        raise AssertionError(
            f"{module}: a private module at the package top; put it in a layer package"
        )
    return (4, "public") if head in PUBLIC else (5, "adapters")


def _resolve_from(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    is_pkg = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in ``module``,
    function-level ones included; names that are submodules are reported as modules."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, None, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            src = _resolve_from(module, node)
            for a in node.names:
                sub = f"{src}.{a.name}"
                if sub in MODULES:
                    out.append((sub, None, node.lineno))
                else:
                    out.append((src, a.name, node.lineno))
    return out


def _internal(target: str) -> str | None:
    """The package module an import refers to (None outside the package)."""
    while target and target not in MODULES:
        if "." not in target:
            return None
        target = target.rsplit(".", 1)[0]
    return target or None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for target, _, _ in imports(m):
            t = _internal(target)
            if t is not None and t != m:
                graph[m].add(t)
    return graph


def test_every_module_is_in_a_layer():
    for m in MODULES:
        layer(m)


def test_imports_point_down_the_layers():
    bad = []
    for m in MODULES:
        rank, group = layer(m)
        for target, _, line in imports(m):
            t = _internal(target)
            if t is None or t == m:
                continue
            trank, tgroup = layer(t)
            if m.startswith(t + ".") and MODULES[t].name == "__init__.py" and trank == rank:
                continue  # a module of a package may use its package's __init__
            if trank > rank or (trank == rank and tgroup != group):
                bad.append(f"{m}:{line} imports {t} (layer {trank} {tgroup} > {rank} {group})")
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t) :] + [t]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_name_crosses_a_module():
    bad = []
    for m in MODULES:
        tree = ast.parse(MODULES[m].read_text(encoding="utf-8"))
        module_aliases = set()
        for target, name, line in imports(m):
            t = _internal(target)
            if t is not None and name is not None and _private(name):
                bad.append(f"{m}:{line} imports {name} from {t}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    src = _resolve_from(m, node) if isinstance(node, ast.ImportFrom) else ""
                    full = f"{src}.{a.name}" if src else a.name
                    if full in MODULES:
                        module_aliases.add(a.asname or a.name)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases
                and _private(node.attr)
            ):
                bad.append(f"{m}:{node.lineno} reads {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def long_modules_without_reason(modules: dict[str, Path]) -> dict[str, int]:
    """Modules past ``TOPIC_LINES`` whose docstring does not say why they are one topic."""
    out = {}
    for m, p in modules.items():
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > TOPIC_LINES and "one topic:" not in _docstring(p).lower():
            out[m] = n
    return out


def test_long_modules_say_why_they_are_one_topic():
    bad = long_modules_without_reason(MODULES)
    assert not bad, (
        f"modules over {TOPIC_LINES} lines without 'One topic: <why>' in their docstring: {bad}"
    )


def test_the_topic_rule_can_fail(tmp_path):
    long = tmp_path / "long.py"
    long.write_text('"""A module."""\n' + "x = 1\n" * (TOPIC_LINES + 1), encoding="utf-8")
    assert long_modules_without_reason({"long": long}) == {"long": TOPIC_LINES + 2}
    long.write_text('"""A module.\n\nOne topic: why."""\n' + "x = 1\n" * TOPIC_LINES)
    assert long_modules_without_reason({"long": long}) == {}


#: Numeric module constants that are not tuning: a kernel's structure, a library's default,
#: a tolerance or an iteration bound of a proof. Every other one lives in ``_lib/tuning.py``.
NOT_TUNING = {
    "LANES",  # _kernels/numba_simd: one 512-bit vector of float64
    "FRESH_PAGES_BYTES",  # _lib/linalg: glibc's default M_MMAP_THRESHOLD
    "JAX_ALIGNMENT",  # _interop/dlpack: the alignment JAX requires
    "DRIFT_FACTOR",  # retractions: Cayley's drift tolerance, in units of √M·eps
    "SMW_CHECK",  # _agnostic/retraction: Cayley's output check, in units of √M·eps
    "CERT_CUSHION",  # _agnostic/polar_schedules: the certified schedule's margin
    "DEFAULT_STEPS",  # _agnostic/fixed_polar: an argument's default
    "MAX_STEPS",  # _agnostic/fixed_polar: an argument's bound
    "MAX_ITERS",  # _agnostic/ns_bounds: the convergence proof's iteration bound
    "MAX_PROGRAMS",  # _lib/jit: a bound on the compiled programs kept (memory, not speed)
    "LAZY_ITERS",
    "LAZY_RESTART_ITERS",
    "_FAR",  # _agnostic/newton_schulz: a correction that can exceed 1 (rounding, not speed)
    "_DIVERGED",  # _agnostic/polar_schedules: where a model interval counts as unbounded
}
TUNING = "householderla._lib.tuning"


def numeric_constants(modules: dict[str, Path]) -> list[str]:
    """``NAME = <number or arithmetic of numbers and names>`` at module level."""
    out = []
    for m, p in modules.items():
        for node in ast.parse(p.read_text(encoding="utf-8")).body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            t = node.targets[0]
            if not (isinstance(t, ast.Name) and t.id.isupper()):
                continue
            leaves = [n for n in ast.walk(node.value) if isinstance(n, ast.Constant)]
            allowed = (ast.Constant, ast.Name, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)
            if leaves and all(
                isinstance(n, allowed) or isinstance(n, ast.Load) for n in ast.walk(node.value)
            ):
                if all(isinstance(c.value, (int, float)) for c in leaves):
                    out.append(f"{m}.{t.id}")
    return out


def test_every_tuning_constant_is_in_the_tuning_module():
    bad = [
        c
        for c in numeric_constants(MODULES)
        if not c.startswith(TUNING + ".") and c.rsplit(".", 1)[1] not in NOT_TUNING
    ]
    assert not bad, f"thresholds outside {TUNING} (one line each there): {bad}"
    tuning = MODULES[TUNING].read_text(encoding="utf-8").splitlines()
    assigned = [line for line in tuning if line[:1].isupper() and " = " in line]
    assert len(assigned) == len(numeric_constants({TUNING: MODULES[TUNING]})) > 20
    for line in assigned:
        assert "  # " in line and "results/" in line, f"say what it decides and where: {line}"


def test_the_tuning_rule_can_fail(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("BLOCK = 64\nMIN_L = 2 * BLOCK\nMODES = ('a', 'b')\nLANES = 8\n")
    assert numeric_constants({"m": mod}) == ["m.BLOCK", "m.MIN_L", "m.LANES"]


def test_public_namespaces_list_only_public_names():
    """Every public module (and adapter) has ``__all__`` and a ``__dir__`` that lists it, so
    ``dir(hl.vjp)`` shows no ``np`` / ``K`` / ``P`` (read from the source: the adapters import
    frameworks); the modules ``__init__`` imports are checked by ``dir`` too."""
    import importlib

    tops = {m for m in MODULES if m.count(".") == 1 and not m.split(".")[1].startswith("_")}
    assert {"householderla.torch", "householderla.vjp", "householderla.lineax"} <= tops
    for m in sorted(tops):
        body = ast.parse(MODULES[m].read_text(encoding="utf-8")).body
        names = {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets} | {
            n.name for n in body if isinstance(n, ast.FunctionDef)
        }
        assert {"__all__", "__dir__"} <= names, f"{m}: define __all__ and __dir__"
        if m.split(".")[1] in PUBLIC:
            mod = importlib.import_module(m)
            assert dir(mod) == sorted(mod.__all__), m
            assert all(hasattr(mod, n) for n in mod.__all__), m


#: Most lines a private module's docstring may have: the math and the rule in words; the
#: figures and run histories live in ``benchmarks/results/`` (``tuning.md``).
PRIVATE_DOC_LINES = 10


def _is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split(".")[1:])


def long_private_docstrings(modules: dict[str, Path]) -> dict[str, int]:
    out = {}
    for m, p in modules.items():
        n = len(_docstring(p).splitlines())
        if _is_private(m) and n > PRIVATE_DOC_LINES:
            out[m] = n
    return out


def test_private_module_docstrings_are_short():
    bad = long_private_docstrings(MODULES)
    assert not bad, f"private module docstrings over {PRIVATE_DOC_LINES} lines: {bad}"


def test_the_docstring_rule_can_fail(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text('"""' + "line\n" * 11 + '"""\n', encoding="utf-8")
    assert long_private_docstrings({"householderla._lib.m": mod}) == {"householderla._lib.m": 11}
    assert long_private_docstrings({"householderla.m": mod}) == {}  # public: the API's docs


TIMING = re.compile(r"\d+(\.\d+)? ?(ms|µs|us)\b")


def timings(modules: dict[str, Path]) -> list[str]:
    """``module:line`` of every measured time (ms, µs, us) in the source of ``modules``."""
    return [
        f"{m}:{i}"
        for m, p in modules.items()
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if TIMING.search(line)
    ]


def test_no_measured_timings_in_the_package():
    """Figures live in ``benchmarks/results/`` (``tuning.md``), not in the code."""
    bad = timings(MODULES)
    assert not bad, f"measured timings in package source: {bad}"


def test_the_timing_rule_can_fail(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("# took 1.5 ms\n# 3 µs a call\nx = 2  # 4 ms\n# 9 mss, mus\n", encoding="utf-8")
    assert timings({"m": mod}) == ["m:1", "m:2", "m:3"]


def test_adapters_are_not_imported_by_init():
    """torch/ and jax/ (and lineax) import a framework: ``__init__`` must not import them."""
    assert {"torch", "jax", "lineax", "peft"}.isdisjoint(PUBLIC)
    assert {"cwy", "householder", "lapack", "ornn", "svd", "retractions", "stiefel"} <= PUBLIC


def test_frameworks_only_where_allowed_at_module_level():
    bad = []
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        allowed = FRAMEWORK_MODULES.get(m, set())
        for node in tree.body:
            nodes = [node]
            if isinstance(node, ast.Try):  # "try: import numba"
                nodes = node.body
            for n in nodes:
                names = []
                if isinstance(n, ast.Import):
                    names = [a.name for a in n.names]
                elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                    names = [n.module]
                for name in names:
                    top = name.split(".")[0]
                    if top in FRAMEWORKS and top not in allowed:
                        bad.append(f"{m}:{n.lineno} imports {name} at module level")
    assert not bad, "\n".join(bad)


@functools.cache
def _frameworks_loaded(product: bool) -> frozenset[str]:
    """The frameworks in ``sys.modules`` of a fresh interpreter after ``import householderla``
    (and, with ``product``, a NumPy product): one subprocess per variant (~5 s each on the
    2-core CI), shared by the cases of the test below, which read one framework each."""
    step = "householderla.cwy(np.eye(3)[:, :2]) @ np.ones(3); " if product else ""
    code = (
        f"import sys, householderla, numpy as np; {step}"
        f"print(','.join(sorted(m for m in {sorted(FRAMEWORKS)!r} if m in sys.modules)))"
    )
    run = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return frozenset(m for m in run.stdout.strip().split(",") if m)


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS - {"jaxlib", "cupyx"}))
def test_import_householderla_imports_no_framework(framework):
    # a NumPy product may load numba (the sequential kernels): only the import for numba
    loaded = _frameworks_loaded(product=framework != "numba")
    assert framework not in loaded, (
        f"import householderla (and a NumPy product) imported {framework}"
    )


def test_a_private_module_at_the_top_is_in_no_layer():
    with pytest.raises(AssertionError, match="private module at the package top"):
        layer("householderla._helper")


def test_the_layer_test_can_fail(monkeypatch):
    """A climbing import is caught: the public module ``cwy`` seen from ``_lib``."""
    fake = "householderla._lib.fake"
    monkeypatch.setitem(MODULES, fake, PACKAGE / "_lib" / "__init__.py")
    original = imports

    def with_climb(module: str) -> list[tuple[str, str | None, int]]:
        if module == fake:
            return [("householderla.cwy", None, 1)]
        return original(module)

    monkeypatch.setattr(sys.modules[__name__], "imports", with_climb)
    with pytest.raises(AssertionError, match=r"imports householderla\.cwy"):
        test_imports_point_down_the_layers()
