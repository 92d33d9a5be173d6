"""GEMM efficiency carried between GPUs by the MAMF kernel benchmark (autopar.calibration.ceilings)."""

import json

import pytest

from autopar.calibration import ceilings, loso
from autopar.cost.params import load_cost_model
from autopar.data import data_dir


def test_table_efficiencies_are_its_mamf_over_peak():
    """Each row's efficiency is its MAMF over the table's dense peak (ml-engineering @ 744d01e):
    H100 794.5 / 989 = 80.3 %, GB200 1,822 / 2,500 = 72.9 %, MI300X 668.4 / 1,300 = 51.4 %."""
    table = json.loads((data_dir("cost_models") / ceilings.CEILINGS_FILE).read_text())
    for precision in ("bf16", "fp8"):
        for gpu, row in table[precision].items():
            assert row["efficiency"] == pytest.approx(row["mamf_tflops"] / row["peak_tflops"], abs=6e-4), gpu
    assert ceilings.mamf_efficiency("h100") == 0.803 and ceilings.mamf_efficiency("gb200") == 0.729
    assert ceilings.mamf_efficiency("gb300") is None


def test_carried_gemm_max_hand_worked():
    """H100's fitted 0.583 carried to GB200: 0.583 x 0.729 / 0.803 = 0.5293; to a GPU without a row: kept."""
    assert ceilings.carried_gemm_max(0.583, "h100", "gb200") == pytest.approx(0.583 * 0.729 / 0.803)
    assert ceilings.carried_gemm_max(0.583, "h100", "gb200") == pytest.approx(0.5293, abs=1e-4)
    assert ceilings.carried_gemm_max(0.4734, "gb200", "gb300") == 0.4734


def test_derived_cost_models_match_their_donors_current_fits():
    """The shipped derived files are what `python -m autopar.calibration.ceilings` writes from today's
    donor fits (a refit of h100 or gb200 without rewriting them fails here)."""
    for name, donor in ceilings.DERIVED_FROM.items():
        fitted = load_cost_model(donor)[1]
        own = load_cost_model(name)[1]
        assert own.gemm_max == pytest.approx(ceilings.carried_gemm_max(fitted.gemm_max, donor, name), abs=6e-5), name
        if name.startswith("mi"):
            assert own.fp8_speedup == pytest.approx(fitted.fp8_speedup * ceilings.amd_fp8_gain_ratio(), abs=6e-5)


def test_loso_transfer_to_gb200_carries_gemm_max_by_the_ceilings():
    """With every GB200 run withheld, the gb200 model takes the H100 refit's efficiencies, gemm_max
    carried by 0.729 / 0.803 and fp8_speedup as it is."""
    source = "dgxc-nemo25"
    gb = loso.refit_without(source, "gb200", 0, 16)
    h = loso.refit_without(source, "h100", 0, 16)
    assert gb.gemm_max == pytest.approx(h.gemm_max * 0.729 / 0.803)
    assert gb.fp8_speedup == pytest.approx(h.fp8_speedup)
