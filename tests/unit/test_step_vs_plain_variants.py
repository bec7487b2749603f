"""benchmarks/step_vs_plain.py runs a variant only as labelled: SpeedConfig fields and inductor options
typed as their defaults are, anything else refused before a model is built."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from step_vs_plain import parse_variant  # noqa: E402


def test_fields_and_inductor_options_take_their_defaults_types():
    speed, inductor = parse_variant(
        "compile=default,compile_tuning=1,cuda_graphs=on,inductor.coordinate_descent_search_radius=2,"
        "inductor.triton.cudagraphs=off"
    )
    assert speed == {"compile": "default", "compile_tuning": True, "cuda_graphs": "on"}
    assert inductor == {"coordinate_descent_search_radius": 2, "triton.cudagraphs": False}
    assert type(inductor["coordinate_descent_search_radius"]) is int  # not True, which 1 would also read as


@pytest.mark.parametrize(
    "spec, says",
    [
        ("compile_tuning=yes", "compile_tuning=yes, expected one of"),  # a string would read as true
        ("inductor.coordinate_descent_search_radius=wide", "expected a int"),
        ("inductor.no_such_option=1", "has no inductor option 'no_such_option'"),
        ("batch=512", "is not a SpeedConfig field"),
        ("compile", "is not key=value"),
    ],
)
def test_a_variant_that_would_not_run_as_labelled_is_refused(spec, says):
    with pytest.raises(SystemExit, match=says):
        parse_variant(spec)
