"""The recurrent cells that ``sequential_digits.py`` and ``adding_task.py`` compare.

Every orthogonal cell is the orthogonal RNN of that literature (Arjovsky et al. 2016; Mhammedi
et al. 2017; Lezcano-Casado & Martínez-Rubio 2019; Likhosherstov et al. 2021):

    h_t = modReLU(W h_{t−1} + A x_t),   modReLU(z) = sign(z)·relu(|z| + b),

with W ∈ O(N) made by one of the maps below, formed once per sequence (then T cheap products):

==============  ==============================================================================
``ornn``        ``hl.ornn(U, sign)``: W = H_N(u_N)…H_2(u_2)·H_1 with u_k ∈ ℝᵏ (Mhammedi et al.,
                ICML 2017, eq. 6–9; N − 1 vectors, all of O(N) by their Theorem 1)
``cwy``         ``hl.torch.orthogonal(..., map="cwy")``: W = H(v₁)…H(v_N) in compact WY form
                (Likhosherstov et al., AISTATS 2021, Theorems 1–2)
``tcwy``        ``map="tcwy"``: the truncated map γ_{N,N} (their Theorem 3; the same image,
                computed as T-CWY)
``svd``         ``map="svd"``: W = Q_U Σ Q_Vᵀ with σ = 1, both factors products of reflections
                (Zhang, Lei & Dhillon, ICML 2018, eq. 3)
``matrix_exp``  ``torch.nn.utils.parametrizations.orthogonal(..., orthogonal_map="matrix_exp")``
``cayley``      the same with ``"cayley"``
``householder`` the same with ``"householder"`` (LAPACK's reflectors, ``householder_product``)
``lstm``        ``torch.nn.LSTMCell`` (no constraint; the gated baseline)
``rnn``         the modReLU cell with an unconstrained W (``torch.nn.Linear``'s initialisation)
==============  ==============================================================================

The readout is a linear map of the last state. Training uses RMSprop with the learning rates of
Lezcano-Casado & Martínez-Rubio's code, which the CWY paper reuses: 1e-3, and 1e-4 for the
parameters of W in the orthogonal cells.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.utils import parametrizations, parametrize

import householderla as hl
import householderla.torch as hlt

MAPS = ("ornn", "cwy", "tcwy", "svd", "matrix_exp", "cayley", "householder", "lstm", "rnn")
LABELS = {
    "ornn": "oRNN map (hl)",
    "cwy": "CWY (hl)",
    "tcwy": "T-CWY (hl)",
    "svd": "SVD-Householder (hl)",
    "matrix_exp": "torch matrix_exp",
    "cayley": "torch cayley",
    "householder": "torch householder",
    "lstm": "LSTM",
    "rnn": "RNN, unconstrained W",
}


class ModReLU(torch.nn.Module):
    """modReLU(z) = sign(z)·relu(|z| + b) (Arjovsky et al. 2016): 1-Lipschitz, norm-preserving
    where |z| + b > 0 and b ≥ 0."""

    def __init__(self, n: int, gen: torch.Generator) -> None:
        super().__init__()
        self.b = torch.nn.Parameter(0.02 * torch.rand(n, generator=gen) - 0.01)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sign(z) * torch.relu(torch.abs(z) + self.b)


def _haar(n: int, gen: torch.Generator) -> torch.Tensor:
    Q, R = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return Q * torch.sign(torch.diagonal(R))


class RecurrentNet(torch.nn.Module):
    """x (B, T, n_in) -> logits / prediction (B, n_out) from the last state, for every map."""

    def __init__(self, n_in: int, hidden: int, n_out: int, map: str, seed: int = 0) -> None:
        super().__init__()
        if map not in MAPS:
            raise ValueError(f"map must be one of {MAPS}; got {map!r}")
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # torch.nn initialisations
        self.map, self.hidden = map, hidden
        self.readout = torch.nn.Linear(hidden, n_out)
        if map == "lstm":
            self.cell = torch.nn.LSTMCell(n_in, hidden)
            return
        self.inp = torch.nn.Linear(n_in, hidden)
        self.act = ModReLU(hidden, gen)
        if map == "ornn":
            U, sign = hl.ornn_params(_haar(hidden, gen))  # a Haar-random start, as the others
            self.U = torch.nn.Parameter(U.float())
            self.register_buffer("sign", torch.as_tensor(sign, dtype=torch.float32))
            return
        self.recurrent = torch.nn.Linear(hidden, hidden, bias=False)
        if map in ("cwy", "tcwy", "svd"):
            hlt.orthogonal(self.recurrent, map=map, generator=gen)
        elif map != "rnn":
            parametrizations.orthogonal(self.recurrent, orthogonal_map=map)

    def orthogonal_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters of W (trained at the smaller learning rate)."""
        if self.map in ("lstm", "rnn"):
            return []
        if self.map == "ornn":
            return [self.U]
        return list(self.recurrent.parameters())

    def recurrent_matrix(self) -> torch.Tensor:
        if self.map == "ornn":
            return hl.ornn(self.U, self.sign).matrix()
        return self.recurrent.weight

    def forward(self, x: torch.Tensor, states: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Output of the last state; ``states``, if a list, receives h_1 … h_T."""
        B, T, _ = x.shape
        h = x.new_zeros(B, self.hidden)
        if self.map == "lstm":
            c = x.new_zeros(B, self.hidden)
            for t in range(T):
                h, c = self.cell(x[:, t], (h, c))
                if states is not None:
                    states.append(h)
            return self.readout(h)
        ax = self.inp(x)  # (B, T, N): all input projections at once
        with parametrize.cached():  # W formed once per sequence, not per step
            Wt = self.recurrent_matrix().T
            for t in range(T):
                h = self.act(h @ Wt + ax[:, t])
                if states is not None:
                    states.append(h)
        return self.readout(h)


def optimizer(model: RecurrentNet, lr: float = 1e-3, lr_orth: float = 1e-4) -> Any:
    """RMSprop, ``lr_orth`` for the parameters of W in the orthogonal cells."""
    orth = model.orthogonal_parameters()
    ids = {id(p) for p in orth}
    others = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": others, "lr": lr}]
    if orth:
        groups.append({"params": orth, "lr": lr_orth})
    return torch.optim.RMSprop(groups)


def gradient_profile(model: RecurrentNet, x: torch.Tensor, loss_fn: Any) -> list[float]:
    """‖∂L/∂h_t‖ for t = 1 … T (mean over the batch): how the gradient of the loss at the last
    step reaches the states of the earlier steps."""
    states: list[torch.Tensor] = []
    model.zero_grad()
    out = model(x, states)
    for h in states:
        h.retain_grad()
    loss_fn(out).backward()
    model.zero_grad()
    return [float(h.grad.norm(dim=1).mean()) for h in states]


def orth_error(model: RecurrentNet) -> float:
    """‖WᵀW − I‖_F of the recurrent matrix (NaN for the LSTM)."""
    if model.map == "lstm":
        return float("nan")
    with torch.no_grad():
        W = model.recurrent_matrix().double()
        return float(torch.linalg.matrix_norm(W.T @ W - torch.eye(W.shape[0], dtype=W.dtype)))
