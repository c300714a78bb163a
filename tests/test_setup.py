"""Set-up that says what it does: the public namespace, missing extras, the Numba notices.

- ``dir(householderla)`` lists the public names only (no ``Any``, no ``importlib``);
- a lazily imported adapter whose framework is missing raises ``ModuleNotFoundError`` naming
  the extra (``pip install "householderla[lineax]"``), chained to the original error;
- a NumPy call that would have used the Numba kernels warns once per process
  (:class:`householderla.PerformanceWarning`) when Numba is missing, and still computes;
- the first import of the kernels with a cold cache prints one line to stderr, and none when
  the cache is warm (a stamp next to Numba's cache);
- the install (Makefile, pyproject.toml) takes CPU torch from PyTorch's CPU index only when
  the environment has no torch, and no extra pins torch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

import householderla as hl
import householderla._kernels as K
from householderla._kernels import warm as kernel_warm

ROOT = Path(__file__).resolve().parents[1]


# -- the public namespace ---------------------------------------------------------------------


def test_dir_lists_the_public_names_only():
    names = dir(hl)
    assert names == sorted({*hl.__all__, "torch", "jax", "lineax", "peft"})
    for name in ("Any", "importlib", "_importlib", "annotations", "householder", "_kernels"):
        assert name not in names
    assert not hasattr(hl, "Any") and not hasattr(hl, "importlib")
    for name in hl.__all__:  # everything listed exists (the adapters import on access)
        assert getattr(hl, name) is not None
    assert issubclass(hl.PerformanceWarning, UserWarning)


# -- missing extras ---------------------------------------------------------------------------


def _forget(monkeypatch, adapter: str) -> None:
    """householderla.<adapter> imported afresh on the next access (restored afterwards)."""
    monkeypatch.delitem(sys.modules, f"householderla.{adapter}", raising=False)
    if adapter in vars(hl):  # (hasattr would import it)
        monkeypatch.delattr(hl, adapter)


@pytest.mark.parametrize(
    ("adapter", "blocked", "extra"),
    [
        ("lineax", "equinox", "lineax"),
        ("torch", "torch", "torch"),
        ("jax", "jax", "jax"),
        ("peft", "peft", "peft"),
    ],
)
def test_missing_framework_names_the_extra(monkeypatch, adapter, blocked, extra):
    # a fresh import of the adapter with its framework unimportable
    _forget(monkeypatch, adapter)
    monkeypatch.setitem(sys.modules, blocked, None)
    with pytest.raises(ModuleNotFoundError) as info:
        getattr(hl, adapter)
    message = str(info.value)
    assert f'pip install "householderla[{extra}]"' in message
    assert message.startswith(f"householderla.{adapter} needs ")
    assert blocked in message
    assert info.value.name.split(".")[0] == blocked  # (jax.numpy for jax)
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert info.value.__cause__.name == info.value.name


def test_missing_framework_message_lists_what_the_extra_brings(monkeypatch):
    _forget(monkeypatch, "lineax")
    monkeypatch.setitem(sys.modules, "equinox", None)
    with pytest.raises(ImportError, match=r"needs lineax, equinox and jax \(equinox cannot be"):
        hl.lineax  # noqa: B018


def test_other_import_errors_pass_unchanged(monkeypatch):
    """A missing module that is not the adapter's framework is a bug to see as it is."""
    original = ModuleNotFoundError(
        "No module named 'householderla._gone'", name="householderla._gone"
    )

    def fail(name: str) -> None:
        raise original

    _forget(monkeypatch, "torch")
    monkeypatch.setattr(hl, "_importlib", types.SimpleNamespace(import_module=fail))
    with pytest.raises(ModuleNotFoundError) as info:
        hl.torch  # noqa: B018
    assert info.value is original
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        hl.nothing  # noqa: B018


# -- Numba missing: one PerformanceWarning ----------------------------------------------------


@pytest.fixture
def without_numba(monkeypatch):
    """The kernels' loader as it answers when numba is not installed; the real one after."""
    monkeypatch.delenv("HL_DISABLE_NUMBA", raising=False)
    monkeypatch.setattr(K, "import_kernels", lambda: (None, "installed"))
    monkeypatch.setitem(K._said, "missing", False)
    K.load_numba.cache_clear()
    yield
    K.load_numba.cache_clear()


def _stack() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((16, 4, 4))


def test_missing_numba_warns_once(without_numba):
    V = _stack()
    with pytest.warns(hl.PerformanceWarning, match=r'pip install "householderla\[numba\]"') as rec:
        Q = hl.householder_product(V)
    assert len(rec) == 1
    assert "small matrices" in str(rec[0].message) and "not installed" in str(rec[0].message)
    assert rec[0].filename == __file__  # points at the caller, not into the package
    # the result is still right: the Array API path
    np.testing.assert_allclose(
        np.swapaxes(Q, -1, -2) @ Q, np.broadcast_to(np.eye(4), Q.shape), atol=1e-13
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        K.load_numba.cache_clear()
        hl.householder_product(V)
        hl.householder_apply(V, np.ones((16, 4, 1)))
        hl.cwy(V) @ np.ones((16, 4, 1))


def test_disabled_numba_does_not_warn(without_numba, monkeypatch):
    monkeypatch.setenv("HL_DISABLE_NUMBA", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hl.householder_product(_stack())
    assert not K._said["missing"]


def test_broken_numba_says_so(without_numba, monkeypatch):
    monkeypatch.setattr(K, "import_kernels", lambda: (None, "importable"))
    with pytest.warns(hl.PerformanceWarning, match="Numba is not importable"):
        assert K.load_numba() is None


# -- the first compilation announced ----------------------------------------------------------


@pytest.fixture
def stamp(monkeypatch, tmp_path):
    """Numba's cache directory replaced by an empty one, for the stamp only."""
    path = tmp_path / "householderla-kernels.stamp"
    monkeypatch.setattr(K, "_stamp_path", lambda: path)
    monkeypatch.setitem(K._said, "compile", False)
    return path


def _unimport_kernels(monkeypatch) -> None:
    """The next import of the kernel module runs it afresh, as in a new process (Numba loads
    the compiled code from its cache); the original module is restored afterwards."""
    monkeypatch.delitem(sys.modules, "householderla._kernels.numba", raising=False)
    if "numba" in vars(K):
        monkeypatch.setattr(K, "numba", K.numba)


def test_cold_cache_prints_one_line(stamp, capsys, monkeypatch):
    pytest.importorskip("numba")
    assert K.cold_cache() is not None  # no stamp: cold
    _unimport_kernels(monkeypatch)
    nk, why = K.import_kernels()
    assert nk is not None and why == ""
    err = capsys.readouterr().err
    assert err == K.COMPILE_NOTICE + "\n"
    assert "make warm" in err
    assert stamp.read_text().strip() == K._cache_key()
    assert K.cold_cache() is None  # the stamp written: warm
    stamp.write_text("a key of another Numba or source\n")
    assert K.cold_cache() is not None  # stale
    _unimport_kernels(monkeypatch)
    K.import_kernels()  # cold again, but never a second line in one process
    assert capsys.readouterr().err == ""
    assert stamp.read_text().strip() == K._cache_key()


def test_no_notice_once_the_kernels_are_imported(stamp, capsys):
    """A process that imported the kernel module directly has compiled them already."""
    pytest.importorskip("numba")
    from householderla._kernels import numba as nk

    assert K.cold_cache() is not None
    assert K.import_kernels() == (nk, "")
    assert capsys.readouterr().err == ""
    assert K.cold_cache() is None  # but the stamp is written


def test_warm_cache_prints_nothing(capsys):
    pytest.importorskip("numba")
    if K.load_numba() is None:
        pytest.fail("numba imports but the kernels do not load")
    capsys.readouterr()
    assert K._stamp_path() is not None
    assert K.cold_cache() is None  # this process has loaded them: Numba's cache holds them
    nk, _ = K.import_kernels()
    assert nk is not None and capsys.readouterr().err == ""


def test_a_fresh_process_with_a_warm_cache_says_nothing():
    """End to end: once the kernels are in Numba's cache (and the stamp says so), a new
    process's first NumPy products load them without a word on stderr."""
    pytest.importorskip("numba")
    K.load_numba()  # the kernels in Numba's cache (a cold suite compiles them here)
    assert K.cold_cache() is None
    code = (
        "import numpy as np, householderla as hl\n"
        "V = np.eye(4)[:, :2]\n"
        "print(hl.householder_apply(V, np.ones(4)).tolist())\n"
        "hl.householder_product(np.stack([V, V]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HL_DISABLE_NUMBA"}
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "[-1.0, -1.0, 1.0, 1.0]\n"
    assert run.stderr == ""


def test_warm_compiles_and_runs_every_entry_point(capsys):
    pytest.importorskip("numba")
    assert kernel_warm.main() == 0
    assert re.fullmatch(r"householderla: Numba kernels .* in \d+ s\n", capsys.readouterr().out)


def test_warm_without_numba(monkeypatch, capsys):
    monkeypatch.setattr(kernel_warm, "import_kernels", lambda: (None, "installed"))
    assert kernel_warm.main() == 0
    assert "nothing to compile" in capsys.readouterr().err


def _kernel_imports() -> dict[str, set[str]]:
    """Each ``_kernels/numba*.py`` module's sibling kernel modules, imported directly or
    through others (read off the source: no Numba needed)."""
    import ast

    pkg = Path(K.__file__).parent
    direct = {
        path.stem: {
            n.module
            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module
            if n.module.startswith("numba")
        }
        for path in pkg.glob("numba*.py")
    }
    closure = {}
    for name in direct:
        seen, todo = set(), list(direct[name])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(direct.get(m, ()))
        closure[name] = seen
    return closure


def test_warm_rounds_compile_each_module_once():
    """``make warm``'s two processes never compile the same module: in each round, neither
    half imports (even through others) a module of the other half or of a later round (it
    would compile it a second time, beside the process that owns it); every kernel module
    but the entry module, which loads them all, belongs to one round; and the halves of a
    round name disjoint modules. Broken by moving a kernel to the wrong round."""
    imports = _kernel_imports()
    rounds = [[set(half) for half in r] for r in kernel_warm.ROUNDS]
    named = [m for r in rounds for half in r for m in half]
    assert len(named) == len(set(named))
    # helpers without entry kernels (compiled lazily, inside their callers) may be anywhere
    helpers = {"numba_loops", "numba_taus", "numba_simd"}
    assert set(named) | helpers | {"numba"} == set(imports)
    for i, (a, b) in enumerate(rounds):
        later = {m for r in rounds[i + 1 :] for half in r for m in half}
        for half, other in ((a, b), (b, a)):
            for m in half:
                assert not imports[m] & (other | later), (m, imports[m] & (other | later))


# -- the install ------------------------------------------------------------------------------


def test_no_extra_pins_torch():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    torch_reqs = {
        (extra, req) for extra, reqs in extras.items() for req in reqs if req.startswith("torch")
    }
    assert {extra for extra, _ in torch_reqs} >= {"torch", "test", "bench"}
    assert {req for _, req in torch_reqs} == {"torch>=2.4"}


def test_make_installs_cpu_torch_only_into_an_environment_without_one():
    make = (ROOT / "Makefile").read_text()
    assert "TORCH_INDEX ?= https://download.pytorch.org/whl/cpu" in make
    recipe = make.split("$(STAMP): pyproject.toml Makefile\n", 1)[1].split("\n\n", 1)[0]
    lines = recipe.replace("\\\n", " ").splitlines()
    torch_line = next(line for line in lines if "TORCH_SPEC" in line).strip()
    # the kernels compile in the background (make warm) while torch and the extras install,
    # and the recipe fails if either fails
    assert torch_line.startswith("$(PY) -m householderla._kernels.warm & warm=$$!;")
    assert torch_line.endswith("wait $$warm || rc=1; exit $$rc")
    # the guard first (find_spec: no torch -> exit 1 -> install), then the CPU index, then
    # the default index as the fallback
    torch_step = torch_line.split("{", 1)[1].split("}", 1)[0]
    guard, cpu, fallback = (part.strip().rstrip(";") for part in torch_step.split("||"))
    assert "find_spec('torch') is None" in guard
    assert "--index-url $(TORCH_INDEX)" in cpu and "$(PIP_NET)" in cpu and "--no-deps" in cpu
    assert re.search(r"^PIP_NET +\?= --timeout \d+ --retries \d$", make, re.M)
    assert "--index-url" not in fallback and "$(TORCH_SPEC)" in fallback
    assert any("householderla._kernels.warm" in line for line in lines)
    assert re.search(r"^warm: \$\(STAMP\)$", make, re.M)
