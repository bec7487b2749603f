"""benchmarks/step_vs_plain.py runs a variant only as labelled: SpeedConfig fields and inductor options
typed as their defaults are, anything else refused before a model is built."""

import sys
from pathlib import Path

import pytest

from cnnpar.errors import UserError  # a refusal says one line and exits 2 (it exited 1)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from step_vs_plain import aten_fallbacks, parse_variant  # noqa: E402


def test_fields_and_inductor_options_take_their_defaults_types():
    parsed = parse_variant(
        "compile=default,compile_tuning=on,cuda_graphs=on,inductor.coordinate_descent_search_radius=2,"
        "inductor.triton.cudagraphs=off,fallback.max_pool2d_with_indices_backward=1"
    )
    speed, inductor = parsed["speed"], parsed["inductor"]
    assert parsed["fallback"] == ["max_pool2d_with_indices_backward"]
    assert speed == {"compile": "default", "compile_tuning": "on", "cuda_graphs": "on"}
    assert inductor == {"coordinate_descent_search_radius": 2, "triton.cudagraphs": False}
    assert type(inductor["coordinate_descent_search_radius"]) is int  # not True, which 1 would also read as


@pytest.mark.parametrize(
    "spec, says",
    [
        ("cudnn_benchmark=yes", "cudnn_benchmark=yes, expected one of"),  # a string would read as true
        (
            "compile_tuning=1",
            "compile_tuning \\(--compile-tuning\\) = '1': expected one of auto, on, off",
        ),  # on/off since session 17
        ("inductor.coordinate_descent_search_radius=wide", "expected a int"),
        ("inductor.no_such_option=1", "has no inductor option 'no_such_option'"),
        ("batch=512", "is not a SpeedConfig field"),
        ("fallback.no_such_op=1", "expected fallback.<an aten op>=1"),
        ("fallback.max_pool2d_with_indices_backward=0", "expected fallback.<an aten op>=1"),
        ("compile", "is not key=value"),
        (
            "stem_space_to_depth=1",
            "stem_space_to_depth \\(--stem-space-to-depth\\) = '1': expected one of auto, on, off",
        ),  # on/off since s13
        ("compile=fast", "compile \\(--compile\\) = 'fast': expected one of"),
    ],
)
def test_a_variant_that_would_not_run_as_labelled_is_refused(spec, says):
    with pytest.raises(UserError, match=says):
        parse_variant(spec)


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")  # the caches are off on purpose
def test_a_fallback_variant_compiles_the_op_as_atens_call_and_counts_it():
    import torch
    import torch.nn as nn
    from torch._inductor import decomposition, lowering

    before = dict(lowering.lowerings), dict(decomposition.decompositions)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(3, 2, 1))
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    want = torch.autograd.grad(model(x).square().sum(), x)[0]
    torch._dynamo.reset()
    torch.autograd.grad(torch.compile(model)(x).square().sum(), x)  # a compile before: its tables are cached
    torch._dynamo.reset()
    with aten_fallbacks(["max_pool2d_with_indices_backward"]) as used:
        got = torch.autograd.grad(torch.compile(model)(x).square().sum(), x)[0]
    torch._dynamo.reset()
    assert used["max_pool2d_with_indices_backward"] >= 1  # the backward's compile lowered it to aten's call
    torch.testing.assert_close(got, want)
    assert (lowering.lowerings, decomposition.decompositions) == before  # inductor's tables are as they were
