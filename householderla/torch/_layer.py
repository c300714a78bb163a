"""``householderla.torch.OrthogonalLinear``: a linear layer with an orthogonal weight that is
applied to the batch without being formed when that is cheaper.

W is CWY, T-CWY or SVD-Householder of trainable reflectors, as ``hl.torch.orthogonal``
registers it (square CWY from the lower trapezoid of V by default). Forming W costs ≈ 3·N³ + 2·N²·B
flops, applying the reflectors in blocks N·L·nb + 4·N·L·B (:mod:`householderla._operator.blocked`),
so up to B = N the layer never forms W. A square CWY layer's training step runs as one autograd
node (``_autodiff.torch.CWYLinear``, ``docs/theory/cwy.rst``, "One node for a layer"), and its
forward where nothing records it (no grad, inference mode) as the node's forward alone;
``torch.func`` and ``torch.compile`` take the composed nodes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._autodiff.torch import CWYLinear, node_forward
from .._lib.device import device_kind
from .._lib.tracing import is_transformed, needs_graph
from .._lib.tuning import (
    FORMED_BLOCK,
    ONE_NODE,
    OPERATOR_MAX_ROWS,
    SINGLE_BLOCK_APPLIED_MAX_N,
    SINGLE_BLOCK_MAX_N,
    THREADED_SINGLE_BLOCK_MAX_N,
)
from .._operator import blocked as _blocked
from .._operator.plan import LayerFacts, plan_layer
from ._param import INITS, MAPS, STRUCTURES, Orthogonal

__all__ = ["ONE_NODE", "OPERATOR_MAX_ROWS", "SINGLE_BLOCK_MAX_N", "OrthogonalLinear"]


class OrthogonalLinear(torch.nn.Module):
    """y = x Wᵀ + b with W orthogonal (square), with orthonormal columns (out > in) or rows
    (out < in), like ``torch.nn.Linear`` otherwise.

    Parameters
    ----------
    in_features, out_features : int
        Sizes of each input and output row.
    bias : bool
        Learn an additive bias (``torch.nn.Linear``'s initialisation, U(−1/√in, 1/√in)).
    map : {"cwy", "tcwy", "svd"}
        The weight map, as in :func:`householderla.torch.orthogonal` (default "cwy").
    structure : {"trapezoidal", "dense"}, optional
        Square ``"cwy"`` only (the default there: "trapezoidal"): reflector j is read from
        rows j… of ``vectors[0][:, j]`` (the lower trapezoid, LAPACK's and Mhammedi et al.'s
        layout, ICML 2017 eq. 9; the entries above the diagonal are ignored and get zero
        gradients). Products of N such reflectors still reach every orthogonal matrix
        (Householder QR is the constructive inverse), with N(N + 1)/2 parameters instead of
        N², and their blocks skip the zero rows: about half the flops. "dense": every entry
        of V is a parameter (as :func:`householderla.torch.orthogonal` does).
    init : {"haar", "identity"}
        Starting weight: Haar-random, or the identity ``[I; 0]`` by pairs of equal reflectors.
    generator : torch.Generator, optional
        Random source of ``init`` and of the bias.
    device, dtype
        Of the parameters (float32 or float64; default torch's default dtype).

    Attributes
    ----------
    vectors : torch.nn.ParameterList
        The trainable reflection vectors (one tensor for "cwy"/"tcwy"; U_vecs, [ŝ,] V_vecs for
        "svd").
    weight : torch.Tensor
        W, formed on access (assigning an orthogonal W sets the vectors by the constructive
        inverse).

    Notes
    -----
    ``forward`` applies the weight as an operator — ``(W @ xᵀ)ᵀ`` by blocked compact WY for
    CWY, T-CWY's products for rectangular weights — when the batch has at most
    ``OPERATOR_MAX_ROWS · max(in, out)`` rows, and forms W otherwise. Square CWY at N = L:
    N·L·64 + 4·N·L·B flops forward (half that for trapezoidal reflectors) instead of
    ≈ 3·N³ + 2·N²·B. Where a square CWY weight is formed for a training step (autodiff
    recording), it is the same blocks applied to the identity, in the parameters' dtype;
    ``weight`` forms it as :func:`householderla.torch.orthogonal` does (float32 in float64,
    rounded once). A square CWY layer trains through one autograd node instead
    (``ONE_NODE``: the same blocks and the same choice between applying and forming W, by
    the unnormalised form), and its forward where nothing records it (``torch.no_grad``,
    ``torch.inference_mode``, vectors that do not require grad) is that node's forward
    alone: evaluation gives the training forward's numbers at its cost. ``torch.func``
    transforms and ``torch.compile`` take the composed nodes.

    Examples
    --------
    >>> import torch, householderla as hl
    >>> layer = hl.torch.OrthogonalLinear(16, 16, dtype=torch.float64)
    >>> x = torch.randn(4, 16, dtype=torch.float64)
    >>> y = layer(x)
    >>> bool(torch.allclose(y, x @ layer.weight.T + layer.bias))
    True
    >>> y.sum().backward()                      # gradients reach the reflection vectors
    >>> layer.vectors[0].grad.shape
    torch.Size([16, 16])
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        map: str = "cwy",
        *,
        structure: str | None = None,
        init: str = "haar",
        generator: torch.Generator | None = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be a positive integer; got {n!r}")
        if map not in MAPS:
            raise ValueError(f"map must be one of {MAPS}; got {map!r}")
        if init not in INITS or init == "keep":
            raise ValueError(f"init must be 'haar' or 'identity'; got {init!r}")
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"dtype must be torch.float32 or torch.float64; got {dtype}")
        if structure is None:
            square_cwy = map == "cwy" and in_features == out_features
            structure = "trapezoidal" if square_cwy else "dense"
        if structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}; got {structure!r}")
        self.in_features, self.out_features = in_features, out_features
        self.map, self.structure = map, structure
        self._map = Orthogonal((out_features, in_features), map, None, structure=structure)
        with torch.no_grad():
            V = self._map.initial_vectors(init, dtype, device, generator)
        self.vectors = torch.nn.ParameterList(V if isinstance(V, tuple) else (V,))
        if bias:
            bound = 1.0 / math.sqrt(in_features)
            b = torch.rand(out_features, dtype=dtype, device=device, generator=generator)
            self.bias = torch.nn.Parameter((2 * b - 1) * bound)
        else:
            self.register_parameter("bias", None)

    @property
    def weight(self) -> torch.Tensor:
        """W (out_features × in_features), formed (differentiable)."""
        return self._map(*self.vectors)

    @weight.setter
    def weight(self, W: torch.Tensor) -> None:
        with torch.no_grad():
            V = self._map.right_inverse(W)
            for p, v in zip(self.vectors, V if isinstance(V, tuple) else (V,), strict=True):
                p.copy_(v)

    def uses_operator(self, rows: int) -> bool:
        """Whether ``forward`` of a batch of ``rows`` rows applies W without forming it."""
        return rows <= OPERATOR_MAX_ROWS * max(self.in_features, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            got = "a scalar" if x.ndim == 0 else f"shape {tuple(x.shape)}"
            raise ValueError(f"x must have shape (..., {self.in_features}); got {got}")
        x2 = x if x.ndim == 2 else x.reshape(-1, self.in_features)  # (a reshape is an op)
        V = self.vectors[0]  # (a ParameterList lookup costs microseconds: once per call)
        path = plan_layer(self._layer_facts(x2, V))
        if path.name.startswith(("one_node", "node_forward")):
            formed = not self.uses_operator(x2.shape[0])
            trap = self.structure == "trapezoidal"
            if path.name.startswith("one_node"):
                y = CWYLinear.apply(V, x2, trap, formed, path.block)
            else:  # nothing records this forward: the node's math without the node
                y = node_forward(V, x2, trap, formed, path.block)
            # never a view (nor is ``torch.nn.Linear``'s output): ``fully_shard`` hooks a
            # module's outputs for its backward, and an in-place op on a view drops the hook
            if x.ndim != 2:
                y = torch.ops.aten._unsafe_view(y, (*x.shape[:-1], self.out_features))
            return y if self.bias is None else y + self.bias
        if path.name == "formed":
            return torch.nn.functional.linear(x, self._formed(), self.bias)
        op = self._map.operator(*self.vectors)
        if op is None:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        # the method, not ``@``: dynamo puts ``object @ tensor`` into a graph as it is
        y = op.__matmul__(x2.mT).mT.reshape(*x.shape[:-1], self.out_features)
        if self.bias is None:  # a new tensor, as above
            return y if y._base is None else y.clone()
        return y + self.bias

    def _layer_facts(self, x2: torch.Tensor, V: torch.Tensor | None = None) -> LayerFacts:
        """The facts :func:`~householderla._operator.plan.plan_layer` reads for rows x2
        (V: ``vectors[0]``, when the caller has it)."""
        V = self.vectors[0] if V is None else V
        N = max(self.in_features, self.out_features)
        one_node = self._one_node(x2, V)
        inference = not one_node and self._node_inference(x2, V)
        return LayerFacts(
            device=device_kind(V),
            N=N,
            L=V.shape[-1],
            rows=x2.shape[0],
            square_cwy=self.map == "cwy" and self.in_features == self.out_features,
            one_node=one_node,
            operator_rows=OPERATOR_MAX_ROWS * N,
            graph=needs_graph(*self.vectors) if len(self.vectors) > 1 else needs_graph(V),
            block=_blocked.BLOCK,
            formed_block=FORMED_BLOCK,
            single_max_n=SINGLE_BLOCK_MAX_N,
            applied_single_max_n=SINGLE_BLOCK_APPLIED_MAX_N,
            # read only where it matters: dynamo cannot trace it (an int from a torch call),
            # and a compiled forward is never one node
            threads=torch.get_num_threads() if one_node or inference else 1,
            threaded_single_max_n=THREADED_SINGLE_BLOCK_MAX_N,
            node_inference=inference,
        )

    def _one_node(self, x: torch.Tensor, V: torch.Tensor | None = None) -> bool:
        """Whether ``forward`` runs as one ``CWYLinear`` node (``ONE_NODE``): a square CWY
        weight whose vectors autograd records (a training step), x of the
        vectors' dtype, outside ``torch.func`` transforms and ``torch.compile`` tracing
        (which take the composed nodes, whose rules they support)."""
        V = self.vectors[0] if V is None else V
        return (
            self.map == "cwy"
            and x.dtype == V.dtype
            and ONE_NODE
            and self.in_features == self.out_features
            and torch.is_grad_enabled()
            and V.requires_grad
            and not is_transformed(V)
            and not torch.compiler.is_compiling()
        )

    def _node_inference(self, x: torch.Tensor, V: torch.Tensor) -> bool:
        """Whether ``forward`` runs the node's forward without the node: a square CWY weight,
        x of the vectors' dtype, and nothing to record — no grad mode or no input that
        requires grad, no ``torch.func`` transform, no forward-mode dual, no
        ``torch.compile`` tracing (a frozen layer in a network that trains x keeps the
        recorded operator)."""
        return (
            self.map == "cwy"
            and x.dtype == V.dtype
            and ONE_NODE
            and self.in_features == self.out_features
            and not needs_graph(V, x)
            and not torch.compiler.is_compiling()
        )

    def _formed(self) -> torch.Tensor:
        """W for a forward that forms it: under autodiff, a square CWY weight as its operator
        applied to the identity (blocked compact WY, ``_operator.blocked.use_blocks``;
        forward + backward by the blocks of trapezoidal V take half the time of the single
        factor pair that ``weight`` uses);
        ``weight`` otherwise."""
        N = self.in_features
        if self.map != "cwy" or N != self.out_features or not needs_graph(*self.vectors):
            return self.weight
        V = self.vectors[0]
        return self._map.operator(V).__matmul__(torch.eye(N, dtype=V.dtype, device=V.device))

    def extra_repr(self) -> str:
        tail = f", structure={self.structure!r}" if self.structure != "dense" else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, map={self.map!r}{tail}"
        )
