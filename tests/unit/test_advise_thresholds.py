"""The doctor's thresholds at their edges, from the module's own constants: the pipeline/step ratio that makes an
overlapped run data-bound (PIPELINE_SLOWER), and the estimated gain a recommendation needs to be given (MIN_GAIN)."""

from __future__ import annotations

import pytest

from cnnpar.doctor.advise import COMPUTE_BOUND, DATA_BOUND, MIN_GAIN, PIPELINE_SLOWER, diagnose, recommend
from tests.unit.test_advise import facts


@pytest.mark.parametrize(("ratio", "verdict"), [(PIPELINE_SLOWER * 1.02, DATA_BOUND), (PIPELINE_SLOWER * 0.98, None)])
def test_overlapped_loading_is_data_bound_just_above_the_pipeline_threshold_and_not_just_below(ratio, verdict):
    step = 1e-3
    f = facts(workers=4, in_memory=False, data_s=ratio * step, step_s=step, e2e_s=ratio * step)
    assert f.overlapped
    got = diagnose(f)
    assert got.reliable
    if verdict == DATA_BOUND:
        assert got.verdict == DATA_BOUND
        assert f"the pipeline is {ratio:.1f}x slower than the step" in got.reasons[-1]
    else:
        assert got.verdict == COMPUTE_BOUND


def compile_only(gain: float):
    """CPU facts where torch.compile (~1.1x on the step) is the only recommendation, its estimated gain `gain`: the
    step serial with an in-memory pipeline of data_s, which dilutes the step's 1.1x to `gain`."""
    step = 1e-3
    data = step * (1 - gain / 1.1) / (gain - 1)  # (data + step) / (data + step / 1.1) == gain
    return facts(data_s=data, step_s=step, e2e_s=data + step, fixed_step_s=None, compile="off")


@pytest.mark.parametrize("gain", [MIN_GAIN * 0.995, MIN_GAIN * 1.005])
def test_a_recommendation_is_given_only_from_the_minimum_estimated_gain_up(gain):
    recos = recommend(compile_only(gain))
    if gain >= MIN_GAIN:
        [r] = recos
        assert r.key == "compile" and r.est_gain == pytest.approx(gain, rel=1e-9)
    else:
        assert recos == []
