"""The one planner (issue 40, item 5): ``plan_apply`` / ``plan_matrix`` / ``plan_layer`` name
the path of ``Q @ h``, ``Q.matrix()`` and a layer's forward from backend, device kind, dtype,
shapes, autodiff, deterministic mode and the operator's history.

The table tests drive real operators (the history is made by running the earlier calls) and
check both the planned name and that the product of that path equals the dense product of
the reflections, so a wrong plan cannot hide a wrong runner. Tolerance: 100·eps·N on entries
of O(1) (float32 rows: their eps).
"""

from __future__ import annotations

import contextlib
import hashlib

import numpy as np
import pytest
from conftest import require, to_numpy
from helpers import product_of_reflections

import householderla as hl
from householderla._lib.device import emulate_device
from householderla._operator import plan as P

pytestmark = pytest.mark.no_dask("the planner's table names its own backends")

# backend, device kind, dtype, N, L, batch, h columns, call number, deterministic, extra
# (None, "tril": lower-trapezoidal V, "grad": torch autograd records V, "lapack": from_lapack)
# → expected path of that call
APPLY_ROWS = [
    ("numpy", "cpu", "float64", 64, 64, 1, 1, 1, False, None, "sequential"),
    ("numpy", "cpu", "float64", 64, 64, 1, 1, 2, False, None, "factors"),
    ("numpy", "cpu", "float64", 64, 16, 1, 4, 3, False, None, "direct"),
    ("numpy", "cpu", "float64", 64, 16, 1, 32, 3, False, None, "folded"),
    ("numpy", "cpu", "float64", 64, 48, 1, 32, 3, False, None, "dense_q"),
    ("numpy", "cpu", "float64", 64, 48, 1, 32, 3, True, None, "factors"),
    ("numpy", "cpu", "float64", 64, 64, 1, 1, 1, True, None, "factors"),
    ("numpy", "cpu", "float64", 128, 32, 1, 128, 1, False, None, "folded"),
    ("numpy", "cpu", "float64", 600, 300, 1, 8, 1, False, None, "blocked"),
    ("numpy", "cpu", "float64", 600, 300, 1, 8, 2, False, None, "blocked"),
    ("numpy", "cpu", "float64", 600, 300, 1, 8, 1, True, None, "blocked"),
    # blocked products count towards the repeat switch: the 75th of 8 columns reaches N = 600
    ("numpy", "cpu", "float64", 600, 300, 1, 8, 74, False, None, "blocked"),
    ("numpy", "cpu", "float64", 600, 300, 1, 8, 75, False, None, "folded"),
    ("numpy", "cpu", "float64", 600, 300, 1, 8, 76, False, None, "folded"),
    ("numpy", "cpu", "float64", 600, 300, 1, 8, 76, True, None, "blocked"),
    ("torch", "cpu", "float64", 600, 300, 1, 8, 75, False, None, "folded"),
    ("torch", "cpu", "float64", 256, 256, 1, 8, 40, False, "grad", "blocked"),
    ("numpy", "cpu", "float64", 600, 300, 1, 100, 1, False, None, "factors"),
    ("numpy", "cpu", "float64", 600, 300, 1, 100, 6, False, None, "folded"),
    ("numpy", "cpu", "float64", 600, 300, 1, 100, 1, True, None, "factors"),
    ("numpy", "cpu", "float64", 600, 600, 1, 8, 1, False, "lapack", "lapack_panels"),
    ("numpy", "cpu", "float64", 600, 600, 1, 8, 1, True, "lapack", "blocked"),
    ("numpy", "cpu", "float64", 520, 512, 1, 200, 1, False, "tril", "structured"),
    ("numpy", "cpu", "complex128", 64, 64, 1, 1, 1, False, None, "factors"),
    ("numpy", "cpu", "float32", 32, 32, 8, 2, 1, False, None, "sequential"),
    ("numpy", "cuda", "float64", 64, 64, 1, 1, 1, False, None, "gpu_fused"),
    ("numpy", "cuda", "float64", 64, 64, 1, 1, 1, True, None, "factors"),
    ("numpy", "cuda", "float64", 64, 64, 1, 1, 2, False, None, "factors"),
    ("numpy", "cuda", "float64", 600, 300, 1, 8, 1, False, None, "gpu_fused"),
    ("numpy", "cuda", "float32", 600, 300, 4, 8, 1, False, None, "gpu_fused"),
    ("numpy", "cuda", "float64", 600, 600, 1, 8, 1, False, "lapack", "gpu_fused"),
    ("numpy", "cuda", "float64", 600, 600, 1, 8, 2, False, "lapack", "factors"),
    ("numpy", "cuda", "float64", 520, 512, 1, 200, 2, False, "tril", "factors"),
    ("numpy", "cuda", "float64", 520, 512, 1, 200, 4, False, "tril", "dense_q"),
    ("numpy", "cuda", "complex128", 64, 64, 1, 4, 1, False, None, "factors"),
    ("torch", "cpu", "float64", 64, 64, 1, 4, 1, False, None, "sequential"),
    ("torch", "cpu", "float32", 64, 64, 1, 4, 1, False, None, "sequential"),
    ("torch", "cpu", "float64", 256, 256, 1, 8, 1, False, "grad", "blocked"),
    ("torch", "cpu", "float64", 64, 64, 1, 4, 1, False, "grad", "factors"),
    ("torch", "cpu", "float64", 600, 300, 1, 8, 1, False, None, "blocked"),
    ("torch", "cuda", "float64", 64, 64, 1, 4, 1, False, None, "gpu_fused"),
    ("torch", "cuda", "float32", 64, 64, 1, 4, 1, False, None, "gpu_fused"),
    ("torch", "cuda", "float64", 256, 256, 1, 8, 1, False, "grad", "factors"),
    ("torch", "cuda", "float64", 600, 300, 1, 8, 1, False, None, "gpu_fused"),
    ("torch", "cuda", "float64", 64, 16, 1, 32, 3, False, None, "folded"),
    ("jax", "cpu", "float64", 64, 64, 1, 1, 1, False, None, "factors"),
    ("jax", "cpu", "float64", 600, 300, 1, 8, 1, False, None, "blocked"),
]

MATRIX_ROWS = [
    ("numpy", "cpu", "float64", 32, 32, None, "numba_stack"),
    ("numpy", "cpu", "float64", 200, 200, None, "one_shot"),
    ("numpy", "cpu", "float64", 200, 200, "tril", "orgqr_kernel"),
    ("numpy", "cpu", "float32", 200, 200, "tril", "structured_form"),
    ("numpy", "cpu", "float64", 200, 200, "lapack", "lapack_panels"),
    ("numpy", "cuda", "float64", 32, 32, None, "one_shot"),
    ("numpy", "cuda", "float64", 200, 200, "tril", "one_shot"),
    ("numpy", "cuda", "float64", 200, 200, "lapack", "one_shot"),
    ("torch", "cpu", "float32", 32, 32, None, "numba_stack"),
    ("torch", "cpu", "float64", 200, 200, "tril", "orgqr_kernel"),
    ("torch", "cpu", "float32", 200, 200, "tril", "structured_form"),
    ("torch", "cpu", "float64", 200, 200, "grad", "factors"),
    ("torch", "cuda", "float64", 200, 200, "tril", "one_shot"),
    ("torch", "cuda", "float64", 200, 200, "grad", "factors"),
    ("torch", "cuda", "float64", 200, 200, "lapack", "native_orgqr"),
    ("torch", "cpu", "float64", 200, 200, "lapack", "lapack_panels"),
    ("jax", "cpu", "float64", 32, 32, None, "factors"),
]


def _device(kind: str):
    return emulate_device("cuda") if kind == "cuda" else contextlib.nullcontext()


@contextlib.contextmanager
def _deterministic(on: bool):
    old = hl.set_deterministic(on)
    try:
        yield
    finally:
        hl.set_deterministic(old)


def _make(backend, dtype, N, L, batch, extra, seed=0):
    """(operator, V as NumPy float64/complex128, the namespace's asarray)."""
    rng = np.random.default_rng(seed)
    shape = (N, L) if batch == 1 else (batch, N, L)
    V = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        V = V + 1j * rng.standard_normal(shape)
    if extra in ("tril", "lapack"):
        V = np.tril(V)
    if backend == "numpy":
        xp_asarray = lambda a: np.asarray(a, dtype=dtype)  # noqa: E731
    elif backend == "torch":
        torch = require("torch")
        xp_asarray = lambda a: torch.as_tensor(np.asarray(a, dtype=dtype))  # noqa: E731
    else:
        jax = require("jax")
        jax.config.update("jax_enable_x64", True)  # as the conftest's jax backends
        jnp = jax.numpy
        xp_asarray = lambda a: jnp.asarray(np.asarray(a, dtype=dtype))  # noqa: E731
    if extra == "lapack":  # LAPACK's (a, τ) of a QR, as from_lapack takes it
        import scipy.linalg

        (a, tau), _ = scipy.linalg.qr(rng.standard_normal((N, N)), mode="raw")
        op = hl.from_lapack(xp_asarray(a), xp_asarray(tau))
        Q = np.asarray(to_numpy(hl.from_lapack(a, tau).matrix()))
        return op, Q, xp_asarray
    Vx = xp_asarray(V)
    if extra == "grad":
        Vx.requires_grad_(True)
    op = hl.cwy(Vx)
    return op, _dense(V), xp_asarray


_DENSE: dict[tuple, np.ndarray] = {}


def _dense(V: np.ndarray) -> np.ndarray:
    """``product_of_reflections(V)``, computed once per V: the rows of the tables draw the same
    V for the same shape (seed 0) on every backend and device, and the oracle of a 600 × 300 V
    takes ~1.5 s. Read-only, so no row can alter another's."""
    key = (V.shape, V.dtype.str, hashlib.sha1(V.tobytes()).hexdigest())
    if key not in _DENSE:
        Q = product_of_reflections(V)
        Q.flags.writeable = False
        _DENSE[key] = Q
    return _DENSE[key]


def _tol(dtype, N):
    eps = np.finfo(np.float32 if dtype == "float32" else np.float64).eps
    return 100 * eps * N


@pytest.mark.parametrize(
    ("backend", "device", "dtype", "N", "L", "batch", "B", "call", "det", "extra", "expected"),
    APPLY_ROWS,
    ids=[
        f"{r[0]}-{r[1]}-{r[2]}-N{r[3]}-L{r[4]}-b{r[5]}-B{r[6]}-call{r[7]}"
        + ("-det" if r[8] else "")
        + (f"-{r[9]}" if r[9] else "")
        for r in APPLY_ROWS
    ],
)
def test_apply_plan_table(backend, device, dtype, N, L, batch, B, call, det, extra, expected):
    """Row by row: the planned path of the ``call``-th product with B columns, and the product
    of that path equals the dense product of the reflections."""
    op, Q, asarray = _make(backend, dtype, N, L, batch, extra)
    rng = np.random.default_rng(1)
    ctx = _deterministic(det)
    with _device(device), ctx:
        for _ in range(call):
            h = rng.standard_normal((N, B))
            path = op.planned_path(asarray(h))
            y = op @ asarray(h)
            if extra == "grad":
                y = y.detach()
            ref = Q @ h
            np.testing.assert_allclose(to_numpy(y), ref, atol=_tol(dtype, N), err_msg=path.name)
    assert path.name == expected
    assert path.name in P.APPLY_PATHS


@pytest.mark.parametrize(
    ("backend", "device", "dtype", "N", "L", "extra", "expected"),
    MATRIX_ROWS,
    ids=["-".join(str(v) for v in r[:6] if v is not None) for r in MATRIX_ROWS],
)
def test_matrix_plan_table(backend, device, dtype, N, L, extra, expected):
    """``.matrix()``'s planned path, and the matrix of that path equals the dense product."""
    op, Q, _ = _make(backend, dtype, N, L, 1, extra)
    with _device(device):
        path = op.planned_matrix_path()
        M = op.matrix()
    if extra == "grad":
        M = M.detach()
    assert path.name == expected
    assert path.name in P.MATRIX_PATHS
    np.testing.assert_allclose(to_numpy(M), Q, atol=_tol(dtype, N))


LAYER_ROWS = [
    # device, N, rows, one_node, expected (name, block)
    ("cpu", 1024, 64, True, ("one_node", 64)),
    ("cpu", 1024, 2048, True, ("one_node", 128)),  # W formed from blocks of formed_block
    ("cpu", 128, 256, True, ("one_node_one_block", 128)),
    ("cpu", 128, 64, True, ("one_node_one_block", 128)),
    ("cpu", 160, 64, True, ("one_node_one_block", 160)),
    ("cpu", 192, 64, True, ("one_node", 64)),
    ("cpu", 192, 256, True, ("one_node_one_block", 192)),
    ("cpu", 256, 512, True, ("one_node", 128)),
    ("cpu", 256, 256, True, ("one_node", 64)),  # applied: blocks of block
    ("cuda", 1024, 64, True, ("one_node_one_block", 1024)),
    ("cuda", 4096, 8192, True, ("one_node_one_block", 4096)),
    ("cpu", 1024, 64, False, ("operator", 0)),
    ("cpu", 1024, 2048, False, ("formed", 0)),
    ("cuda", 1024, 2048, False, ("formed", 0)),
]


def _layer_facts(device, N, rows, one_node, **more):
    """A square CWY layer's facts with the tuning values the tables are written for."""
    return P.LayerFacts(
        device=device,
        N=N,
        L=N,
        rows=rows,
        square_cwy=True,
        one_node=one_node,
        operator_rows=1.0 * N,
        graph=one_node,
        block=64,
        formed_block=128,
        single_max_n=192,
        applied_single_max_n=160,
        **more,
    )


@pytest.mark.parametrize(("device", "N", "rows", "one_node", "expected"), LAYER_ROWS)
def test_layer_plan_table(device, N, rows, one_node, expected):
    facts = _layer_facts(device, N, rows, one_node)
    path = P.plan_layer(facts)
    assert (path.name, path.block) == expected
    assert path.name in P.LAYER_PATHS


@pytest.mark.parametrize(
    ("N", "rows", "threads", "expected"),
    [
        (256, 256, 1, ("one_node", 64)),  # one thread: blocks above applied_single_max_n
        (256, 256, 2, ("one_node_one_block", 256)),  # two: one block up to 256
        (256, 1024, 1, ("one_node", 128)),
        (256, 1024, 2, ("one_node_one_block", 256)),
        (512, 1024, 2, ("one_node", 128)),
        (512, 256, 4, ("one_node", 64)),
        (128, 64, 2, ("one_node_one_block", 128)),
    ],
)
def test_layer_plan_threads(N, rows, threads, expected):
    """With two or more torch threads the GEMMs run faster and the ops around them do not:
    one block up to ``threaded_single_max_n`` (applied or formed), the CPU's blocks above."""
    facts = _layer_facts("cpu", N, rows, True, threads=threads, threaded_single_max_n=256)
    path = P.plan_layer(facts)
    assert (path.name, path.block) == expected


@pytest.mark.parametrize(
    ("device", "N", "rows", "expected"),
    [
        ("cpu", 128, 64, ("node_forward_one_block", 128)),
        ("cpu", 1024, 64, ("node_forward", 64)),  # the training node's blocks
        ("cpu", 1024, 2048, ("node_forward", 128)),  # W formed from blocks of formed_block
        ("cuda", 1024, 64, ("node_forward_one_block", 1024)),
    ],
)
def test_layer_plan_inference(device, N, rows, expected):
    """A forward nothing records (``node_inference``) takes the training node's blocks under
    the ``node_forward`` names, where the recorded forward would take the operator or W."""
    facts = _layer_facts(device, N, rows, False, node_inference=True)
    path = P.plan_layer(facts)
    assert (path.name, path.block) == expected
    assert path.name in P.LAYER_PATHS
    trained = P.plan_layer(_layer_facts(device, N, rows, True))
    assert trained.name == path.name.replace("node_forward", "one_node")
    assert trained.block == path.block


def test_pure_apply_facts_table():
    """The planner is a function of its facts alone: the same facts, the same path, and the
    history moves a product along the repeat switch."""
    base = dict(backend="numpy", device="cpu", N=64, L=16, B=8)
    assert P.plan_apply(P.ApplyFacts(**base)).name in ("sequential", "factors")
    built = P.History(factors=True)
    assert P.plan_apply(P.ApplyFacts(**base, history=built)) == P.Path("factors", record=True)
    later = P.History(factors=True, applied=56)
    assert P.plan_apply(P.ApplyFacts(**base, history=later)).name == "folded"
    assert P.plan_apply(P.ApplyFacts(**base, history=later, dense_pays=True)).name == "dense_q"
    cuda = dict(base, device="cuda", L=300, N=600)
    assert P.plan_apply(P.ApplyFacts(**cuda)).name == "gpu_fused"
    assert P.plan_apply(P.ApplyFacts(**cuda, history=built)).name == "factors"
    assert P.plan_apply(P.ApplyFacts(**cuda, graph=True, v_graph=True)).name == "factors"
    assert P.plan_direct(64, 8, 0, False, False).name == "direct"
    assert P.plan_direct(64, 8, 56, False, True).name == "dense_q"


@pytest.mark.parametrize("case", ["tiny diagonal", "zero diagonal", "huge", "zero column"])
def test_orgqr_kernel_declines_what_it_cannot_scale_and_the_result_is_the_same(case):
    """``orgqr_kernel`` divides column j by v_jj to reach LAPACK's (a, τ): where that is not
    safe (v_jj² < 1e-16·‖vⱼ‖², v_jj = 0 with vⱼ ≠ 0, ‖vⱼ‖² overflowing) the kernel declines and
    the structured blocks form Q; a zero column is H(0) = I (τ = 0) on the kernel. Either
    way Q equals the product of the reflections (100·eps·N)."""
    from householderla._agnostic.lapack_panels import form_from_rows
    from householderla._kernels import numba_enabled

    nk = numba_enabled()
    if nk is None:
        pytest.skip("Numba is not installed")
    N = 120
    V = np.tril(np.random.default_rng(3).standard_normal((N, N)))
    ref = product_of_reflections(V)  # (H(αv) = H(v): the scaled column's oracle too)
    if case == "tiny diagonal":
        V[7, 7] = 1e-9
    elif case == "zero diagonal":
        V[7, 7] = 0.0
    elif case == "huge":
        V[:, 7] *= 1e160
    else:
        V[:, 7] = 0.0
    op = hl.cwy(V)
    assert op.planned_matrix_path().name == "orgqr_kernel"
    served = form_from_rows(V, nk) is not None
    assert served == (case == "zero column")
    if case != "huge":
        ref = product_of_reflections(V)
    np.testing.assert_allclose(op.matrix(), ref, atol=_tol("float64", N))
