"""The one planner: which path ``Q @ h``, ``Q.matrix()`` and a layer's training step take.

Pure functions of plain facts (backend, device kind, dtype, shapes, autodiff, deterministic
mode, the operator's history) returning a named :class:`Path`; the runners in ``core`` run it
unchecked. A GPU pays per launched op, so ``"cuda"`` plans few large GEMMs (one factor pair,
the one-shot form, one block); a CPU plans cache-sized blocks and Numba kernels. The table in
words: ``docs/design.rst``, "The planner"; the table as a test: ``tests/test_planner.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .._agnostic import trapezoidal as _trapezoidal
from .._lib.tuning import FORMED_BLOCK as _FORMED_BLOCK
from .._lib.tuning import SINGLE_BLOCK_APPLIED_MAX_N as _SINGLE_APPLIED
from .._lib.tuning import SINGLE_BLOCK_MAX_N as _SINGLE
from .._lib.tuning import SMALL_N
from .._lib.tuning import THREADED_SINGLE_BLOCK_MAX_N as _SINGLE_THREADED
from .blocked import use_blocks
from .sequential import sequential_is_faster

__all__ = ["ApplyFacts", "History", "LayerFacts", "MatrixFacts", "Path", "plan_apply",
           "plan_direct", "plan_layer", "plan_matrix"]  # fmt: skip

#: every path name a plan may return
APPLY_PATHS = ("direct", "dense_q", "folded", "sequential", "lapack_panels", "gpu_fused",
               "blocked", "structured", "factors")  # fmt: skip
MATRIX_PATHS = ("numba_stack", "lapack_panels", "orgqr_kernel", "structured_form", "one_shot",
                "native_orgqr", "factors")  # fmt: skip
LAYER_PATHS = ("one_node", "one_node_one_block", "node_forward", "node_forward_one_block",
               "formed", "operator", "weight")  # fmt: skip


@dataclass(frozen=True)
class Path:
    """A planned path: its ``name``; ``record``: the product counts its columns towards the
    repeat switch (``LazyFactors.applied``); ``block``: reflectors per block (layers)."""

    name: str
    record: bool = False
    block: int = 0


def _get(x: bool | Callable[[], bool]) -> bool:
    """A fact given as a value or, where it costs a pass over V, as a thunk read on demand."""
    return x() if callable(x) else bool(x)


@dataclass(frozen=True)
class History:
    """What an operator built and ran before this call (``LazyFactors``'s state)."""

    factors: bool = False  # the single pair U, T is built
    blocks: bool = False  # the blocked factors are built
    sequential_used: bool = False  # the first product ran sequentially
    panels_used: bool = False  # the first product ran LAPACK's panels
    applied: int = 0  # columns multiplied by (U, T) so far (the repeat switch's count)
    shortcut: bool = False  # the repeat switch has paid (a factor exists, either direction)
    direct: bool = False  # the direct products (U, T, Uᴴ, Tᴴ) of a small single operator


@dataclass(frozen=True)
class ApplyFacts:
    """The facts ``Q @ h`` is planned from (h validated, (..., K, B))."""

    backend: str  # "numpy", "torch", "jax" or "other"
    device: str  # device_kind: "cpu" or "cuda"
    N: int
    L: int
    B: int
    batch: int = 1  # matrices in V's batch
    mode: str = "square"  # "square", "embed" (T-CWY Ω x) or "project" (Ωᴴ y)
    kernel_dtype: bool = True  # float32/float64 h (the Numba kernels' dtypes)
    half: bool = False  # half-precision h: float32 factors, no repeat factor
    graph: bool = False  # autodiff records the product (torch graph; JAX always)
    v_graph: bool = False  # torch autograd records V (the blocks' rule)
    deterministic: bool = False
    tau: bool = False  # LAPACK's τ known (from_lapack) and h of V's dtype, eager
    sdiag: bool = False  # generalised reflectors (from_lapack's complex τ)
    phase: bool = False  # a right phase factor diag(e^{iθ})
    kernels: bool | Callable[[], bool] = False  # Numba serves these arrays (CPU, no trace)
    trapezoidal: bool | Callable[[], bool] = False  # V lower trapezoidal (declared/detected)
    dense_pays: bool = False  # L > N/2: the repeat factor is the dense Q
    history: History = field(default_factory=History)


def plan_apply(f: ApplyFacts) -> Path:
    """The path of ``Q @ h`` (see the module docstring; one branch a former branch point).

    First product (nothing built, not deterministic): ``sequential`` (CPU, real, kernels
    available, the measured crossover), else ``lapack_panels`` (CPU, τ known), on CUDA
    ``gpu_fused`` (real, plain: h − V S⁻¹ (Vᵀ h) from V unnormalised, nothing cached). Then
    ``blocked`` (CPU, square, ``use_blocks`` or blocks built already; plain products count
    towards the repeat switch as the factor pair's do), ``structured``
    (CPU, lower-trapezoidal V, ``use_structured``), else the factor pair: ``dense_q`` /
    ``folded`` once the repeat switch has paid (plain square products), ``factors``
    otherwise. CUDA skips the looping paths (sequential, panels, blocks, structured).
    """
    h, cpu, square = f.history, f.device == "cpu", f.mode == "square"
    first = not (h.factors or h.sequential_used) and not f.deterministic
    if (
        cpu
        and first
        and square
        and f.kernel_dtype
        and not f.half
        and (f.backend == "numpy" or (f.backend == "torch" and not f.graph and _get(f.kernels)))
        and sequential_is_faster(f.N, f.L, f.B)
    ):
        return Path("sequential")
    if cpu and f.tau and not (f.deterministic or h.panels_used or h.factors or h.blocks):
        return Path("lapack_panels")
    if not cpu and first and square and f.kernel_dtype and not (f.graph or f.sdiag or f.phase):
        return _GPU_FUSED
    if cpu and square:
        rule = use_blocks(f.L, f.B, f.v_graph)
        if rule if f.deterministic else (h.blocks or (rule and not h.factors)):
            if f.half or f.graph or f.deterministic:
                return _BLOCKED
            return _repeat_or(Path("blocked", record=not h.shortcut), f)
    if cpu and not f.graph and _trapezoidal.use_structured(f.N, f.L, f.B) and _get(f.trapezoidal):
        return Path("structured")
    if not square or f.half or f.graph or f.deterministic:
        return Path("factors")
    return _repeat_or(Path("factors", record=not h.shortcut), f)


_DIRECT = Path("direct", record=True)
_BLOCKED = Path("blocked")
_GPU_FUSED = Path("gpu_fused")
_DENSE_Q, _FOLDED = Path("dense_q"), Path("folded")


def plan_direct(N: int, B: int, applied: int, shortcut: bool, dense_pays: bool) -> Path:
    """The path of a plain product that the direct factors (``History.direct``) or a built
    repeat factor serve, before any validation (``CompactWYOperator.__matmul__`` gates it on
    the operator's state and h's type, dtype and shape): ``direct`` (h − U (T (Uᴴ h)))
    until the repeat switch pays. Plain arguments: it runs on every small product."""
    if shortcut or applied + B >= N:
        return _DENSE_Q if dense_pays else _FOLDED
    return _DIRECT


def _repeat_or(otherwise: Path, f: ApplyFacts) -> Path:
    """The repeat switch (``LazyFactors.product_factor``): once the columns multiplied add up
    to N (or a repeat factor exists), the dense Q (L > N/2) or the folded W = U T."""
    h = f.history
    if h.shortcut or h.applied + f.B >= f.N:
        return _DENSE_Q if f.dense_pays else _FOLDED
    return otherwise


@dataclass(frozen=True)
class MatrixFacts:
    """The facts ``Q.matrix()`` is planned from."""

    backend: str  # "numpy", "cupy", "torch", "jax" or "other"
    device: str
    N: int
    L: int
    graph: bool = False
    eager: bool = True
    sdiag: bool = False  # generalised reflectors (from_lapack's complex τ)
    kernels: bool | Callable[[], bool] = False  # Numba serves V (real, CPU, no graph)
    tau: bool = False  # LAPACK's τ, panels apply (eager, no graph, not JAX)
    trapezoidal: bool | Callable[[], bool] = False
    float64_matrix: bool = False  # one real float64 V (N, L), L ≤ N, plain S (no sdiag)


def plan_matrix(f: MatrixFacts) -> Path:
    """The path of ``Q.matrix()``. Without autodiff on NumPy / CuPy / eager torch, straight
    from V: on the CPU ``numba_stack`` (N ≤ SMALL_N, reflectors, kernels), ``lapack_panels``
    (τ known), ``orgqr_kernel`` (lower-trapezoidal float64 V, kernels: the compiled panels,
    each copied out of V with its columns scaled to LAPACK's (a, τ)), ``structured_form``
    (other lower-trapezoidal V, orgqr's blocking); ``one_shot`` (I − V S⁻¹ Vᴴ: a Gram, one
    solve, one GEMM) otherwise and on CUDA, where LAPACK's τ on
    torch goes to ``native_orgqr`` (``torch.linalg.householder_product``, one op). With autodiff
    or elsewhere: ``factors`` (I − U T Uᴴ through the rule tables)."""
    direct = f.backend in ("numpy", "cupy") or (f.backend == "torch" and not f.graph and f.eager)
    if not direct:
        return Path("factors")
    if f.device != "cpu":
        return Path("native_orgqr" if f.tau and f.backend == "torch" else "one_shot")
    if f.N <= SMALL_N and not f.sdiag and _get(f.kernels):
        return Path("numba_stack")
    if f.tau:
        return Path("lapack_panels")
    if _get(f.trapezoidal):
        return Path("orgqr_kernel" if f.float64_matrix and _get(f.kernels) else "structured_form")
    return Path("one_shot")


@dataclass(frozen=True)
class LayerFacts:
    """The facts an ``OrthogonalLinear`` forward is planned from."""

    device: str
    N: int  # max(in, out)
    L: int  # reflectors
    rows: int  # rows of the batch
    square_cwy: bool  # map "cwy", in == out
    one_node: bool  # a training step CWYLinear may run (see ``_layer._one_node``)
    operator_rows: float  # rows up to which W is applied, not formed
    graph: bool  # autograd records the vectors
    has_operator: bool = True  # an operator represents W (not a wide "cwy" with extra L)
    block: int = 64  # the CPU's reflectors per block (``CWY_BLOCK``)
    formed_block: int = _FORMED_BLOCK  # the CPU's reflectors per block of a formed W
    single_max_n: int = _SINGLE  # largest N whose formed W is one block on the CPU
    applied_single_max_n: int = _SINGLE_APPLIED  # largest N applied as one block on the CPU
    threads: int = 1  # torch's intra-op threads
    threaded_single_max_n: int = _SINGLE_THREADED  # largest N in one block with 2+ threads
    node_inference: bool = False  # nothing records the forward: the node's math, no node


def plan_layer(f: LayerFacts) -> Path:
    """The path of ``OrthogonalLinear.forward``. A square CWY training step is one autograd
    node: on CUDA one compact WY block (a Gram, a triangular solve, a few GEMMs forward and
    backward) whether W is formed or applied; on the CPU blocks of ``block`` reflectors
    applied to the rows, of ``formed_block`` where W is formed (one block where W is formed
    and N ≤ ``single_max_n``, or applied and N ≤ ``applied_single_max_n``: there the blocks'
    extra ops cost more than their flops save; with 2+ ``threads``, which speed up the GEMMs
    but not the ops around them, either up to ``threaded_single_max_n``). A forward that
    nothing records (no grad, inference mode: ``node_inference``) runs the same blocks'
    forward without the node (``node_forward``). Otherwise W formed (batch above
    ``operator_rows``), the operator applied, or the parametrization's ``weight``."""
    applied = f.rows <= f.operator_rows
    if f.one_node or f.node_inference:
        name = "one_node" if f.one_node else "node_forward"
        one = f.applied_single_max_n if applied else f.single_max_n
        if f.threads > 1:
            one = max(one, f.threaded_single_max_n)
        if f.device != "cpu" or f.N <= one:
            return Path(f"{name}_one_block", block=f.L)
        return Path(name, block=f.block if applied else f.formed_block)
    if not applied:
        return Path("formed")
    return Path("operator" if f.has_operator else "weight")
