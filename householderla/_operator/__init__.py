"""The CWY operator machinery: factors, blocks, compositions, the sequential path.

``core`` holds :class:`CompactWYOperator` (the products and ``.matrix()`` of
:class:`~householderla.CWY` / :class:`~householderla.TCWY`); ``factors`` the lazily built
U, T; ``blocked`` the blocked factors Q = Q₁⋯Q_m; ``sequential`` the reflections applied one
at a time; ``compose`` and ``linear_operator`` products of operators and the SciPy / NumPy
protocols; ``tall`` the Dask operators of tall-skinny V. Below the public modules: nothing
here imports them.
"""

from __future__ import annotations

import sys

from . import compose, factors, tall

#: Module paths that pickles written before the move name, and the modules now holding those
#: names (an operator pickles its ``LazyFactors``; compositions and tall operators their class).
PICKLED_PATHS = {
    "householderla._factors": factors,
    "householderla._compose": compose,
    "householderla._tall": tall,
}
for _old, _module in PICKLED_PATHS.items():
    sys.modules.setdefault(_old, _module)
