"""The claims on the CPU without measuring: which workload each claim builds, what its two sides
differ in, the verdict's noise rule, and the table's time budget on a fake clock."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

import cnnpar.bench.claims as claims_mod
import cnnpar.bench.probes as probes
import cnnpar.parallel
from cnnpar.bench.claims import (
    BY_ID,
    CLAIMS,
    CNN3_16,
    RESNET18_32,
    ClaimContext,
    Measured,
    Workload,
    run_claims,
    verdict,
    workload_for,
)
from cnnpar.bench.timing import Spread, Timing
from cnnpar.config import Config
from cnnpar.dist import DistInfo
from cnnpar.presets import with_overrides

CUDA = DistInfo(0, 0, 1, torch.device("cuda"))  # a device object only: nothing here touches a GPU
CPU = DistInfo(0, 0, 1, torch.device("cpu"))

# (model, image shape, batch) each claim must build on CUDA: the workload it names
NAMED = {
    "pin_memory": ("resnet50", "3x224x224", 128),
    "collate_speed": ("resnet50", "3x224x224", 128),
    "collate_cpu": ("resnet50", "3x224x224", 128),
    "compiled_preprocess": ("-", "3x32x32", 512),
    "two_streams": ("resnet18", "3x32x32", 512),
    "max_autotune": ("resnet18", "3x32x32", 512),
    "amp_speed": ("resnet50", "3x224x224", 128),
    "amp_batch": ("resnet50", "3x224x224", 128),
    "cudnn_benchmark": ("resnet50", "3x224x224", 128),
    "dynamic_compile": ("resnet18", "3x32x32", 512),
}
# what the two sides of each claim differ in, and nothing else
SWITCH = {
    "pin_memory": {("data", "pin_memory")},
    "collate_speed": {("data", "loader")},
    "collate_cpu": {("data", "loader")},
    "two_streams": {("data", "prefetch_stream")},
    "max_autotune": {("speed", "compile")},
    "amp_speed": {("speed", "precision")},
    "amp_batch": {("speed", "precision")},
    "cudnn_benchmark": {("speed", "cudnn_benchmark")},
}


def differing(a: Config, b: Config) -> set[tuple[str, str]]:
    return {
        (sec.name, f.name)
        for sec in fields(a)
        for f in fields(getattr(a, sec.name))
        if getattr(getattr(a, sec.name), f.name) != getattr(getattr(b, sec.name), f.name)
    }


@pytest.fixture
def recorded(monkeypatch):
    """Run every claim's measure on a CUDA context whose measurements are stubs recording what they got."""
    seen: dict[str, list] = {}
    current = [""]

    def note(item):
        seen.setdefault(current[0], []).append(item)

    rate = {"images_per_s": 100.0, "images_per_s_min": 99.0, "images_per_s_max": 101.0, "steps_per_repeat": 3}
    rate.update(main_cpu_pct=50.0, main_cpu_pct_min=49.0, main_cpu_pct_max=51.0)
    ctx = ClaimContext(Config(), CUDA, Timing(), log=lambda s: None)
    ctx.rate = lambda cfg, w: (note(cfg), rate)[1]
    ctx.bundle = lambda w: None
    monkeypatch.setattr(
        probes, "host_loader_rate", lambda cfg, bundle, timing, host_only=False: (note(cfg), (Spread(1, 1, 1), 3))[1]
    )
    monkeypatch.setattr(probes, "warm_compiler", lambda device: None)
    monkeypatch.setattr(
        probes, "preprocess_ms", lambda batch, c, d, t: (note(tuple(batch.shape)), (Spread(1, 1, 1), 3))[1]
    )
    memory = {"per_image": 2.0**20, "fixed": 0.0, "free": 2.0**30, "largest": 1024}
    monkeypatch.setattr(probes, "step_memory", lambda cfg, shape, n, device, batches: (note((cfg, shape)), memory)[1])
    monkeypatch.setattr(probes, "compile_seconds", lambda cfg, shape, n, d, dynamic: (note((cfg, shape)), 1.0)[1])
    monkeypatch.setattr(cnnpar.parallel, "resolve_for", lambda cfg, device: cfg)
    for claim in CLAIMS:
        current[0] = claim.id
        claim.measure(ctx, workload_for(claim, "cuda"))
    return seen


def test_each_claim_builds_the_workload_it_names(recorded):
    for claim_id, (model, shape, batch) in NAMED.items():
        got = recorded[claim_id]
        assert len(got) == 2, claim_id  # a baseline and a variant
        for item in got:
            if isinstance(item, tuple) and isinstance(item[0], int):  # a preprocessing batch's shape
                assert item == (batch, *map(int, shape.split("x")))
                continue
            cfg, built_shape = item if isinstance(item, tuple) else (item, None)
            assert (cfg.model.name, cfg.data.image_shape, cfg.run.batch_size) == (model, shape, batch), claim_id
            if built_shape is not None:
                assert built_shape == tuple(map(int, shape.split("x")))


def test_the_two_sides_of_a_claim_differ_in_its_switch_alone(recorded):
    for claim_id, switch in SWITCH.items():
        a, b = (item[0] if isinstance(item, tuple) else item for item in recorded[claim_id])
        assert differing(a, b) == switch, claim_id
    pin = recorded["pin_memory"][0]
    assert pin.data.loader == "textbook" and pin.data.workers > 0  # a DataLoader with worker processes
    assert recorded["collate_speed"][0].data.workers == 0


def test_on_a_cpu_claims_keep_their_workload_where_it_fits_and_name_their_stand_in():
    for claim in CLAIMS:
        w = workload_for(claim, "cpu")
        assert workload_for(claim, "cuda") is claim.workload
        if w is None:
            assert claim.needs_cuda  # reported as not measurable here, with the reason
        elif w is claim.workload:
            assert not w.stand_in
        else:
            assert "stand-in" in w.stand_in  # the table names it as such
    assert workload_for(BY_ID["dynamic_compile"], "cpu") is CNN3_16
    assert workload_for(BY_ID["collate_speed"], "cpu") is BY_ID["collate_speed"].workload


def test_a_claim_names_no_model_that_it_does_not_run():
    """compiled_preprocess times the preprocessing alone, yet its progress line and claims.md said "ResNet-18"."""
    claim = BY_ID["compiled_preprocess"]
    for device in ("cuda", "cpu"):
        w = workload_for(claim, device)
        assert "ResNet" not in w.text and "no model" in w.text and w.model == "-"
        assert (w.shape, w.batch) == ("3x32x32", 512)


def test_the_verdict_says_when_a_difference_is_inside_the_noise():
    assert verdict(1.18, 1.10, 1.05, 1.15) == "confirmed"
    assert verdict(1.18, 1.10, 0.99, 1.20) == "inside the noise"
    assert verdict(1.18, 1.01, 0.98, 1.03) == "not reproduced (difference inside the noise)"
    assert verdict(1.18, 1.05, 1.02, 1.08) == "not reproduced"  # real, but a third of the claim


def test_a_verdict_from_one_sample_each_says_its_noise_is_unknown():
    # a compile time or a memory size is measured once per side: no range, so no noise-free verdict
    assert verdict(3.0, 2.0) == "confirmed (single sample each, noise unknown)"
    assert verdict(7.42, 1.43) == "not reproduced (single sample each, noise unknown)"
    once = Measured(Spread(10, 10, 10), Spread(7, 7, 7), "s", "compile", higher_is_better=False)
    row = claims_mod.measured_fields(BY_ID["dynamic_compile"], once)
    assert row["verdict"] == "not reproduced (single sample each, noise unknown)" and row["ratio_low"] == ""


def test_a_claim_measured_on_a_stand_in_is_not_comparable_neither_confirmed_nor_refuted():
    # the audit's case: dynamic_compile on cnn3 in place of ResNet-18, 1.43x against the claimed 7.42x
    assert CNN3_16.stand_in and workload_for(BY_ID["dynamic_compile"], "cpu") is CNN3_16
    assert verdict(7.42, 1.43, 1.40, 1.46, stand_in=True) == "not comparable (measured on a stand-in)"
    assert verdict(7.42, 7.5, 7.4, 7.6, stand_in=True) == "not comparable (measured on a stand-in)"
    stand_in = Workload("cnn3", "1x8x8", 8, 64, "tiny", stand_in="CPU stand-in for ResNet-18")
    claim = claims_mod.Claim(
        "sub", "sub is 7.42x", 7.42, lambda ctx, w: Measured(Spread(10, 9, 11), Spread(7, 6.5, 7.5), "s", "x"),
        W, stand_in, "",
    )  # fmt: skip
    rows = run_claims(Config(), CPU, Timing(), {}, None, lambda s: None, claims=(claim,))
    assert rows[0]["verdict"] == "not comparable (measured on a stand-in)"
    assert rows[0]["measured_ratio"] == pytest.approx(0.7)  # the ratio is still shown


def test_the_ratio_range_pairs_the_worst_and_best_repeats_in_the_claims_direction():
    faster = Measured(Spread(100, 90, 110), Spread(150, 140, 160), "images/s", "x")
    assert faster.ratio == 1.5 and faster.ratio_range == pytest.approx((140 / 110, 160 / 90))
    shorter = Measured(Spread(10, 9, 11), Spread(5, 4, 6), "ms", "x", higher_is_better=False)
    assert shorter.ratio == 2.0 and shorter.ratio_range == pytest.approx((9 / 6, 11 / 4))


W = Workload("cnn3", "1x8x8", 8, 64, "tiny")


def fake_claim(cid: str, cost: float, clock: list, isolate: int = 0, cpu: Workload | None = W):
    def measure(ctx, w):
        clock[0] += cost
        return Measured(Spread(100, 99, 101), Spread(150, 149, 151), "images/s", "fake")

    return claims_mod.Claim(cid, f"{cid} is 1.5x", 1.5, measure, W, cpu, "" if cpu else "a GPU", isolate)


def test_the_table_keeps_its_budget_and_runs_unbounded_compiles_last_in_what_is_left(monkeypatch):
    clock, limits, order = [0.0], {}, []
    table = (
        fake_claim("slow", 30, clock),
        fake_claim("autotune", 1000, clock, isolate=2),
        fake_claim("gpu_only", 1, clock, cpu=None),
        fake_claim("fast", 20, clock),
        fake_claim("dynamic", 25, clock, isolate=1),
        fake_claim("late", 1, clock),
    )
    needs = {"autotune": 1000, "dynamic": 25}  # the isolated claims' compile time

    def in_child(claim, ctx, limit_s):
        limits[claim.id] = limit_s
        order.append(claim.id)
        if needs[claim.id] > limit_s:  # as run_child does: killed at the limit
            clock[0] += limit_s
            return {"verdict": "cut off", "note": f"cut off at the {limit_s:.0f} s limit"}
        return claims_mod.measured_fields(claim, claim.measure(ctx, W))

    monkeypatch.setattr(claims_mod, "_measure_in_child", in_child)
    logged = []
    rows = run_claims(Config(), CPU, Timing(), {}, None, logged.append, budget_s=100, clock=lambda: clock[0],
                      claims=table)  # fmt: skip
    assert [r["claim"] for r in rows] == [c.id for c in table]  # the table's order
    by = {r["claim"]: r for r in rows}
    assert order == ["dynamic", "autotune"]  # after every in-process claim, in their isolate order
    # slow (30) + fast (20) + late (1) ran first: 49 s left, shared by the two isolated claims
    assert limits["dynamic"] == pytest.approx(49 / 2)
    assert by["dynamic"]["verdict"] == "cut off"  # needed 25 s, had 24.5
    assert limits["autotune"] == pytest.approx(100 - 51 - 49 / 2)  # the last gets all that is left
    assert by["autotune"]["verdict"] == "cut off" and clock[0] <= 100
    assert by["slow"]["verdict"] == "confirmed" and by["slow"]["seconds"] == 30
    assert by["gpu_only"]["verdict"] == "not measurable here" and "a GPU" in by["gpu_only"]["note"]
    assert sum("bench: claim" in line and "->" in line for line in logged) == 3  # each printed as it ends


def test_a_claim_that_would_start_after_the_budget_is_not_measured_and_says_how_to_measure_it(monkeypatch):
    clock = [0.0]
    table = (fake_claim("first", 98, clock), fake_claim("second", 1, clock))
    rows = run_claims(Config(), CPU, Timing(), {}, None, lambda s: None, budget_s=100, clock=lambda: clock[0],
                      claims=table)  # fmt: skip
    assert rows[0]["verdict"] == "confirmed"
    assert rows[1]["verdict"] == "not measured"
    assert "cnnpar bench --claims --only second --device cpu" in rows[1]["note"]


def test_an_isolated_claims_measurement_survives_the_trip_through_the_child(monkeypatch):
    """The spec the parent writes and the value the child returns go through JSON files."""
    import json

    import cnnpar.bench.trial as trial

    claim = fake_claim("iso", 1, [0.0], isolate=1)
    monkeypatch.setitem(claims_mod.BY_ID, "iso", claim)

    def child(spec, limit_s, log):
        value = json.loads(json.dumps({"status": trial.OK, **trial._run(json.loads(json.dumps(spec)))}))
        return trial.ChildResult(trial.OK, value, wall_s=1.0)

    monkeypatch.setattr(trial, "run_child", child)
    ctx = ClaimContext(with_overrides(Config(), speed={"device": "cpu"}), CPU, Timing(), log=lambda s: None)
    row = claims_mod._measure_in_child(claim, ctx, 60.0)
    assert row["verdict"] == "confirmed" and row["measured_ratio"] == pytest.approx(1.5)
    assert (row["ratio_low"], row["ratio_high"]) == pytest.approx((149 / 101, 151 / 99))


def test_the_host_loader_and_preprocessing_claims_record_their_timed_steps_per_repeat(monkeypatch):
    """collate_speed and compiled_preprocess left `steps_per_repeat` empty, though claims.csv documents it
    (baseline/variant); their probes did not say how many batches or calls each repeat timed."""
    monkeypatch.setattr(probes, "warm_compiler", lambda device: None)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # the count, not the compile, is tested here
    ctx = ClaimContext(Config(), CPU, Timing(warmup=1, steps=4, repeats=2, seconds=0), log=lambda s: None)
    tiny = Workload("cnn3", "1x8x8", 8, 32, "cnn3, 1x8x8, batch 8")
    loader = claims_mod.collate_speed(ctx, tiny)
    preprocess = claims_mod.compiled_preprocess(ctx, tiny)
    assert loader.steps == preprocess.steps == "4/4"
    assert claims_mod.measured_fields(BY_ID["collate_speed"], loader)["steps_per_repeat"] == "4/4"


def test_a_claims_row_records_the_config_of_each_side_it_measured():
    """claims.csv named each claim's settings only in the method's words: pin_memory's worker count, the user's
    --seed and the two sides' precision, compile and loader were nowhere in its rows. Each row's `config` now holds
    both sides as the `cnnpar train` line that runs them."""
    from cnnpar.bench.output import CLAIM_COLUMNS

    rate = {"images_per_s": 100.0, "images_per_s_min": 99.0, "images_per_s_max": 101.0, "steps_per_repeat": 3}
    base = with_overrides(Config(), data={"workers": 2}, run={"seed": 7})
    ctx = ClaimContext(base, CUDA, Timing(), log=lambda s: None)
    ctx.rate = lambda cfg, w: rate
    claim = BY_ID["pin_memory"]
    row = claims_mod.measured_fields(claim, claim.measure(ctx, claim.workload))
    baseline, variant = row["config"].split("; variant: ")
    for side, pin in ((baseline, "off"), (variant, "on")):
        assert f"--pin-memory {pin}" in side and "--workers 2" in side and "--seed 7" in side
        assert "--model resnet50" in side and "--image-shape 3x224x224" in side and "--precision bf16" in side
    assert baseline.startswith("baseline: cnnpar train ") and "config" in CLAIM_COLUMNS
    tuned = BY_ID["max_autotune"].measure(ctx, RESNET18_32)
    assert "--compile max-autotune" in tuned.config.split("; variant: ")[1]


def test_the_probes_count_the_steps_each_repeat_timed():
    calls = []
    spread, steps = probes.time_calls(lambda: calls.append(1), torch.device("cpu"), Timing(1, 5, 3, seconds=0))
    assert steps == 5 and len(calls) == 3 + 1 + 3 * 5  # warm-up (at least 3), the sizing call, the repeats
    assert spread.low <= spread.median <= spread.high


@pytest.mark.parametrize("compiled", [False, True])
def test_the_preprocessing_claim_times_the_transform_training_runs(monkeypatch, compiled):
    """compiled_preprocess timed a copy of the device-side transform that normalised first and cropped and flipped
    floats (four times the bytes of each pass), where a train step's batch goes through data/transforms.py's
    DeviceTransform (crop and flip on uint8, then one multiply-add): both sides now call that one owner."""
    from cnnpar.data.transforms import DeviceTransform

    owner, seen = DeviceTransform.__call__, []

    def recorded(self, x, train, index=None):
        seen.append((x.dtype, train))
        return owner(self, x, train, index)

    monkeypatch.setattr(DeviceTransform, "__call__", recorded)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # which code runs is tested here, not the compile
    batch = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    outputs = []
    monkeypatch.setattr(
        probes, "time_calls", lambda fn, device, timing: (outputs.append(fn()), (Spread.single(1), 1))[1]
    )
    probes.preprocess_ms(batch, compiled, torch.device("cpu"), Timing())
    assert seen == [(torch.uint8, True)]  # the uint8 batch, augmented as in training
    out = outputs[0]
    assert out.dtype == torch.float32 and out.shape == (4, 3, 8, 8)
    pixels = (out * 0.25 + 0.5) * 255  # the normalisation (x / 255 - 0.5) / 0.25 undone: the uint8 values again
    assert torch.allclose(pixels, pixels.round(), atol=1e-3) and 0 <= pixels.round().min() <= pixels.max() < 255.5
