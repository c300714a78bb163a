"""Launch counts (issue 44, item 3): ``benchmarks.launches`` counts the top-level aten ops of a
call with ``torch.profiler`` on the CPU, and the CUDA path it counts (run on CPU tensors under
``emulate_device("cuda")``) computes what the CPU path computes.

Tolerances: 100·eps·N on entries of O(1) between the two paths (each a sum of N products
whose rounding errors add to a few eps·N; the CUDA path accumulates float32 in float32, the
CPU path in float64); the dot-product test compares ⟨∇f, D⟩ with a central difference of
step 1e-6 in float64 (truncation O(h²) ≈ 1e-12, rounding eps/h ≈ 1e-10 relative).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require

torch = require("torch")
pytest.importorskip("torch.profiler")

import householderla.torch as hlt  # noqa: E402
from householderla._lib.device import emulate_device  # noqa: E402

pytestmark = pytest.mark.no_dask("torch layers and the profiler, no Dask operand")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import launches as LC  # noqa: E402


def test_count_of_a_tiny_function():
    """``a @ b + c``: two top-level aten ops (matmul and add; mm runs inside matmul and is not
    counted)."""
    a, b, c = torch.randn(3, 3), torch.randn(3, 3), torch.randn(3, 3)
    assert LC.op_names(lambda: a @ b + c) == ["aten::matmul", "aten::add"]
    assert LC.count_ops(lambda: a @ b + c) == 2
    assert LC.count_ops(lambda: None) == 0


def test_quick_run_writes_every_row(tmp_path):
    out = LC.main(["--quick", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "launches.json").read_text())
    assert rows == out
    keys = {"what", "N", "B", "path", "ops", "anchor", "anchor_ops"}
    assert all(set(r) == keys for r in rows)
    whats = {r["what"] for r in rows}
    assert whats == {
        "OrthogonalLinear training step",
        "from_lapack(a, tau).matrix()",
        "prebuilt op @ h",
        "fresh cwy(V) @ h",
        "Muon step",
    }
    assert {r["path"] for r in rows} == {"cpu", "cuda"}
    n = len(LC.QUICK["layer"]) + len(LC.QUICK["form"]) + 2 * len(LC.QUICK["apply"])
    assert len(rows) == 2 * (n + len(LC.QUICK["muon"]))
    # (torch.optim.Muon is in recent torch only: its count is None on older ones)
    no_muon = not hasattr(torch.optim, "Muon")
    assert all(
        r["ops"] > 0
        and (
            r["anchor_ops"] is None if no_muon and r["what"] == "Muon step" else r["anchor_ops"] > 0
        )
        for r in rows
    )
    # the CUDA path of a training step: few ops, at most twice torch's Cayley map's
    for r in rows:
        if r["what"] == "OrthogonalLinear training step" and r["path"] == "cuda":
            assert r["ops"] <= min(100, 2 * r["anchor_ops"]), r


def _layer(N, dtype, structure=None):
    gen = torch.Generator().manual_seed(0)
    return hlt.OrthogonalLinear(N, N, bias=True, structure=structure, generator=gen, dtype=dtype)


def _step(layer, x, G):
    layer.zero_grad()
    y = layer(x)
    (y * G).sum().backward()
    return y.detach(), layer.vectors[0].grad.clone(), layer.bias.grad.clone()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("structure", ["trapezoidal", "dense"])
@pytest.mark.parametrize(("N", "B"), [(24, 5), (24, 40), (200, 16)])
def test_cuda_path_of_the_layer_equals_the_cpu_path(dtype, structure, N, B, monkeypatch):
    """Forward and gradients of a training step by the CUDA plan (one block) equal the CPU
    plan's (blocks of 8 here, so that both differ in their arithmetic)."""
    from householderla._operator import blocked as _blocked

    monkeypatch.setattr(_blocked, "BLOCK", 8)
    layer = _layer(N, dtype, structure)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, N, dtype=dtype, generator=gen)
    G = torch.randn(B, N, dtype=dtype, generator=gen)
    assert LC.plan_name(layer, x, "cpu").startswith("one_node")
    assert LC.plan_name(layer, x, "cuda") == "one_node_one_block"
    cpu = _step(layer, x, G)
    with emulate_device("cuda"):
        cuda = _step(layer, x, G)
    tol = 100 * torch.finfo(dtype).eps * N
    for a, b in zip(cpu, cuda, strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=tol, rtol=0)


@pytest.mark.parametrize("structure", ["trapezoidal", "dense"])
@pytest.mark.parametrize(("N", "B"), [(16, 4), (16, 40)])
def test_cuda_path_gradient_dot_product(structure, N, B):
    """⟨∇_V f, D⟩ of f(V) = ⟨G, layer(x)⟩ on the CUDA path equals the central difference of f
    along a random direction D (float64; zero on zero columns of V), applied and formed."""
    layer = _layer(N, torch.float64, structure)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(B, N, dtype=torch.float64, generator=gen)
    G = torch.randn(B, N, dtype=torch.float64, generator=gen)
    D = torch.randn(N, N, dtype=torch.float64, generator=gen)
    if structure == "trapezoidal":
        D = torch.tril(D)
    V = layer.vectors[0]
    # a zero column is H(0) = I, where the map jumps (H(εd) is a reflection for every ε ≠ 0):
    # no derivative along D there
    D = D * (V.detach() != 0).any(dim=0)
    with emulate_device("cuda"):
        _, grad, _ = _step(layer, x, G)
        h = 1e-6
        with torch.no_grad():
            V0 = V.detach().clone()
            V.copy_(V0 + h * D)
            fp = float((layer(x) * G).sum())
            V.copy_(V0 - h * D)
            fm = float((layer(x) * G).sum())
            V.copy_(V0)
    fd = (fp - fm) / (2 * h)
    ad = float((grad * D).sum())
    assert abs(ad - fd) <= 1e-7 * max(1.0, abs(fd)), (ad, fd)
