"""``docs/guarantees.rst`` claim by claim: every claim names the tests that check it.

The page is read as the user reads it: each bullet of "Conventions for every function" (its
bold lead) and each cell of the "Per function" table (the function cell and the column: error
bound, rank deficiency, scaling) that says more than "—" is one claim. ``CHECKS`` maps each
claim to the tests that would fail if it stopped holding; this test fails when a claim has no
check, names a test that does not exist, or a check names a claim the page no longer makes.
The checks themselves run with the rest of the suite (two of them, which no other test
covered, are below).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

import householderla as hl

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guarantees.rst"
HERE = "test_guarantees.py"

CONVENTIONS = {
    "Non-finite parameters": [
        "test_bad_input.py::test_nan_and_inf_rejected_on_eager_arrays",
        "test_reliability.py::test_non_finite_arguments_are_named",
        "test_bad_input.py::test_nan_propagates_under_jit",
    ],
    "Non-finite operands": [
        "test_reliability.py::test_non_finite_operands_propagate_column_by_column"
    ],
    "Empty input": [
        "test_reliability.py::test_empty_shapes_give_empty_results",
        "test_reliability.py::test_empty_operand_columns",
        "test_reliability.py::test_orthogonal_group_of_order_zero",
    ],
    "Scale.": [
        "test_reliability.py::test_retractions_and_polar_are_scale_invariant",
        "test_reliability.py::test_subnormal_reflectors_on_every_numpy_path",
        "test_reliability.py::test_subnormal_reflectors_on_every_eager_backend",
    ],
    "The same product, the same bits": [
        "test_deterministic.py::test_the_same_product_gives_the_same_bits_on_numpy",
        "test_deterministic.py::test_the_same_product_gives_the_same_bits_on_torch",
        "test_deterministic.py::test_the_switch_returns_the_old_mode_and_checks_its_argument",
    ],
    "Inputs": [
        "test_bad_input.py::test_read_only_and_non_contiguous_inputs",
        "test_cwy.py::test_inputs_are_not_mutated",
        "test_fuzz.py::test_every_public_function_in_every_layout",
    ],
}

#: the first function of a row -> {column: tests}; columns as the table's header names them
ROWS = {
    "householderla.cwy": {
        "error": [
            "test_cwy.py::test_orthogonality_beats_lapack_orgqr",
            "test_fuzz.py::test_cwy_apply_and_matrix_match_the_definition",
        ],
        "degenerate": [
            "test_cwy.py::test_zero_column_is_identity_reflector",
            "test_vjp.py::test_torch_autograd_uses_explicit_vjp_and_matches_hl_vjp",
        ],
        "scaling": [
            "test_reliability.py::test_subnormal_reflectors_on_every_numpy_path",
            "test_reliability.py::test_subnormal_reflectors_on_every_eager_backend",
        ],
    },
    "hl.lineax.operator": {
        "error": [
            "test_lineax.py::test_solves_equal_dense_least_squares",
            "test_lineax.py::test_complex_operators_equal_lineax_on_the_dense_matrix",
            "test_lineax.py::test_complex_orthogonal_solve_is_one_application_of_the_adjoint",
            "test_lineax.py::test_grad_of_a_complex_solve_matches_central_differences",
        ],
    },
    "householderla.householder_apply": {
        "error": ["test_householder.py::test_sequential_product_matches_dense_and_batches"],
        "degenerate": ["test_bad_input.py::test_zero_reflectors_is_the_identity"],
        "scaling": ["test_reliability.py::test_subnormal_reflectors_on_every_numpy_path"],
    },
    "householderla.householder_vectors": {
        "error": [
            "test_fuzz.py::test_constructive_inverse_of_a_scaled_orthogonal_matrix",
            "test_fuzz.py::test_constructive_inverses_of_scaled_matrices_on_every_backend",
        ],
        "degenerate": [
            "test_householder.py::test_inverse_of_general_matrix_is_positive_qr_factor",
            "test_householder.py::test_theorem1_and_corollary1_round_trip_every_determinant",
        ],
        "scaling": [
            "test_reliability.py::test_constructive_inverses_are_scale_invariant",
            "test_reliability.py::test_orthogonal_q_with_tiny_entries",
        ],
    },
    "householderla.polar": {
        "error": [
            "test_retractions.py::test_one_shot_polar_vs_householder_qr_floor",
            "test_retractions.py::test_a_posteriori_check_catches_a_wrong_count",
        ],
        "degenerate": [
            "test_reliability.py::test_polar_rank_deficient_option",
            "test_reliability.py::test_polar_wide_matches_scipy",
            "test_retractions.py::test_ill_conditioned_falls_back_and_rank_deficient_raises",
        ],
        "scaling": [
            "test_reliability.py::test_retractions_and_polar_are_scale_invariant",
            "test_retractions.py::test_polar_scale_invariance_no_overflow",
        ],
    },
    "householderla.polar (schedule=)": {
        "error": [
            "test_polar_schedules.py::test_certified_upper_holds_for_nearly_rank_one_inputs",
            "test_polar_schedules.py::test_fixed_step_singular_values_in_exact_interval",
            "test_polar_schedules.py::test_norm_slack_covers_any_summation_order",
            "test_polar_schedules.py::test_muon_float32_update_within_the_certificate",
            "test_distributed.py::test_distributed",
        ],
        "degenerate": ["test_polar_schedules.py::test_fixed_step_edge_cases_and_errors"],
        "scaling": [
            "test_polar_schedules.py::test_polar_of_power_of_two_multiples_is_bit_for_bit_the_same",
            "test_fuzz.py::test_polar_paths_at_every_power_of_two_scale_on_every_backend",
            "test_muon.py::test_update_is_the_same_at_every_power_of_two_gradient_scale",
        ],
    },
    "householderla.qr_retraction": {
        "error": ["test_retractions.py::test_qr_retraction_positive_diagonal_and_matches_numpy"],
        "degenerate": [f"{HERE}::test_qr_retraction_keeps_sign_plus_one_at_a_zero_diagonal"],
        "scaling": ["test_reliability.py::test_retractions_and_polar_are_scale_invariant"],
    },
    "householderla.cayley_retraction": {
        "error": [
            "test_retractions.py::test_cayley_smw_equals_dense_cayley",
            "test_retractions.py::test_cayley_drift_guard",
            "test_cayley_edges.py::test_the_basis_path_equals_the_dense_cayley",
            "test_cayley_edges.py::test_huge_steps_under_jax_jit",
            "test_cayley_edges.py::test_peak_memory_at_most_two_times_x",
        ],
        "degenerate": [
            "test_cayley_edges.py::test_huge_steps_never_raise_and_stay_on_the_manifold",
            "test_cayley_edges.py::test_the_limit_of_a_huge_step_is_the_reflection_on_the_range_of_w",
        ],
        "scaling": [
            "test_reliability.py::test_retractions_and_polar_are_scale_invariant",
            "test_cayley_edges.py::test_columns_of_very_different_scales_stay_on_the_manifold",
        ],
    },
    "householderla.riemannian_gradient": {
        "error": ["test_retractions.py::test_riemannian_gradient_definition"],
        "scaling": [f"{HERE}::test_riemannian_gradient_is_linear_in_g"],
    },
    "hl.stiefel.momentum_sgd": {
        "error": [
            "test_stiefel.py::test_structure_preserved_every_step",
            "test_stiefel.py::test_leading_eigenvalues_converge",
            "test_distributed.py::test_distributed",
        ],
        "degenerate": [
            "test_stiefel.py::test_gaussian_start_projected_in_one_step",
            "test_stiefel_torch.py::test_large_steps_from_a_rank_deficient_start_do_not_stop",
        ],
        "scaling": [
            "test_fuzz.py::test_optimizer_steps_at_extreme_gradient_scales_on_every_backend",
            "test_stiefel_torch.py::test_a_non_finite_gradient_moves_nothing",
        ],
    },
    "hl.torch.orthogonal": {
        "error": ["test_torch_adapter.py::test_orthogonal_weight_is_orthogonal_and_trains"],
        "degenerate": [
            "test_torch_adapter.py::test_assigning_the_identity_does_not_freeze_the_weight"
        ],
    },
}

COLUMNS = ("error", "degenerate", "scaling")


def _claims() -> dict[str, list[str]]:
    """claim -> the text the page says for it, read from the page."""
    text = PAGE.read_text(encoding="utf-8")
    conv = text.split("Conventions for every function", 1)[1].split("Per function", 1)[0]
    claims = {}
    for m in re.finditer(r"^\* \*\*(.+?)\*\*", conv, flags=re.MULTILINE):
        claims[f"convention: {m.group(1).strip()}"] = m.group(0)
    table = text.split("Per function", 1)[1]
    rows = re.split(r"^   \* - ", table, flags=re.MULTILINE)[1:]
    for row in rows:
        cells = [c.strip() for c in re.split(r"^     - ", row, flags=re.MULTILINE)]
        first = re.search(r"(householderla\.[\w.]+|hl\.[\w.]+)", cells[0])
        if first is None:
            continue  # the header row
        row = first.group(1) + (" (schedule=)" if "schedule=" in cells[0] else "")
        for column, cell in zip(COLUMNS, cells[1:], strict=False):
            if cell and cell != "—":
                claims[f"{row}: {column}"] = cell
    return claims


def _checks() -> dict[str, list[str]]:
    out = {f"convention: {k}": v for k, v in CONVENTIONS.items()}
    for row, cols in ROWS.items():
        out.update({f"{row}: {c}": v for c, v in cols.items()})
    return out


def _test_functions(file: str) -> set[str]:
    tree = ast.parse((ROOT / "tests" / file).read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_every_claim_of_the_guarantees_page_names_existing_checks():
    claims, checks = _claims(), _checks()
    assert len(claims) >= 28, sorted(claims)  # the page was read (6 conventions, 10 rows)
    missing = sorted(set(claims) - set(checks))
    assert not missing, f"claims of docs/guarantees.rst without a check: {missing}"
    stale = sorted(set(checks) - set(claims))
    assert not stale, f"checks of claims the page no longer makes: {stale}"
    for claim, tests in checks.items():
        assert tests, claim
        for t in tests:
            file, name = t.split("::")
            assert name in _test_functions(file), f"{claim}: {t} does not exist"


def test_qr_retraction_keeps_sign_plus_one_at_a_zero_diagonal():
    """qf(X + tZ) with a zero diagonal entry of R (rank-deficient X + tZ): that column's sign
    stays +1, i.e. the Q column is LAPACK's own (no NaN from a sign of 0)."""
    X = np.zeros((4, 2))
    X[0, 0] = 1.0  # column 1 is 0: R[1, 1] = 0
    Y = hl.qr_retraction(X, np.zeros_like(X), 1.0)
    Q, R = np.linalg.qr(X)
    assert np.all(np.isfinite(Y)) and R[1, 1] == 0
    np.testing.assert_allclose(Y[:, 1], Q[:, 1] * (1.0 if R[1, 1] >= 0 else -1.0), atol=1e-15)
    np.testing.assert_allclose(Y[:, 0], Q[:, 0] * np.sign(R[0, 0]), atol=1e-15)


@pytest.mark.parametrize("c", [2.0**-600, -3.0, 7.5, 2.0**600])
def test_riemannian_gradient_is_linear_in_g(c):
    """grad f(X) is linear in G: G ↦ cG gives c·grad, to rounding, at any finite scale."""
    rng = np.random.default_rng(3)
    X = np.linalg.qr(rng.standard_normal((7, 3)))[0]
    G = rng.standard_normal((7, 3))
    ref = hl.riemannian_gradient(X, G)
    np.testing.assert_allclose(hl.riemannian_gradient(X, c * G) / c, ref, rtol=1e-14, atol=1e-15)
