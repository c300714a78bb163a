"""Process-wide modes: the deterministic switch for operator products.

An operator picks a product's path from what earlier products built (the first product by
sequential reflections or LAPACK's panels, the blocks or the whole factors, the dense Q or
W = U T once they pay), and the paths round differently. Deterministic mode makes the path a
function of the shapes alone, so the same operator on the same input gives the same bits.
"""

from __future__ import annotations

__all__ = ["is_deterministic", "set_deterministic"]

_DETERMINISTIC = [False]


def set_deterministic(mode: bool = True) -> bool:
    """Make every product ``op @ h`` of the same operator with the same ``h`` return the same
    bits (``True``), or let each product take the fastest path (``False``, the default).

    Parameters
    ----------
    mode : bool
        ``True``: an operator's products take one path chosen by the shapes alone, never one
        that depends on what earlier products built: the compact WY factors (or their blocks),
        never the first product's sequential reflections or LAPACK panels, never the dense
        Q or W = U T an operator switches to after N columns (``docs/guarantees.rst``). Fresh
        operators are then slower on their first product, and operators applied again and
        again slower on every product (``benchmarks/results/tuning.md``). ``False``: the
        fastest path; results of the same product may differ in the last bits.

    Returns
    -------
    bool
        The mode before the call, so that ``old = hl.set_deterministic(); ...;
        hl.set_deterministic(old)`` restores it.

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> old = hl.set_deterministic(True)
    >>> op = hl.cwy(np.random.default_rng(0).standard_normal((64, 40)))
    >>> h = np.ones((64, 8))
    >>> ys = [op @ h for _ in range(20)]
    >>> all(np.array_equal(y, ys[0]) for y in ys)
    True
    >>> _ = hl.set_deterministic(old)
    """
    if not isinstance(mode, bool):
        raise TypeError(f"mode must be True or False; got {mode!r}")
    old, _DETERMINISTIC[0] = _DETERMINISTIC[0], mode
    return old


def is_deterministic() -> bool:
    """Whether :func:`set_deterministic` is on (``False`` by default)."""
    return _DETERMINISTIC[0]
