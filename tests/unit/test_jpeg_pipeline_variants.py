"""benchmarks/jpeg_pipeline.py refuses a variant it would not run as labelled: an unknown or removed
knob, a value out of its set, or decode threads where there is no pipelined GPU decoder."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from jpeg_pipeline import parse_variant  # noqa: E402


def test_a_known_variant_parses_into_its_parts():
    assert parse_variant("hardware:14:0:graphs=on:dthreads=2:trace=1") == (
        ["hardware", "14", "0"],
        {"graphs": "on", "dthreads": "2", "trace": "1"},
    )


@pytest.mark.parametrize(
    "spec, says",
    [
        ("hardware:14:0:resize=training", "is not one of"),  # a knob removed since
        ("hardware:14:0:trace", "is not one of"),  # no value
        ("gpu:14:0:pipe=2", "pipe=2, expected one of 0, 1"),
        ("cpu:14:0:dthreads=2", "dthreads needs a pipelined GPU decoder"),
        ("gpu:14:0:pipe=0:dthreads=3", "dthreads needs a pipelined GPU decoder"),
        ("gpu:14", "expected decode:workers:cpu_share"),
    ],
)
def test_a_variant_that_would_run_mislabelled_is_refused(spec, says):
    with pytest.raises(SystemExit) as e:
        parse_variant(spec)
    assert says in str(e.value)
