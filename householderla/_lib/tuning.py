"""Every threshold that chooses a path, one line each: what it decides and the page of
``benchmarks/results/`` whose measurements set it (``tuning.md`` keeps the figures and run
histories that used to sit beside each constant). Modules import these by name; a test that
changes one patches the module that reads it.
"""

from __future__ import annotations

__all__ = [
    "BATCH_MIN",
    "CWY_BLOCK",
    "CWY_BLOCKS_MIN_L",
    "CWY_BLOCKS_MIN_L_GRAPH",
    "DASK_FAN_IN",
    "EIG_BOUNDS_MAX_M",
    "FORMED_BLOCK",
    "FUSED_ROW_BYTES",
    "FUSE_MAX_COLUMNS",
    "FUSE_MIN_N",
    "LANES_MAX_N",
    "LAPACK_SEQUENTIAL_MAX_M",
    "LAPACK_SMALL_M",
    "MASKED_MAX_N",
    "NT_MIN_BYTES",
    "ONE_NODE",
    "OPERATOR_MAX_ROWS",
    "PANEL",
    "PANEL_COPY_ROWS",
    "SEQUENTIAL_MAX_B",
    "SEQUENTIAL_MAX_LB_PRECOMPUTED",
    "SEQUENTIAL_MAX_N",
    "SEQ_DETECT_FLOPS",
    "SINGLE_BLOCK_APPLIED_MAX_N",
    "SINGLE_BLOCK_MAX_N",
    "SMALL_FORM_MAX_MK",
    "SMALL_FORM_PANEL",
    "SMALL_N",
    "STRUCTURED_BLOCK",
    "THREADED_SINGLE_BLOCK_MAX_N",
    "TILE_MAX_N",
    "TRAPEZOIDAL_BLOCK",
    "TRAPEZOIDAL_FEW_RHS",
    "TRAPEZOIDAL_MAX_BLOCKS",
    "TRAPEZOIDAL_MIN_COLUMNS",
    "VJP_BLOCK",
    "VJP_BLOCKS_MIN_L",
    "WIDE_MIN_C",
    "WIDE_MIN_C_FORM",
]

# -- householderla/_operator/sequential.py -----------------------------------------------------
SEQUENTIAL_MAX_N = 512  # largest N of a sequential first product; results/sequential.md
SEQUENTIAL_MAX_B = 64  # widest h of a sequential first product; results/sequential.md
SEQUENTIAL_MAX_LB_PRECOMPUTED = 0  # L·B for sequential on built factors; results/sequential.md

# -- householderla/_operator/core.py -----------------------------------------------------------
SEQ_DETECT_FLOPS = 1 << 17  # savings worth detecting trapezoidal V; results/tuning.md

# -- householderla/_operator/factors.py --------------------------------------------------------
SMALL_N = 64  # largest N .matrix() forms sequentially; results/tuning.md

# -- householderla/_operator/blocked.py --------------------------------------------------------
CWY_BLOCK = 64  # reflectors per block of blocked CWY; results/tuning.md
CWY_BLOCKS_MIN_L = 256  # fewest reflectors for blocked CWY; results/tuning.md
CWY_BLOCKS_MIN_L_GRAPH = 2 * CWY_BLOCK  # the same under torch autodiff; results/tuning.md

# -- householderla/vjp.py ----------------------------------------------------------------------
VJP_BLOCK = 128  # reflectors per block of the blocked cwy_apply VJP; results/tuning.md
VJP_BLOCKS_MIN_L = 128  # fewest reflectors for it; results/tuning.md

# -- householderla/_agnostic/compact_wy.py -----------------------------------------------------
FUSE_MAX_COLUMNS = 64  # widest h fused with g in lowrank_vjp; results/tuning.md

# -- householderla/_agnostic/forming.py --------------------------------------------------------
STRUCTURED_BLOCK = 128  # reflectors per block, structured_matrix; results/tuning.md

# -- householderla/_agnostic/lapack_panels.py --------------------------------------------------
PANEL = 32  # reflectors per LAPACK-style panel; results/tuning.md
SMALL_FORM_PANEL = 16  # panel of the compiled real ?orgqr on small Q; results/tuning.md
SMALL_FORM_MAX_MK = 1 << 16  # largest m·k formed with SMALL_FORM_PANEL; results/tuning.md

# -- householderla/_agnostic/newton_schulz.py --------------------------------------------------
EIG_BOUNDS_MAX_M = 32  # largest M bounded by eigvalsh; results/tuning.md

# -- householderla/_agnostic/trapezoidal.py ----------------------------------------------------
TRAPEZOIDAL_BLOCK = 128  # column-block width, trapezoidal V; results/tuning.md
TRAPEZOIDAL_MAX_BLOCKS = 8  # most blocks, trapezoidal V; results/tuning.md
TRAPEZOIDAL_MIN_COLUMNS = 2 * TRAPEZOIDAL_BLOCK  # fewest L for blocks; results/structured.md
TRAPEZOIDAL_FEW_RHS = 16  # h narrower than this needs L ≥ 3N/4; results/structured.md

# -- householderla/_autodiff/torch.py ------------------------------------------------------
MASKED_MAX_N = 1024  # largest block whose masks CWYLinear caches; results/tuning.md

# -- householderla/_interop/dask_tall.py -------------------------------------------------------
DASK_FAN_IN = 8  # partials combined per Dask reduction task; results/tuning.md

# -- householderla/_kernels/numba_panels.py ----------------------------------------------------
PANEL_COPY_ROWS = 16  # rows per tile, orgqr_rows' panel copy out of V; results/tuning.md

# -- householderla/_kernels/numba_batched.py ---------------------------------------------------
TILE_MAX_N = 64  # largest N of the batched kernels; results/tuning.md
BATCH_MIN = 16  # fewest matrices for the batched kernels; results/tuning.md
LANES_MAX_N = 64  # largest N of the SIMD lanes kernel; results/tuning.md

# -- householderla/_kernels/numba_lanes.py -----------------------------------------------------
NT_MIN_BYTES = 8 << 20  # output bytes stored non-temporally; results/tuning.md
FUSE_MIN_N = 5  # smallest N of the fused lane sweep; results/tuning.md

# -- householderla/_kernels/numba_columns.py ---------------------------------------------------
WIDE_MIN_C = 32  # columns for one wide sweep (apply); results/tuning.md
WIDE_MIN_C_FORM = 56  # columns for one wide sweep (form); results/tuning.md

# -- householderla/_kernels/numba_loops.py -----------------------------------------------------
FUSED_ROW_BYTES = 4096  # longest row fused by apply_block; results/tuning.md

# -- householderla/lapack.py -------------------------------------------------------------------
LAPACK_SMALL_M = 64  # largest m of a stack read in one pass; results/tuning.md
LAPACK_SEQUENTIAL_MAX_M = 128  # largest m sequential over panels; results/tuning.md

# -- householderla/torch/_layer.py -------------------------------------------------------------
OPERATOR_MAX_ROWS = 1.0  # rows per N for the operator path; results/training_step.md
ONE_NODE = True  # training forward as one autograd node; results/tuning.md
SINGLE_BLOCK_MAX_N = 192  # largest N forming W as one block; results/tuning.md
SINGLE_BLOCK_APPLIED_MAX_N = 160  # largest N applying one block to the rows; results/tuning.md
FORMED_BLOCK = 128  # reflectors per block of a W formed from blocks; results/tuning.md
THREADED_SINGLE_BLOCK_MAX_N = 256  # the same two with 2+ torch threads; results/tuning.md
