"""The gallery scripts of ``examples/`` at toy sizes (a few seconds each): they run end to end
through ``main`` and write their JSON and PNG, and the facts they rest on hold — the PRW gradient
formula, the Stiefel constraints after training, the adding task's data and baseline.

The docs build runs the pages' larger build-time versions; the full runs are the scripts'
defaults (``benchmarks/results/gallery/``).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require

torch = require("torch")
pytest.importorskip("matplotlib", reason="the gallery scripts plot (docs extra)")

pytestmark = pytest.mark.no_dask("the examples run torch models, no Dask operand")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))


def _run(module: str, tmp_path: Path, *args: str) -> dict:
    mod = __import__(module)
    before = torch.get_num_threads()
    try:
        assert mod.main(["--out", str(tmp_path), "--no-progress", *args]) == 0
    finally:
        torch.set_num_threads(before)  # main() sets one thread
    assert (tmp_path / f"{module}.png").stat().st_size > 0
    return json.loads((tmp_path / f"{module}.json").read_text())


# -- projection robust Wasserstein -----------------------------------------------------------
def test_prw_gradient_is_the_envelope_gradient() -> None:
    """coupling_gradient(…) = ½ ∂/∂U ⟨π, C(U)⟩ for any fixed π (the formula without the n²
    differences against autograd through the n × n × d differences); float64 rounding."""
    prw = pytest.importorskip("projection_robust_wasserstein")
    gen = torch.Generator().manual_seed(0)
    x, y = prw.fragmented_hypercube(30, 7, gen)
    U = torch.randn(7, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    P = torch.rand(30, 30, dtype=torch.float64, generator=gen)
    (P * prw.sq_dists(x @ U, y @ U)).sum().backward()
    Ud = U.detach()
    G = 2 * prw.coupling_gradient(x, y, x @ Ud, y @ Ud, P)
    assert torch.allclose(G, U.grad, rtol=1e-12, atol=1e-12)


def test_prw_sinkhorn_plan_has_uniform_marginals() -> None:
    prw = pytest.importorskip("projection_robust_wasserstein")
    gen = torch.Generator().manual_seed(1)
    x, y = prw.fragmented_hypercube(40, 5, gen)
    P = prw.Sinkhorn(40, 1.0, tol=1e-10).plan(prw.sq_dists(x, y))
    # the row marginals are checked against tol (L1) when the loop stops; columns are exact
    assert float((P.sum(1) - 1 / 40).abs().sum()) < 1e-9
    assert float((P.sum(0) - 1 / 40).abs().max()) < 1e-14


def test_prw_script(tmp_path: Path) -> None:
    pytest.importorskip("geoopt", reason="a baseline of the PRW example (docs/bench extras)")
    pytest.importorskip("scipy.optimize")
    res = _run(
        "projection_robust_wasserstein",
        tmp_path,
        *("--dims", "6", "--seeds", "1", "--iters", "15", "--n", "20"),
    )
    w2 = res["w2_all_coordinates"]
    for name, r in res["methods"].items():
        # a projection never increases a transport cost: P_k² ≤ W₂² of all coordinates
        assert all(p <= w + 1e-9 for p, w in zip(r["prw2_mean"], w2, strict=True)), name
        # every method keeps U on St(d, 2): rounding of a few float64 products
        assert r["max_orth_err"] < 1e-12, name
        assert len(r["curve_largest_d"]) == 15


# -- orthogonal attention ----------------------------------------------------------------------
def test_attention_script(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="the digits data set (docs extra)")
    runs = ["Stiefel SGD, within heads", "Stiefel Adam, across heads", "Adam, T-CWY within heads"]
    res = _run(
        "orthogonal_attention", tmp_path, "--epochs", "1", "--train-limit", "96", "--runs", *runs
    )
    for name in runs:
        s = res["summary"][name]
        # float32 parameters: the optimizers and T-CWY keep ‖WᵀW − I‖_F at rounding level
        assert s["max_orth_err"] < 1e-5, name
        assert 0.0 <= s["test_acc_final_mean"] <= 1.0


def test_attention_across_heads_concatenation_is_orthogonal() -> None:
    """ "across heads": the per-head views of the (d_model, h·d_k) parameter are mutually
    orthogonal, so their concatenation is in St(d_model, h·d_k)."""
    att = pytest.importorskip("orthogonal_attention")
    model = att.ViT("across", seed=0)
    Wq = model.blocks[0].attn.projections()[0].double()  # (h, d_model, d_k)
    cat = torch.cat(list(Wq), dim=1)
    assert torch.allclose(cat.T @ cat, torch.eye(cat.shape[1], dtype=cat.dtype), atol=1e-6)


# -- orthogonal RNNs ---------------------------------------------------------------------------
def test_sequential_digits_script(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="the digits data set (docs extra)")
    res = _run(
        "sequential_digits",
        tmp_path,
        *("--hidden", "8", "--epochs", "1", "--train-limit", "64"),
        *("--maps", "ornn", "tcwy", "svd", "lstm"),
    )
    for m in ("ornn", "tcwy", "svd"):
        assert res["runs"][m]["orth_err"] < 1e-5, m  # float32 W formed from float32 vectors
        assert len(res["runs"][m]["grad_profile"]) == 64
    assert math.isnan(float(res["runs"]["lstm"]["orth_err"]))


def test_adding_task_script(tmp_path: Path) -> None:
    res = _run(
        "adding_task",
        tmp_path,
        *("--T", "10", "--hidden", "8", "--steps", "3", "--maps", "cwy", "householder", "rnn"),
    )
    assert set(res["runs"]) == {"cwy", "householder", "rnn"}
    assert res["runs"]["cwy"]["orth_err"] < 1e-5


def test_adding_task_data_and_baseline() -> None:
    """The target is the sum of the two marked values, one mark in each half; predicting 1
    costs Var(u₁ + u₂) = 1/6."""
    add = pytest.importorskip("adding_task")
    x, y = add.adding_batch(20, 20000, torch.Generator().manual_seed(0))
    marks = x[:, :, 1]
    assert torch.all(marks[:, :10].sum(1) == 1) and torch.all(marks[:, 10:].sum(1) == 1)
    assert torch.allclose((x[:, :, 0] * marks).sum(1, keepdim=True), y)
    mse = float(((y - 1) ** 2).mean())
    # the sample mean of (u₁ + u₂ − 1)² has std ≈ sqrt(Var/20000) ≈ 1.2e-3: 5σ
    assert abs(mse - add.BASELINE) < 6e-3


def test_gradient_profile_of_orthogonal_cells_is_flat() -> None:
    """With W orthogonal and modReLU 1-Lipschitz, ‖∂L/∂h_t‖ ≤ ‖∂L/∂h_T‖ at every t, and at
    initialisation (b ≈ 0, so modReLU ≈ identity) the gradient reaches step 1 nearly intact;
    an unconstrained W of torch.nn.Linear's initialisation does not."""
    rnn = pytest.importorskip("orthogonal_rnns")
    x = torch.randn(16, 40, 1, generator=torch.Generator().manual_seed(0))

    def loss(out: torch.Tensor) -> torch.Tensor:
        return out.square().sum()

    for m in ("ornn", "cwy", "svd"):
        prof = np.array(rnn.gradient_profile(rnn.RecurrentNet(1, 16, 3, m, seed=0), x, loss))
        # float32 products over 40 steps: a relative slack of 1e-4
        assert np.all(prof <= prof[-1] * (1 + 1e-4)), m
        assert prof[0] > 0.5 * prof[-1], m
    prof = np.array(rnn.gradient_profile(rnn.RecurrentNet(1, 16, 3, "rnn", seed=0), x, loss))
    assert not 0.5 * prof[-1] < prof[0] <= prof[-1] * (1 + 1e-4)


# -- every script ------------------------------------------------------------------------------
#: modules of examples/ that the scripts import, not scripts themselves
MODULES = {"orthogonal_rnns"}
SCRIPTS = sorted(
    p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_") and p.stem not in MODULES
)


def test_the_scripts_are_found() -> None:
    """The list above is not empty by accident (a renamed folder would skip every case)."""
    assert {"copying_task", "sequential_digits", "training_time"} <= set(SCRIPTS)


@pytest.mark.parametrize("module", SCRIPTS)
def test_every_script_takes_quick(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every gallery script takes the gallery's options, ``--quick`` (the docs page's short run,
    ≤ 2 minutes) among them; ``--help`` stops before any work."""
    mod = __import__(module)
    with pytest.raises(SystemExit) as exc:
        mod.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--quick", "--out", "--seed", "--threads", "--no-progress"):
        assert flag in out, (module, flag)


# -- PEFT fine-tuning ------------------------------------------------------------------------------
def test_peft_finetuning_script(tmp_path: Path) -> None:
    """The five methods run; PEFT's HRA and ours, seeded alike, follow the same curve."""
    require("peft")
    require("transformers")
    res = _run("peft_finetuning", tmp_path, "--quick", "--steps", "3")
    methods = res["methods"]
    assert list(methods) == ["LoRA", "peft HRA", "hl HRA", "peft OFT (Neumann)", "hl OFT"]
    assert all(len(v["loss"]) == 3 for v in methods.values())
    # the same function to float32 rounding, 3 Adam steps: the losses agree closely
    np.testing.assert_allclose(methods["hl HRA"]["loss"], methods["peft HRA"]["loss"], rtol=1e-4)


# -- copying task --------------------------------------------------------------------------------
def test_copying_task_script(tmp_path: Path) -> None:
    cp = pytest.importorskip("copying_task")
    res = _run("copying_task", tmp_path, *("--T", "3", "--hidden", "8", "--steps", "4"))
    assert (res["T"], res["hidden"], res["steps"]) == (3, 8, 4)
    assert len(res["loss"]) == len(res["orth_err"]) == 4
    assert res["baseline"] == pytest.approx(cp.baseline(3)) == pytest.approx(10 * math.log(8) / 23)
    assert max(res["orth_err"]) < 1e-5  # float32 W formed in float64, rounded once
