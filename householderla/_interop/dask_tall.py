"""Tall CWY / T-CWY factors, products and retractions over row-chunked Dask arrays.

For V (N, M) chunked along its N rows, only M-sized objects reach the client. Factors in one
pass: per chunk column scales and a scaled Gram, combined up a tree (``FAN_IN``) overflow-safe,
then S = ½I + striu(UᵀU), T = S⁻¹ on the client (Likhosherstov et al., AISTATS 2021, Theorem
2). Products chunkwise and lazy, U recomputed per chunk; Q h reads clones of V and h in its
second pass (:func:`fresh`). Retractions qf(Y) and polar(Y) = Q·polar(R) by direct TSQR
(Benson, Gleich & Demmel, IEEE BigData 2013).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._lib.linalg import inv_upper_triangular
from .._lib.tuning import DASK_FAN_IN as FAN_IN

__all__ = [
    "FAN_IN",
    "TallFactors",
    "as_rows",
    "check_tall",
    "fresh",
    "project",
    "rows_apply",
    "tall_factors",
    "tsqr_retraction",
]


def check_tall(V: Any, name: str = "V") -> Any:
    """``V`` as a float Dask array (N, M), M ≤ N, one chunk across its columns."""
    if V.ndim != 2:
        raise ValueError(
            f"a Dask {name} must have shape (N, M) (tall, row-chunked); got shape {V.shape}"
        )
    if V.shape[1] > V.shape[0]:
        raise ValueError(f"{name} must have shape (N, M) with M <= N; got shape {V.shape}")
    dt = np.dtype(V.dtype)
    if dt.kind in "iu":
        V = V.astype(np.float64)
    elif dt not in (np.float32, np.float64):
        raise TypeError(f"{name} has dtype {dt}; supported are float32, float64 and integers")
    return V.rechunk({1: -1}) if len(V.chunks[1]) > 1 else V


def _scaled_gram(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(m, (B/m)ᵀ(B/m)) of one row chunk, m = column max-abs (zero columns: m = 0)."""
    B = np.asarray(block, dtype=np.float64)
    m = np.max(np.abs(B), axis=0) if B.shape[0] else np.zeros(B.shape[1])
    W = B / np.where(m > 0, m, 1.0)
    return m, W.T @ W


def _combine(*parts: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    m = np.max(np.stack([p[0] for p in parts]), axis=0)
    safe = np.where(m > 0, m, 1.0)
    G = np.zeros((m.size, m.size))
    for mp, Gp in parts:
        d = mp / safe  # ≤ 1: nothing overflows
        G += d[:, None] * Gp * d[None, :]
    return m, G


class TallFactors:
    """What the client holds for a tall operator: column scales ``m`` and ``dn`` (U = V/m/dn
    column by column, 1 for zero columns), T = S⁻¹ (M, M) and U₁ (the top M rows of U), all
    NumPy in V's dtype, and the column norms ``r`` (float64)."""

    __slots__ = ("T", "U1", "dn", "m", "r")

    def __init__(self, m: Any, G: Any, top: Any, dtype: Any) -> None:
        bad = np.flatnonzero(~np.isfinite(m) | ~np.isfinite(np.diag(G)))
        if bad.size:
            raise ValueError(f"V has NaN or Inf in column {int(bad[0])}")
        d = np.sqrt(np.diag(G))
        nonzero = (m > 0) & (d > 0)
        msafe, dn = np.where(nonzero, m, 1.0), np.where(nonzero, d, 1.0)
        C = G / dn[:, None] / dn[None, :]  # UᵀU
        M = m.size
        S = 0.5 * np.eye(M) + np.triu(C, 1)
        T = inv_upper_triangular(S, np)
        self.r = m * d
        self.m, self.dn = msafe.astype(dtype), dn.astype(dtype)
        self.T = T.astype(dtype)
        self.U1 = unit_rows(np.asarray(top, dtype=np.float64), msafe, dn).astype(dtype)


def unit_rows(Vb: np.ndarray, m: np.ndarray, dn: np.ndarray) -> np.ndarray:
    """U rows from V rows: (v/m)/dn per column, in two steps so nothing overflows."""
    return (Vb / m) / dn


def tall_factors(V: Any) -> TallFactors:
    """The factors of a checked tall V: one tree-reduction pass (``dask.compute``, on the
    active scheduler), then T on the client."""
    import dask

    blocks = V.to_delayed().ravel()
    parts = [dask.delayed(_scaled_gram, pure=True)(b) for b in blocks]
    while len(parts) > 1:
        parts = [
            dask.delayed(_combine, pure=True)(*parts[i : i + FAN_IN])
            for i in range(0, len(parts), FAN_IN)
        ]
    (m, G), top = dask.compute(parts[0], V[: V.shape[1]])
    return TallFactors(m, G, top, np.dtype(V.dtype))


# -- products ------------------------------------------------------------------------------------


def as_rows(h: Any, V: Any, name: str) -> Any:
    """``h`` (N,) or (N, B) as a Dask array chunked like V's rows (NumPy arrays are wrapped)."""
    import dask.array as da

    if not hasattr(h, "chunks"):
        h = np.asarray(h)
    if h.ndim not in (1, 2) or h.shape[0] != V.shape[0]:
        raise ValueError(
            f"{name} must have shape ({V.shape[0]},) or ({V.shape[0]}, B); got {h.shape}"
        )
    if not hasattr(h, "chunks"):
        return da.from_array(h, chunks=(V.chunks[0],) + h.shape[1:])
    return h.rechunk({0: V.chunks[0]})


def _ut_block(Vb: np.ndarray, hb: np.ndarray, m: Any, dn: Any) -> np.ndarray:
    return (unit_rows(Vb, m, dn).T @ hb)[None]


def project(V: Any, f: TallFactors, h: Any, dtype: Any) -> Any:
    """Uᵀh (M, B) for row-chunked h (N, B): per-chunk products summed up a tree; lazy."""
    import dask.array as da

    parts = da.blockwise(
        _ut_block, "ikj", V, "ik", h, "ij", f.m, None, f.dn, None,
        dtype=dtype, adjust_chunks={"i": 1}, concatenate=True,
        meta=np.empty((0, 0, 0), dtype),
    )  # fmt: skip
    return parts.sum(axis=0, split_every=FAN_IN)


def fresh(*arrays: Any) -> tuple[Any, ...]:
    """Copies of Dask arrays computed anew (new keys, ``dask.graph_manipulation.clone``) for a
    second pass over them, so that none of their chunks is kept from the first pass. Only
    where the clone is complete: dask 2026.8's clone misses keys that a layer holds under
    another name (the split tasks of a rechunk layer); such graphs are shared instead
    (correct, but the first pass's chunks stay in memory until the second has read them)."""
    from dask.graph_manipulation import clone

    if not all(_clonable(a) for a in arrays):
        return arrays
    out = clone(*arrays)
    return tuple(out) if len(arrays) > 1 else (out,)


def _clonable(a: Any) -> bool:
    """Every key of every layer of a's high-level graph is named after its layer."""
    layers = getattr(a.__dask_graph__(), "layers", None)
    if layers is None:
        return False
    return all(
        (k[0] if isinstance(k, tuple) else k) == name
        for name, layer in layers.items()
        for k in layer.keys()
    )


def _rows_block(
    Vb: np.ndarray, b: np.ndarray, hb: Any, rows: Any, top: Any, m: Any, dn: Any
) -> np.ndarray:
    """R(h) rows − U_k b: h's rows (square) or x placed at rows < M (embed)."""
    out = -(unit_rows(Vb, m, dn) @ b)
    if hb is not None:
        out += hb
    if top is not None:
        sel = rows < top.shape[0]
        out[sel] += top[rows[sel]]
    return out


def rows_apply(
    V: Any, f: TallFactors, b: Any, dtype: Any, *, h: Any = None, top: Any = None
) -> Any:
    """Row-chunked h − U b (``h`` given, square) or [top; 0] − U b (``top`` given, embed), for
    b (M, B); lazy, one task per row chunk of V. ``h`` and V are read through clones, so a
    first pass that computed b from them keeps none of their chunks."""
    import dask.array as da

    b = b if hasattr(b, "chunks") else da.from_array(np.asarray(b, dtype=dtype))
    b = b.rechunk({0: -1})
    if h is not None:
        V, h = fresh(V, h)
        args: tuple[Any, ...] = (h.rechunk({1: b.chunks[1]}), "ij", None, None)
        top_args: tuple[Any, ...] = (None, None)
    else:
        top = top if hasattr(top, "chunks") else da.from_array(np.asarray(top, dtype=dtype))
        top = top.rechunk({0: -1, 1: b.chunks[1]})
        args = (None, None, da.arange(V.shape[0], chunks=V.chunks[0]), "i")
        top_args = (top, "lj")
    return da.blockwise(
        _rows_block, "ij", V, "ik", b, "kj", *args, *top_args, f.m, None, f.dn, None,
        dtype=dtype, concatenate=True, meta=np.empty((0, 0), dtype),
    )  # fmt: skip


# -- retractions ---------------------------------------------------------------------------------


def _local_r(block: np.ndarray) -> np.ndarray:
    """R of one row chunk, padded with zero rows to M × M (a chunk may have < M rows)."""
    M = block.shape[1]
    r = np.linalg.qr(block, mode="r")
    return r if r.shape[0] == M else np.vstack([r, np.zeros((M - r.shape[0], M))])


def _stacked_qr(Rs: np.ndarray, small: Any) -> tuple[np.ndarray, np.ndarray]:
    """(q2 P, ·) for the stacked local R factors Rs = q2 R: P = diag(sign diag R) (QR) or
    polar(R) (``small``), so that Q_k P' = q_k (q2_k P)."""
    q2, R = np.linalg.qr(Rs)
    if small is None:
        d = np.sign(np.diag(R))
        return q2 * np.where(d == 0, 1.0, d)
    return q2 @ small(R)


def _local_q(block: np.ndarray, C: np.ndarray) -> np.ndarray:
    """q_k C_k: the chunk's local Q (recomputed, the same LAPACK call as in the first pass)."""
    q = np.linalg.qr(block)[0]
    return q @ C[: q.shape[1]]


def tsqr_retraction(X: Any, Z: Any, step: Any, small_polar: Any = None) -> Any:
    """qf(X + tZ) with diag(R) > 0 (``small_polar`` None) or polar(X + tZ) = Q·polar(R)
    (``small_polar`` maps the M×M R to its polar factor) for row-chunked X (N, M); Z is a
    Dask or NumPy array of X's shape or None (Y = X). Lazy; float32 runs in float64 and is
    rounded once.

    Direct TSQR (Benson, Gleich & Demmel, IEEE BigData 2013; ``dask.array.linalg.tsqr``):
    Y_k = q_k r_k per chunk, [r_1; …; r_K] = q2 R in one M-column task, Q_k = q_k q2_k. Dask's
    ``tsqr`` keeps every q_k until q2 exists (N·M memory); here the second pass recomputes
    q_k from a clone of Y_k (twice the local QR flops, 2·N·M² more), so a task holds one
    chunk and the stacked R factors ((N/chunk)·M² numbers) are the only other object."""
    import dask
    import dask.array as da

    X = check_tall(X, "X")
    dtype = np.dtype(X.dtype)
    Y = X.astype(np.float64)
    if Z is not None:
        if not isinstance(step, (int, float)) or isinstance(step, bool) or not math.isfinite(step):
            raise TypeError(f"step must be a finite real number with Dask arrays; got {step!r}")
        if tuple(Z.shape) != tuple(X.shape):
            raise ValueError(f"Z must have the shape of X {X.shape}; got {tuple(Z.shape)}")
        Zd = Z if hasattr(Z, "chunks") else da.from_array(np.asarray(Z), chunks=X.chunks)
        Y = Y + float(step) * Zd.astype(np.float64).rechunk(X.chunks)
    M, nb = Y.shape[1], len(Y.chunks[0])
    Rs = Y.map_blocks(_local_r, chunks=((M,) * nb, (M,)), dtype=np.float64)
    C = dask.delayed(_stacked_qr, pure=True)(Rs.rechunk({0: -1}), small_polar)
    C = da.from_delayed(C, (nb * M, M), dtype=np.float64).rechunk({0: M})
    # chunk k of Y with block k of C (M rows each): paired by block index, not by row
    Q = da.blockwise(
        _local_q, "ij", fresh(Y)[0], "ij", C, "ij", dtype=np.float64, align_arrays=False,
        meta=np.empty((0, 0)),
    )  # fmt: skip
    assert Q.chunks == Y.chunks
    return Q.astype(dtype)
