"""The ``bk`` fixture: one parametrisation over every array backend, and ``require`` for the
tests that need one framework.

``HL_TEST_BACKENDS`` (comma-separated) names the backends that must run; a named backend
that cannot be imported fails the run instead of silently dropping out. Unset, every known
backend runs if importable and is reported as skipped otherwise.

Backends: numpy, numpy_readonly (inputs are read-only NumPy arrays: any write into a user
array raises), array_api_strict, torch (CPU), torch_cuda, jax_gpu and cupy (when a GPU is present),
jax (x64, eager), jax_jit (every call under ``jax.jit``) and dask (Dask arrays wrapping NumPy, as
operands of operators built on NumPy: see ``Backend.param``; lazy, so ``eager=False``).

Dask is an operand backend: the library takes a Dask array as the right (or left) operand of an
operator's ``@`` and nowhere else. A test whose operations take no Dask operand carries
``@pytest.mark.no_dask("why")`` (or a module ``pytestmark``): its dask case is reported as
skipped with that reason, never silently dropped.

Framework-specific tests (the torch and JAX adapters, optax, DLPack, the Numba kernels, mixed
namespaces) call ``require("torch")`` (at module level or in the test) instead of
``pytest.importorskip``: it fails when a backend needing the framework is requested in
``HL_TEST_BACKENDS`` but the import fails, and skips with the reason otherwise (the framework's
backends not requested, or ``HL_TEST_BACKENDS`` unset and the framework not installed).

Test time (``make test`` vs ``make test-long``). ``HL_TEST_LONG=1`` selects the "long" hypothesis
profile (more examples), runs the tests marked ``long`` (skipped, with the reason, otherwise) and
lets the property tests draw their full shape ranges on backends that compile per shape
(``Backend.compiles``: JAX), which otherwise draw from a few fixed shapes (``few_shapes``) so the
compilations are cached across examples and tests. Outside ``make test-long``, JAX (whose time is
compiling and tracing: ~95% of the suite's time) also runs less of the matrix, with every case
still run on JAX once and the full matrix in ``make test-long``:

- jax / jax_jit split (``pytest_collection_modifyitems``): a ``bk``-parametrised test with more
  than one case per backend runs each case on one of jax and jax_jit (alternating over its
  cases, so both run some); a test with one case per backend keeps both, unless marked
  ``jax_split``.
  ``@pytest.mark.jax_both("why")`` keeps every case on both.
- hypothesis on JAX (``pytest_runtest_call``): a property test's JAX cases draw
  ``jax_examples(n)`` of its ``n`` examples (the first ones of the same derandomized sequence),
  all examples on the other backends.
- ``Backend.call`` under jax_jit reuses one jitted wrapper for functions of the same code and the
  same closed-over values (fresh lambdas per call otherwise retrace and recompile every call).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _share_cores_between_workers() -> None:
    """Under pytest-xdist, each worker's BLAS, OpenMP (torch), Numba and XLA pools get
    cores / workers threads (before numpy, torch or jax is imported; explicit settings win).
    Two workers of two threads each on two cores oversubscribe them, and spinning OpenMP
    threads then make small torch ops ~50× slower (measured: torch adapter tests 3× the CPU
    time, the suite 1.5× the wall time on a shared 2-core machine)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2:
        return
    n = str(max(1, (os.cpu_count() or 1) // workers))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(var, n)
    xla = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in xla:
        # (a bare "intra_op_parallelism_threads=n", often quoted with it, is no XLA flag: XLA
        # stops reading XLA_FLAGS there, dropping every flag after it)
        os.environ["XLA_FLAGS"] = f"{xla} --xla_cpu_multi_thread_eigen=false".strip()
    # a plugin may have imported NumPy already, and OpenBLAS reads its variable when loaded:
    # two OpenBLAS threads per worker stayed (measured: a tall QR's dorgqr ~20× slower under
    # the other worker's load, one polar test 77 s instead of 0.3 s), so limit them directly
    try:
        import threadpoolctl
    except ImportError:  # pragma: no cover - the bench extra brings it
        return
    _LIMITS.append(threadpoolctl.threadpool_limits(int(os.environ["OPENBLAS_NUM_THREADS"])))


_LIMITS: list[Any] = []
_share_cores_between_workers()


def _fast_xla_compiles() -> None:
    """The suite's JAX programs are tiny and each compiles once: compiling dominates (measured
    ~60% of the suite's CPU time), so LLVM's optimisations are switched off for the tests
    (``--xla_backend_optimization_level=0``, no expensive passes): the JAX-heavy modules ran
    22% faster with the same results. XLA's CPU fusion emitters (MLIR-based code generation
    for fused loops) are switched off too (``--xla_cpu_use_fusion_emitters=false``: the older
    elemental emitters): compiling 160 small eager programs took 4.6–7.4 s instead of 14–15 s
    (JAX 0.10.2, 2-core VM), the lineax operator test 8.7 s of compiling instead of 15.8 s.
    Float semantics are unchanged (no fast-math either way). The XLA of jaxlib 0.11 has no
    fusion-emitter flag and aborts the process on an unknown one ("Unknown flag in
    XLA_FLAGS", JAX 0.11.2: every worker that used JAX crashed), so it is set for an older
    jaxlib only. ``HL_TEST_XLA_OPT=1`` or explicit ``XLA_FLAGS`` settings keep XLA's
    defaults."""
    xla = os.environ.get("XLA_FLAGS", "")
    if os.environ.get("HL_TEST_XLA_OPT") or "optimization_level" in xla:
        return
    flags = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    if _jaxlib_below((0, 11)):
        flags += " --xla_cpu_use_fusion_emitters=false"
    os.environ["XLA_FLAGS"] = f"{xla} {flags}".strip()


def _jaxlib_below(version: tuple[int, int]) -> bool:
    """Whether an installed jaxlib is older than ``version`` (read from its metadata: JAX must
    not be imported before XLA_FLAGS is set); False without jaxlib."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        have = installed("jaxlib")
    except PackageNotFoundError:
        return False
    return major_minor(have) < version


def major_minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "2.11.0+cu130" or "0.11.2"."""
    major, minor = re.findall(r"\d+", version)[:2]
    return int(major), int(minor)


_fast_xla_compiles()


def _pin_jax_matmul_precision() -> None:
    """JAX's float32 (and complex64) matmuls default to TF32 on a GPU (10-bit mantissa): the
    suite pins "highest" (DESIGN.md: pin precision in tests), as the library's own rules do,
    so a test that compares to float64 NumPy on the CPU states float32's accuracy on the GPU
    too. On the CPU XLA multiplies in full precision either way. Explicit settings win."""
    os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")


_pin_jax_matmul_precision()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

#: ``make test-long``: the long hypothesis profile, the ``long`` tests, full shape ranges on JAX
LONG = os.environ.get("HL_TEST_LONG", "") not in ("", "0")

settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,  # first calls under jax.jit compile
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# `make fuzz`: the same properties with many more examples (minutes), random per run
settings.register_profile(
    "fuzz",
    max_examples=1500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile("long", settings.get_profile("ci"), max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "long" if LONG else "ci"))

KNOWN = (
    "numpy",
    "numpy_readonly",
    "array_api_strict",
    "torch",
    "jax",
    "jax_jit",
    "torch_cuda",
    "jax_gpu",
    "cupy",
    "dask",
)
REQUESTED = [b for b in os.environ.get("HL_TEST_BACKENDS", "").split(",") if b]
unknown = sorted(set(REQUESTED) - set(KNOWN))
if unknown:
    raise pytest.UsageError(f"HL_TEST_BACKENDS names unknown backends {unknown}; known: {KNOWN}")


@dataclass
class Backend:
    """How tests create, call and read arrays of one backend."""

    name: str
    xp: Any
    _asarray: Callable[[np.ndarray], Any]
    eager: bool = True
    jit: Callable[[Callable], Callable] | None = None
    #: Dask: arrays of this backend are operands only; operators are built from NumPy
    operand_only: bool = False

    @property
    def compiles(self) -> bool:
        """JAX compiles every new shape (each op eagerly, each function under jit): property
        tests draw few shapes here so the compilations are shared (see ``helpers.few_shapes``)."""
        return self.name.startswith("jax")

    def asarray(self, a: Any, dtype: Any = np.float64) -> Any:
        a = np.array(a, dtype=dtype)
        return self._asarray(a)

    def param(self, a: Any, dtype: Any = np.float64) -> Any:
        """An operator's parameter (V, U, σ, …): the backend's array, except on an operand-only
        backend (dask), where operators are built eagerly from NumPy and only ``@`` operands
        (``asarray``) are Dask arrays."""
        a = np.array(a, dtype=dtype)
        return a if self.operand_only else self._asarray(a)

    def call(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)``, under ``jax.jit`` for the jax_jit backend; for dask, asserting that
        building the result runs no Dask task (products with Dask operands are lazy)."""
        if self.jit:
            return _jitted(self.jit, fn)(*args)
        if self.operand_only:
            return _lazy_call(fn, *args)
        return fn(*args)

    def __repr__(self) -> str:
        return self.name


_JITTED: dict[Any, Callable] = {}


def _typed(v: Any) -> Any:
    """``v`` tagged with its type, through tuples (``1 == 1.0 == True`` are one dict key)."""
    if isinstance(v, tuple):
        return (type(v), tuple(_typed(x) for x in v))
    return (type(v), v)


def _jitted(jit: Callable[[Callable], Callable], fn: Callable) -> Callable:
    """``jit(fn)``, one wrapper per function *behaviour*: ``jax.jit`` caches traces by function
    identity, so ``bk.call(lambda ...)`` in a loop or a property test (a fresh function object
    per call) retraced, lowered and compiled again on every call. Two plain functions with the
    same code, defaults, globals and closed-over values (equal, of the same type) compute the
    same thing, so they share one wrapper; a closure over an unhashable value (an array) or any
    other callable gets ``jit(fn)`` as before. The cache is emptied before every test (a
    monkeypatched module constant read at trace time must not meet a trace of the same code
    made before the patch)."""
    key: Any = fn
    code = getattr(fn, "__code__", None)
    if code is not None and hasattr(fn, "__globals__"):
        try:
            cells = _typed(tuple(c.cell_contents for c in fn.__closure__ or ()))
            kw = _typed(tuple(sorted((fn.__kwdefaults__ or {}).items())))
            key = (jit, code, id(fn.__globals__), _typed(fn.__defaults__), kw, cells)
            hash(key)
        except (TypeError, ValueError):  # unhashable closed-over value; an empty cell
            return jit(fn)
    else:
        try:
            key = (jit, fn)
            hash(key)
        except TypeError:
            return jit(fn)
    if key not in _JITTED:
        _JITTED[key] = jit(fn)
    return _JITTED[key]


def _lazy_call(fn: Callable, *args: Any) -> Any:
    from dask.callbacks import Callback

    ran: list[Any] = []
    with Callback(pretask=lambda key, dsk, state: ran.append(key)):
        out = fn(*args)
    assert not ran, f"{len(ran)} Dask task(s) ran while the result was built: it must be lazy"
    return out


def to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    if type(x).__module__.startswith("cupy"):
        return x.get()
    if type(x).__module__.startswith("dask"):
        return np.asarray(x.compute(scheduler="threads"))
    return np.asarray(x)


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def _make(name: str) -> Backend:
    import array_api_compat as aac

    if name == "numpy":
        return Backend(name, aac.array_namespace(np.empty(0)), lambda a: a)
    if name == "numpy_readonly":
        return Backend(name, aac.array_namespace(np.empty(0)), _readonly)
    if name == "array_api_strict":
        import array_api_strict as xps

        return Backend(name, xps, xps.asarray)
    if name in ("torch", "torch_cuda"):
        import torch

        dev = "cpu"
        if name == "torch_cuda":
            if not torch.cuda.is_available():
                raise ImportError("torch has no CUDA device")
            dev = "cuda"
        return Backend(
            name, aac.array_namespace(torch.empty(0)), lambda a: torch.asarray(a, device=dev)
        )
    if name in ("jax", "jax_jit"):
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp

        if name == "jax":
            return Backend(name, jnp, jnp.asarray)
        return Backend(name, jnp, jnp.asarray, eager=False, jit=jax.jit)
    if name == "jax_gpu":
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp

        try:
            gpu = jax.devices("gpu")[0]
        except RuntimeError as exc:
            raise ImportError(f"jax has no GPU: {exc}") from exc
        return Backend(name, jnp, lambda a: jax.device_put(jnp.asarray(a), gpu))
    if name == "cupy":
        import cupy

        if not cupy.is_available():
            raise ImportError("cupy has no GPU")
        return Backend(name, aac.array_namespace(cupy.empty(0)), cupy.asarray)
    if name == "dask":
        import array_api_compat.dask.array as dxp
        import dask.array as da

        # chunks of 2 along every axis: the products run chunk by chunk, and contracted axes
        # split in chunks exercise the rechunking
        return Backend(
            name, dxp, lambda a: da.from_array(a, chunks=2), eager=False, operand_only=True
        )
    raise AssertionError(name)


_CACHE: dict[str, Backend | BaseException] = {}


def get_backend(name: str) -> Backend:
    if name not in _CACHE:
        try:
            _CACHE[name] = _make(name)
        except ImportError as exc:
            _CACHE[name] = exc
    b = _CACHE[name]
    if isinstance(b, BaseException):
        if name in REQUESTED:
            pytest.fail(f"backend {name!r} was requested in HL_TEST_BACKENDS but: {b}")
        pytest.skip(f"backend {name} not available: {b}")
    return b


PARAMS = REQUESTED or list(KNOWN)
LAZY = ("jax_jit", "dask")


@pytest.fixture(scope="session", params=PARAMS)
def bk(request: pytest.FixtureRequest) -> Backend:
    """Every backend (see module docstring)."""
    return get_backend(request.param)


@pytest.fixture(scope="session", params=[p for p in PARAMS if p not in LAZY])
def bk_eager(request: pytest.FixtureRequest) -> Backend:
    """Every backend whose values can be inspected (value checks are eager-only: not jax_jit,
    not dask)."""
    return get_backend(request.param)


# -- frameworks needed by framework-specific tests ---------------------------------------------

#: framework (top-level package) -> the backends that need it: a test needing the framework
#: must run (and fails if it cannot import it) when one of them is requested. Numba
#: accelerates the NumPy backend's sequential products, so NumPy requires it.
FRAMEWORKS = {
    "torch": ("torch", "torch_cuda"),
    "jax": ("jax", "jax_jit", "jax_gpu"),
    # the lineax adapter (householderla.lineax) is part of the JAX support
    "lineax": ("jax", "jax_jit", "jax_gpu"),
    # the PEFT adapters (householderla.peft) are part of the torch support
    "peft": ("torch", "torch_cuda"),
    "transformers": ("torch", "torch_cuda"),
    "dask": ("dask",),
    "cupy": ("cupy",),
    "array_api_strict": ("array_api_strict",),
    "numba": ("numpy", "numpy_readonly"),
}


def require(module: str) -> Any:
    """Import ``module`` (e.g. ``"torch"``, ``"dask.distributed"``) for a framework-specific
    test or module, as ``pytest.importorskip`` would, but by the backends requested: fails if a
    backend needing the framework is requested in ``HL_TEST_BACKENDS`` and the import fails;
    skips (with the reason) if ``HL_TEST_BACKENDS`` requests none of them, or if it is unset and
    the import fails. Callable at module level."""
    top = module.split(".")[0]
    needing = [b for b in FRAMEWORKS[top] if b in REQUESTED]
    if REQUESTED and not needing:
        pytest.skip(
            f"{top}: none of the backends {FRAMEWORKS[top]} that need it is requested in "
            f"HL_TEST_BACKENDS",
            allow_module_level=True,
        )
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if needing:
            pytest.fail(
                f"{module} cannot be imported, but backend(s) {needing} requested in "
                f"HL_TEST_BACKENDS need it: {exc}",
                pytrace=False,
            )
        pytest.skip(f"{module} not available: {exc}", allow_module_level=True)


#: Feature floors above the package's ``torch>=2.4`` (the core is tested on 2.4.1, 2.6.0,
#: 2.11.0 and CI's 2.13.0; ``docs/install.rst``): the public DTensor API
#: (``torch.distributed.tensor``) that the row-sharded optimizers use; ``torch.compile``
#: (dynamo's tracing and graph breaks change between releases) and FSDP2's ``fully_shard`` on
#: CPU processes (torch 2.6 fails inside it), tested on 2.11 and 2.13.
TORCH_FLOORS = {"dtensor": (2, 6), "compile": (2, 11), "fsdp_cpu": (2, 11)}


def torch_below(feature: str) -> str | None:
    """Why ``feature`` is skipped with the torch installed (below its floor), or None."""
    import torch

    floor = TORCH_FLOORS[feature]
    if major_minor(torch.__version__) >= floor:
        return None
    return f"{feature} is tested on torch >= {floor[0]}.{floor[1]}; this is {torch.__version__}"


_JAX_CACHE = pytest.StashKey[str]()
_RUN_DIR = pytest.StashKey[str]()
#: the environment variable naming the run's shared folder (:func:`once_per_run`)
RUN_DIR = "HL_TEST_RUN_DIR"


def _reuse_mlir_contexts(uses: int = 256) -> None:
    """JAX lowers every program it compiles (each eager operation on a new shape too) in a
    fresh MLIR context, and creating one loads every dialect: ~4.5 ms, a fifth of compiling a
    small program. The suite compiles tens of thousands, so each process here hands out one
    context for ``uses`` lowerings (the programs, hence the results, are the same; the
    context's uniqued types and constants are dropped with it). Measured on the JAX cases of
    test_vjp and test_svd: 18% less CPU time, peak memory 1.1 GB instead of 3.0 GB. A JAX
    without ``make_ir_context``, or ``HL_TEST_FRESH_MLIR=1``, keeps JAX's own behaviour."""
    if os.environ.get("HL_TEST_FRESH_MLIR") or importlib.util.find_spec("jax") is None:
        return
    from jax._src.interpreters import mlir

    make = getattr(mlir, "make_ir_context", None)
    if make is None or getattr(make, "_hl_shared", False):
        return
    from jax._src.lib.mlir import ir

    lock, state = threading.Lock(), {"context": None, "left": 0}

    def shared() -> Any:
        with lock:
            if state["context"] is not None and ir.Context.current is state["context"]:
                return make()  # a program lowered while lowering another (equinox does): its own
            if state["left"] == 0:
                state["context"], state["left"] = make(), uses
            state["left"] -= 1
            return state["context"]

    shared._hl_shared = True  # type: ignore[attr-defined]
    mlir.make_ir_context = shared


def pytest_configure(config: pytest.Config) -> None:
    """One JAX compilation cache on disk for the run, shared by the xdist workers (they inherit
    the environment): most of the suite's time on JAX is XLA compiling, and identical programs
    recur across tests (check_grads' fresh closures, the same op on the same shapes) and across
    the workers. Measured on the JAX adapter and SVD tests: 13 % less CPU time. The cache is
    removed at the end; set ``JAX_COMPILATION_CACHE_DIR`` to keep one across runs instead."""
    config.addinivalue_line(
        "markers", "jax_both(reason): every case runs on both jax and jax_jit in `make test`"
    )
    _reuse_mlir_contexts()
    if not os.environ.get("PYTEST_XDIST_WORKER") and RUN_DIR not in os.environ:
        os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="hl-test-run-")
        config.stash[_RUN_DIR] = os.environ[RUN_DIR]
    if os.environ.get("PYTEST_XDIST_WORKER") or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    path = tempfile.mkdtemp(prefix="hl-test-jax-cache-")
    config.stash[_JAX_CACHE] = path
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def jax_examples(n: int) -> int:
    """How many of a property test's ``n`` hypothesis examples its JAX cases run outside
    ``make test-long`` (two in five, at least 5): they run on the few fixed shapes of
    ``helpers.few_shapes``, so further examples repeat compiled programs on other values, while
    tracing and dispatch still cost every example; the other backends run all ``n``."""
    return min(n, max(5, (2 * n + 4) // 5))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A hypothesis test's JAX case (``bk``/``bk_eager`` = jax, jax_jit) runs
    ``jax_examples(n)`` examples outside ``make test-long`` and ``make fuzz`` (see the module
    docstring): the settings hypothesis reads at call time are swapped for the call only."""
    fn = getattr(item, "obj", None)
    current = getattr(fn, "_hypothesis_internal_use_settings", None)
    callspec = getattr(item, "callspec", None)
    backend = None
    if callspec is not None:
        backend = callspec.params.get("bk", callspec.params.get("bk_eager"))
    profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    if current is None or LONG or profile != "ci" or backend not in ("jax", "jax_jit"):
        yield
        return
    fn._hypothesis_internal_use_settings = settings(
        current, max_examples=jax_examples(current.max_examples)
    )
    try:
        yield
    finally:
        fn._hypothesis_internal_use_settings = current


def _others(callspec: Any, backend: str) -> str:
    """A case's id without its backend (stable across processes, unlike reprs)."""
    return "-".join(p for p in callspec.id.split("-") if p != backend)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Outside ``make test-long``: the jax / jax_jit split of the module docstring. Per test
    function, its cases (ids without the backend) in the order of a hash of the id (so each
    value of a parameter, a dtype say, lands on both backends) alternate between jax (even)
    and jax_jit (odd): every case runs on one JAX backend, both run some when there are two or
    more; the other is skipped with the reason. Deterministic from the ids, so every xdist
    worker decides alike."""
    if LONG:
        return
    cases: dict[tuple[str, str], set[str]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("bk") if callspec is not None else None
        if backend in ("jax", "jax_jit"):
            key = (item.module.__name__ if item.module else "", item.originalname)
            cases.setdefault(key, set()).add(_others(callspec, backend))
    order = {
        key: {c: i for i, c in enumerate(sorted(ids, key=lambda c: (zlib.crc32(c.encode()), c)))}
        for key, ids in cases.items()
    }
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("bk") if callspec is not None else None
        if backend not in ("jax", "jax_jit") or item.get_closest_marker("jax_both") is not None:
            continue
        key = (item.module.__name__ if item.module else "", item.originalname)
        if len(order[key]) < 2 and item.get_closest_marker("jax_split") is None:
            continue
        runs_on = ("jax", "jax_jit")[order[key][_others(callspec, backend)] % 2]
        if backend != runs_on:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"jax_split: this case runs on {runs_on} here, on both in test-long"
                )
            )


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_JAX_CACHE, None)
    if path is not None:
        del os.environ["JAX_COMPILATION_CACHE_DIR"]
        shutil.rmtree(path, ignore_errors=True)
    path = config.stash.get(_RUN_DIR, None)
    if path is not None:
        del os.environ[RUN_DIR]
        shutil.rmtree(path, ignore_errors=True)


def once_per_run(name: str, compute: Callable[[], Any]) -> Any:
    """``compute()`` (a JSON value) once per test run, shared by the xdist workers: the first
    to ask computes it under a file lock in the run's folder (``RUN_DIR``, made by the main
    process) and stores it; a worker that asks later waits for the lock and reads it. For the
    module fixtures that start subprocesses (the distributed and sharded checks, ~40 s each):
    under the default ``--dist load`` both workers may draw tests of such a module, and each
    ran the fixture (seen in a CI run). (``--dist loadgroup`` with ``xdist_group`` would pin
    a module to one worker, but with pytest 9 it does not group: pytest-xdist 3.8 renames
    ``item._nodeid``, which pytest 9 no longer reads.) If ``compute`` raises, nothing is
    stored and the next asker computes again."""
    folder = os.environ.get(RUN_DIR)
    if folder is None:
        return compute()
    import fcntl
    import json

    path = Path(folder) / f"{name}.json"
    with open(Path(folder) / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return json.loads(path.read_text())
        value = compute()
        path.write_text(json.dumps(value))
        return value


def _reason(item: pytest.Item, mark: pytest.Mark) -> str:
    if not mark.args:
        raise pytest.UsageError(f"{item.nodeid}: {mark.name} needs a reason")
    return str(mark.args[0])


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skipped with their reason: the dask case of a ``no_dask`` test; outside
    ``make test-long``, ``long`` tests and the JAX cases of ``jax_long`` tests (each compiles
    anew on JAX, while the other backends run them here)."""
    _JITTED.clear()
    callspec = getattr(item, "callspec", None)
    backend = callspec.params.get("bk") if callspec is not None else None
    if backend == "dask" and (mark := item.get_closest_marker("no_dask")) is not None:
        pytest.skip(f"dask: {_reason(item, mark)}")
    if LONG:
        return
    if item.get_closest_marker("long") is not None:
        pytest.skip("long: runs in `make test-long` (HL_TEST_LONG=1)")
    if backend in FRAMEWORKS["jax"] and (mark := item.get_closest_marker("jax_long")) is not None:
        pytest.skip(f"long on JAX ({_reason(item, mark)}): runs in `make test-long`")


def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):  # not Linux: no such limit to guard
        return 0


#: Linux's limit on a process's memory mappings (``vm.max_map_count``, 65,530 by default)
MAX_MAP_COUNT = _max_map_count()
_TESTS_RUN = [0]


def _map_count() -> int:
    with open("/proc/self/maps", "rb") as f:
        return f.read().count(b"\n")


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Every XLA CPU executable JAX keeps is about three memory mappings, and JAX keeps every
    program it compiled (each eager op on each shape too): one pytest process running the whole
    suite (``pytest -n 0``) passed Linux's ``vm.max_map_count`` of 65,530 three quarters of the
    way through, and the next mapping XLA made segfaulted (reproduced three times, in
    different tests; 63,746 mappings just before). Every 20 tests, a process past half the
    limit drops JAX's compiled programs (``jax.clear_caches()``: 8,090 mappings → 564 after
    1,200 small programs; the tests that follow compile again, or load from the run's
    compilation cache on disk). Counting costs ~1 ms."""
    _TESTS_RUN[0] += 1
    if not MAX_MAP_COUNT or _TESTS_RUN[0] % 20 or "jax" not in sys.modules:
        return
    if _map_count() > MAX_MAP_COUNT // 2:
        sys.modules["jax"].clear_caches()
