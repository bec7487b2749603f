"""benchmarks/jpeg_pipeline.py refuses a variant it would not run as labelled: an unknown or removed
knob, or a value out of its set."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from jpeg_pipeline import parse_variant  # noqa: E402


def test_a_known_variant_parses_into_its_parts():
    assert parse_variant("hardware:14:0:graphs=on:prio=-1:trace=1:batch=512") == (
        ["hardware", "14", "0"],
        {"graphs": "on", "prio": "-1", "trace": "1", "batch": "512"},
    )


@pytest.mark.parametrize(
    "spec, says",
    [
        ("hardware:14:0:resize=training", "is not one of"),  # knobs removed since
        ("hardware:14:0:dthreads=3", "is not one of"),
        ("hardware:14:0:cchunk=1", "is not one of"),
        ("hardware:14:0:trace", "is not one of"),  # no value
        ("gpu:14:0:pipe=2", "pipe=2, expected one of 0, 1"),
        ("gpu:14", "expected decode:workers:cpu_share"),
        ("gpu:14:0:batch=big", "batch=big, expected a number"),
    ],
)
def test_a_variant_that_would_run_mislabelled_is_refused(spec, says):
    with pytest.raises(SystemExit) as e:
        parse_variant(spec)
    assert says in str(e.value)
