"""The bench in-process on the CPU: a failing rung, time to accuracy, verdicts, the ladder plan."""

from __future__ import annotations

import csv
import re
import signal

import pytest
import torch

import cnnpar.engine.train_step as train_step
from cnnpar.bench.claims import verdict
from cnnpar.bench.compare import compare_markdown
from cnnpar.bench.ladder import RUNG_NAMES, plan_ladder, run_ladder
from cnnpar.bench.output import ladder_markdown, throughput_labels
from cnnpar.bench.timing import Timing
from cnnpar.bench.tta import run_tta
from cnnpar.cli import main
from cnnpar.config import Config
from cnnpar.data import load_data
from cnnpar.dist import DistInfo
from cnnpar.presets import with_overrides

CPU = DistInfo(0, 0, 1, torch.device("cpu"))


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def digits8():
    cfg = with_overrides(Config(), data={"image_size": 8}, speed={"device": "cpu"}, run={"batch_size": 32})
    return cfg, load_data(cfg.data, cfg.run.seed)


def test_a_failing_rung_is_recorded_and_the_ladder_goes_on(digits8, monkeypatch):
    from cnnpar.parallel import precision

    cfg, bundle = digits8
    real = train_step.forward_backward
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)  # later rungs build on bf16 (and not fp16)

    def oom_under_fp16(model, x, y, precision, *args):
        if precision.kind == "fp16":
            raise RuntimeError("out of memory: tried to allocate 1 PiB (injected)")
        return real(model, x, y, precision, *args)

    monkeypatch.setattr(train_step, "forward_backward", oom_under_fp16)  # the step the bench drives
    rows = run_ladder(cfg, bundle, CPU, Timing(1, 2, 1), {}, only={"baseline", "fp16_scaler", "channels_last"},
                      log=lambda s: None)  # fmt: skip
    by = {r["name"]: r for r in rows}
    assert [r["name"] for r in rows] == ["baseline", "fp16_scaler", "channels_last"]
    assert by["fp16_scaler"]["status"] == "failed"
    assert by["fp16_scaler"]["error"].startswith("RuntimeError: out of memory")
    assert "images_per_s" not in by["fp16_scaler"]
    assert by["channels_last"]["status"] == "ok" and by["channels_last"]["images_per_s"] > 0
    assert by["channels_last"]["precision"] == "bf16"  # built on bf16, not on the fp16 branch


def test_cpu_plan_skips_cuda_rungs_without_carrying_them_forward(digits8):
    cfg, bundle = digits8
    plan = {p.rung.name: p for p in plan_ladder(cfg, torch.device("cpu"), bundle)}
    assert list(plan) == list(RUNG_NAMES)
    skipped = {n for n, p in plan.items() if p.skip_reason}
    assert skipped == {"pin_memory", "prefetch_stream", "stem_space_to_depth", "cuda_graphs", "resident"}
    last = plan["compile"].cfg
    assert last.data.pin_memory == "off" and last.data.prefetch_stream == "off" and last.data.resident == "off"
    assert last.speed.compile == "default" and last.data.persistent_workers and last.data.loader == "fast"
    assert plan["persistent_workers"].builds_on == "workers"  # pin_memory was skipped, so not its parent


@pytest.mark.parametrize("native", [False, True])
def test_later_rungs_build_on_bf16_only_where_auto_would_train_in_it(digits8, monkeypatch, native):
    """On a CPU that emulates bf16 every rung after bf16 was measured in emulated bf16: channels_last and compile
    read 0.17x and 0.14x the baseline on a 2-core EPYC (benchmarks/results/ladder_cpu_emulated_bf16/), a loss
    `cnnpar train` (fp32 there by --precision auto) never pays."""
    from cnnpar.parallel import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    cfg, bundle = digits8
    plan = {p.rung.name: p for p in plan_ladder(cfg, torch.device("cpu"), bundle)}
    assert plan["bf16"].cfg.speed.precision == "bf16" and not plan["bf16"].skip_reason  # bf16 itself is measured
    later = plan["channels_last"]
    assert later.builds_on == ("bf16" if native else "uint8_device")
    assert later.cfg.speed.precision == plan["compile"].cfg.speed.precision == ("bf16" if native else "fp32")
    assert bool(plan["bf16"].branch_note) is not native
    rows = run_ladder(cfg, bundle, CPU, Timing(1, 2, 1), {}, only={"bf16"}, log=lambda s: None)
    assert ("later rungs build on fp32" in rows[0]["technique"]) is not native  # the row says why


def test_tta_stops_at_the_first_epoch_that_reaches_the_target():
    cfg = with_overrides(
        Config(),
        data={"image_size": 8},
        optim={"schedule": "constant", "warmup": 0.0},
        speed={"device": "cpu"},
        run={"epochs": 30, "max_steps": 4, "batch_size": 32},
    )
    bundle = load_data(cfg.data, cfg.run.seed)
    [row] = run_tta(cfg, bundle, CPU, 0.5, 1, {"model": "cnn3"}, log=lambda s: None)
    accs = [float(a) for a in row["acc_by_epoch"].split()]
    assert row["reached"] and row["final_val_acc"] >= 0.5
    assert row["epochs"] == len(accs) < 30
    assert all(a < 0.5 for a in accs[:-1])
    assert row["wall_s"] >= row["train_s"] > 0 and row["wall_with_compile_s"] == row["wall_s"] + row["compile_s"]


def test_a_time_to_accuracy_seed_that_diverges_is_a_failed_row_not_reached(monkeypatch):
    """NaN logits argmax to class 0: a diverged model "reached" a target on data mostly of one class (92.5% on
    imb0.npz at --lr 1e4), where `cnnpar train` stopped it. The Trainer's own check now stops the seed."""
    import cnnpar.engine.trainer as trainer_mod

    begin = trainer_mod.Trainer.begin_epoch

    def nan_weights(self, epoch):
        begin(self, epoch)
        with torch.no_grad():
            next(self.raw_model.parameters()).fill_(float("nan"))

    monkeypatch.setattr(trainer_mod.Trainer, "begin_epoch", nan_weights)
    cfg = with_overrides(
        Config(),
        data={"image_size": 8},
        speed={"device": "cpu", "precision": "fp32"},
        run={"epochs": 2, "max_steps": 1, "batch_size": 32},
    )
    bundle = load_data(cfg.data, cfg.run.seed)
    [row] = run_tta(cfg, bundle, CPU, 0.01, 1, {"model": "cnn3"}, log=lambda s: None)  # class 0's share is above it
    assert row["status"] == "failed" and not row["reached"]
    assert row["error"].startswith("Diverged: epoch 1: train loss nan is not finite, training diverged: try a lower lr")


def test_verdict_needs_half_the_claimed_effect():
    assert verdict(1.18, 1.10, 1.09, 1.11) == "confirmed"
    assert verdict(1.18, 1.08, 1.07, 1.09) == "not reproduced"
    assert verdict(3.0, 2.0, 1.9, 2.1) == "confirmed"
    assert verdict(3.0, 0.9, 0.85, 0.95) == "not reproduced"


def test_bad_target_is_one_line_user_error(capsys):
    assert main(["bench", "--time-to-accuracy", "--target", "99"]) == 2
    err = capsys.readouterr().err
    assert "bench --target 99.0: expected a validation accuracy in (0, 1]" in err
    assert main(["bench", "--time-to-accuracy", "--device", "cpu"]) == 2  # no --target: it named a 0.0 never typed
    assert capsys.readouterr().err == (
        "cnnpar: error: bench --time-to-accuracy needs --target: expected a validation accuracy in (0, 1], such as "
        "0.99\n"
    )
    assert main(["bench", "--only", "warp_drive", "--device", "cpu"]) == 2
    assert "unknown rung(s) warp_drive" in capsys.readouterr().err


def _measuring_fails(monkeypatch) -> None:
    """A bench that goes on to measure (the ladder, time to accuracy or the claims) stops at once, in a test
    of a flag that should have stopped it before."""
    import cnnpar.bench.run as bench_run

    def measured(*args, **kwargs):
        raise AssertionError("measured: the flag was not refused")

    monkeypatch.setattr(bench_run, "_measurement_setup", measured)
    monkeypatch.setattr(bench_run, "_claims", measured)


def test_a_typed_target_of_0_is_told_what_is_expected_and_is_no_ladder_flag(capsys, monkeypatch):
    """`--target 0` was read as no --target at all: told it "needs --target", and on a ladder dropped unsaid."""
    _measuring_fails(monkeypatch)
    assert main(["bench", "--time-to-accuracy", "--target", "0", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (
        "cnnpar: error: bench --target 0.0: expected a validation accuracy in (0, 1], such as 0.99\n"
    )
    assert main(["bench", "--target", "0", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (
        "cnnpar: error: bench --target: read only with --time-to-accuracy: expected no --target with a ladder\n"
    )


@pytest.mark.parametrize(("mode", "what"), [([], "rung"), (["--claims"], "claim")])
def test_an_empty_only_is_refused_naming_the_names_expected(capsys, monkeypatch, mode, what):
    """`--only ""` (an unset shell variable) measured every rung, as if --only was not typed."""
    from cnnpar.bench.claims import CLAIM_IDS

    _measuring_fails(monkeypatch)
    known = ", ".join(RUNG_NAMES if what == "rung" else CLAIM_IDS)
    for only in ("", " , "):
        assert main(["bench", *mode, "--only", only, "--device", "cpu"]) == 2
        assert capsys.readouterr().err == (
            f"cnnpar: error: bench --only {only!r}: names no {what}: expected one or more of {known}, "
            f"comma-separated (leave --only out for every {what})\n"
        )


def test_each_time_to_accuracy_seed_validates_on_the_split_its_seed_draws(digits8, monkeypatch):
    """Seeds after the first trained and validated on the first seed's hold-out: the row "seed 1" did not read
    what `cnnpar train --seed 1` reads."""
    import cnnpar.bench.tta as tta

    cfg, bundle = digits8
    seen = {}

    def record(cfg, bundle, info, target, seed):
        seen[seed] = bundle.val.ids.tolist() if hasattr(bundle.val, "ids") else bundle.val.y.tolist()
        return {
            "seed": seed,
            "reached": True,
            "epochs": 1,
            "wall_s": 0.0,
            "wall_with_compile_s": 0.0,
            "final_val_acc": 1.0,
        }

    monkeypatch.setattr(tta, "time_to_accuracy", record)
    run_tta(cfg, bundle, CPU, 0.5, 2, {}, log=lambda s: None)
    for seed in (0, 1):
        val = load_data(cfg.data, seed).val
        assert seen[seed] == (val.ids.tolist() if hasattr(val, "ids") else val.y.tolist()), seed
    assert seen[0] != seen[1]  # the digits' hold-out is drawn by the seed: the test tells the two apart


def test_the_old_time_to_accuracy_flag_names_its_new_name(capsys):
    # --tta meant time to accuracy and read like test-time augmentation (--tta-flip, --tta-level)
    assert main(["bench", "--tta", "--target", "0.99", "--epochs", "3"]) == 2
    err = capsys.readouterr().err
    assert "bench --tta is now --time-to-accuracy" in err
    assert "cnnpar bench --time-to-accuracy --target 0.99 --epochs 3" in err


def test_timed_steps_are_sized_from_one_steps_time():
    t = Timing(warmup=3, steps=30, repeats=5, seconds=2.0)
    assert t.steps_for(0.240) == 3  # a 240 ms fp32 ResNet-50 step: the floor of 3 per repeat
    assert t.steps_for(0.040) == 10  # 2 s / 5 repeats / 40 ms
    assert t.steps_for(3.9) == 1  # the ladder's fp32 textbook baseline: one step per repeat, 5 repeats
    assert t.steps_for(0.006) == 30  # a 6 ms step: capped by --timed-steps
    assert Timing(steps=30, seconds=0).steps_for(0.240) == 30  # --timed-s 0: a fixed count
    # more seconds than a float's quotient holds: --timed-steps, as any long --timed-s (was an OverflowError per rung)
    assert Timing(steps=30, repeats=5, seconds=1e308).plan(0.001) == (30, 5)


def test_a_rung_started_after_the_budget_is_skipped_and_says_why(digits8):
    cfg, bundle = digits8
    now = [0.0]
    jump = lambda line: now.__setitem__(0, 999.0)  # noqa: E731  the first rung "takes" 999 s
    rows = run_ladder(cfg, bundle, CPU, Timing(1, 2, 1), {}, only={"baseline", "bf16"}, log=jump, budget_s=10,
                      clock=lambda: now[0])  # fmt: skip
    by = {r["name"]: r for r in rows}
    assert by["baseline"]["status"] == "ok"
    assert by["bf16"]["status"] == "skipped" and "time budget spent (10 s" in by["bf16"]["error"]


def test_the_cpu_peak_is_the_faster_of_fp32_and_native_bf16(monkeypatch):
    from cnnpar.bench import flops
    from cnnpar.parallel import precision

    rates = {torch.float32: 2.0, torch.bfloat16: 5.0}
    monkeypatch.setattr(flops, "_matmul_flops", lambda device, dtype, n: (rates[dtype], str(dtype)))
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert flops.peak_flops(torch.device("cpu")) == (5.0, "torch.bfloat16")  # a bf16 step stays under 100 % MFU
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)  # emulated bf16 is no peak to quote
    assert flops.peak_flops(torch.device("cpu")) == (2.0, "torch.float32")


BENCH = ["bench", "--device", "cpu", "--image-size", "8", "--warmup-steps", "1", "--timed-steps", "2", "--repeats", "1",
         "--timed-s", "0"]  # fmt: skip


def _ladder_rows(path) -> list[dict]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_bench_reports_the_batch_it_ran_not_auto_s_zero(tmp_path, capsys):
    """--batch-size auto (the default) runs 64 on the CPU: the header said "batch 0" and ladder.csv 0."""
    assert main([*BENCH, "--only", "baseline", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "), batch 64, " in out.splitlines()[0]
    [row] = _ladder_rows(tmp_path / "b" / "ladder.csv")
    assert row["status"] == "ok" and row["batch_size"] == "64"


def test_the_ladders_timing_flags_are_the_steps_and_repeats_each_rung_ran(tmp_path, capsys):
    """--only picks the rungs (a row each), --warmup-steps, --timed-steps and --repeats are what each ran, and
    --timed-s sizes the timed steps down from --timed-steps to fit it (never under MIN_STEPS)."""
    from cnnpar.bench.timing import MIN_STEPS

    timing = ["--warmup-steps", "2", "--timed-steps", "5", "--repeats", "2"]
    assert main([*BENCH, *timing, "--only", "baseline,workers", "--out", str(tmp_path / "a")]) == 0
    rows = _ladder_rows(tmp_path / "a" / "ladder.csv")
    assert [r["name"] for r in rows] == ["baseline", "workers"]
    ran = [(r["warmup_steps_run"], r["steps_per_repeat"], r["repeats_run"]) for r in rows]
    assert ran == [("2", "5", "2")] * 2
    timing = ["--timed-steps", "500", "--timed-s", "0.001"]  # far less than 500 steps of any rung take
    assert main([*BENCH, *timing, "--only", "baseline", "--out", str(tmp_path / "b")]) == 0
    [row] = _ladder_rows(tmp_path / "b" / "ladder.csv")
    assert row["timed_s"] == "0.001" and int(row["steps_per_repeat"]) == MIN_STEPS


def test_a_ladder_row_records_its_grad_accum_and_compare_marks_one_that_differs(tmp_path, capsys):
    """step_ms is per optimizer step: with --grad-accum 2 it covers two batches, and the CSV did not say so."""
    for accum in ("1", "2"):
        assert main([*BENCH, "--only", "baseline", "--grad-accum", accum, "--out", str(tmp_path / accum)]) == 0
    [one], [two] = (_ladder_rows(tmp_path / a / "ladder.csv") for a in ("1", "2"))
    assert (one["grad_accum"], two["grad_accum"]) == ("1", "2")
    assert one["batch_size"] == two["batch_size"] == "64"
    md = compare_markdown(tmp_path / "1" / "ladder.csv", tmp_path / "2" / "ladder.csv").splitlines()
    assert "| grad_accum (differs) | 1 | 2 |" in md


def test_a_ladder_where_every_rung_failed_exits_non_zero_saying_so(tmp_path, capsys, monkeypatch):
    def fail(*args):
        raise RuntimeError("out of memory (injected)")

    monkeypatch.setattr(train_step, "forward_backward", fail)
    out = tmp_path / "b"
    # pin_memory is skipped on the CPU: failed and skipped rows, none measured
    assert main([*BENCH, "--batch-size", "16", "--only", "baseline,pin_memory,bf16", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == (
        "bench: every rung run failed (2 of 3, the rest skipped); first, baseline: RuntimeError: out of memory "
        f"(injected); rows in {out / 'ladder.csv'}\n"
    )
    assert [(r["status"], r["batch_size"]) for r in _ladder_rows(out / "ladder.csv")] == [
        ("failed", "16"),
        ("skipped", "16"),
        ("failed", "16"),
    ]


def test_a_ladder_whose_budget_was_spent_before_any_rung_is_refused_in_one_line_writing_nothing(tmp_path, capsys):
    """Every rung "skipped (time budget spent)" ended 0 after writing a table of them: a script checking the exit
    status took a bench that measured nothing for a result. Refused now as tune refuses a budget its first trial
    cannot fit: exit 2, one line with the command that gives it more time, no results folder."""
    out = tmp_path / "b"
    assert main([*BENCH, "--only", "baseline,pin_memory", "--budget-s", "0.001", "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert re.fullmatch(
        r"cnnpar: error: bench --budget-s 0\.001: spent before the first rung could start \(1 of 2 rung\(s\) not "
        r"started for it; start-up took \d+ s of it\): nothing was measured: expected a larger --budget-s, such as: "
        rf"cnnpar bench .* --only baseline,pin_memory --out {re.escape(str(out))} --budget-s \d+",
        err,
    ), err
    assert not out.exists()  # (pin_memory, needing CUDA, is no measurement either: one of 2 left out by the budget)


def test_claims_whose_budget_was_spent_before_any_claim_are_refused_in_one_line_writing_nothing(tmp_path, capsys):
    out = tmp_path / "c"
    claims = [*CLAIMS[: CLAIMS.index("--budget-s")], "--only", "collate_speed,pin_memory"]
    assert main([*claims, "--budget-s", "0.001", "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(
        "cnnpar: error: bench --budget-s 0.001: spent before the first claim could start (1 of 10 claim(s) not started "
        "for it; start-up took "
    ), err
    assert " --only collate_speed,pin_memory --out " in err and re.search(r" --budget-s (\d+)$", err)
    assert int(re.search(r" --budget-s (\d+)$", err).group(1)) >= 300  # at least the CPU table's default
    assert not out.exists()


def test_bench_refuses_more_processes_than_the_one_it_measures(tmp_path, capsys, monkeypatch):
    """`bench --nproc 2` measured one process without a word, and under `torchrun --nproc_per_node 2` each rank ran
    the whole bench on the first device, two tables of halved figures saying "world size 1": refused as doctor's and
    tune's are. The claims name --nproc unread in a note and go on, as before; a launch of several is refused."""

    class Measured(Exception):
        pass

    def measured(*a, **k):
        raise Measured

    monkeypatch.setattr("cnnpar.bench.run.run_bench", measured)
    assert main([*BENCH, "--nproc", "2", "--out", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "cnnpar: error: bench measures one process: --nproc 2 (typed or from the config) is not measured here; "
        "expected --nproc 0 or 1 (DDP rows beside the ladder: --ddp 1,2)"
    )
    with pytest.raises(Measured):  # the claims read no --nproc: its note says so, and they run
        main([*CLAIMS, "--nproc", "2"])
    assert "cnnpar: note: --nproc 2 not used: cnnpar bench --claims" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")  # started by torchrun: each rank would run the whole bench alone
    monkeypatch.setenv("RANK", "1")
    for args, then in [(BENCH, "DDP rows beside the ladder: --ddp 1,2"), (CLAIMS, "then train with --nproc 2")]:
        assert main(args) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (  # (each rank's line says which)
            "cnnpar: error: [rank 1] bench measures one process: started by a launcher with WORLD_SIZE=2; expected a "
            "plain "
            f"`cnnpar bench ...` ({then}), or the debug switch (--debug-single)"
        )
    assert main([*BENCH, "--debug-single"]) == 0  # the switch's surplus rank leaves at once; rank 0 measures
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(Measured):
        main([*BENCH, "--debug-single"])
    assert not (tmp_path / "b").exists()


def test_ddp_rows_beside_only_rungs_this_device_skips_are_refused_before_measuring(tmp_path, capsys):
    """`--only pin_memory --ddp 1` on a CPU measured no rung (it needs CUDA), so no batch for the DDP rows: it said
    "no DDP rows" and ended 0, the rows asked for missing."""
    out = tmp_path / "b"
    assert main([*BENCH, "--only", "pin_memory", "--ddp", "1", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "cnnpar: error: bench --ddp 1: its rows run at the batch of the last ladder rung measured, and no rung asked "
        "for (--only pin_memory) runs on cpu (pin_memory: needs CUDA): expected --only naming a rung measured here, "
        "or no --only"
    )
    assert not out.exists()


def test_a_bench_whose_rungs_or_claims_asked_for_all_need_cuda_exits_0_saying_nothing_was_measured(tmp_path, capsys):
    """Skipping what this device cannot run is the documented outcome (exit 0), but a table of skipped rows alone,
    ending as a measured one did, was taken for a result: the last line says nothing was measured, and why."""
    ladder, claims = tmp_path / "l", tmp_path / "c"
    assert main([*BENCH, "--only", "pin_memory,resident", "--out", str(ladder)]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (
        "bench: note: nothing was measured: no rung asked for runs here (pin_memory: needs CUDA; resident: needs "
        f"CUDA); rows in {ladder / 'ladder.csv'}"
    )
    assert [r["status"] for r in _ladder_rows(ladder / "ladder.csv")] == ["skipped", "skipped"]
    assert main([*CLAIMS, "--only", "pin_memory", "--out", str(claims)]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (
        "bench: note: nothing was measured: every claim asked for needs CUDA (not measurable here); rows in "
        f"{claims / 'claims.csv'}"
    )


def test_claims_whose_every_started_claim_was_cut_off_at_the_budget_are_refused_writing_nothing(
    tmp_path, capsys, monkeypatch
):
    """A claim's child is given the time the budget leaves it: every claim started cut off is tune's start trial
    cut off at the budget's end (exit 2, nothing written), where it ended 1, a failure of the tool, with a table."""
    from cnnpar.bench import trial

    cut = lambda spec, limit_s, log: trial.ChildResult(trial.CUT_OFF, error="cut off at the 9 s limit", wall_s=9)  # noqa: E731
    monkeypatch.setattr(trial, "run_child", cut)
    out = tmp_path / "c"
    claims = [*CLAIMS[: CLAIMS.index("--budget-s")], "--only", "dynamic_compile"]
    assert main([*claims, "--budget-s", "60", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "cnnpar: error: bench --budget-s 60: every claim started was cut off at the time the budget left it (1 of 10; "
        "dynamic_compile: cut off at the 9 s limit): nothing was measured: expected a larger --budget-s, such as: "
        f"cnnpar bench {' '.join(claims[1:])} --out {out} --budget-s 300"
    )
    assert not out.exists()


def test_only_a_budget_that_left_every_row_unstarted_is_refused():
    from cnnpar.bench.run import BudgetTooSmall, refuse_if_the_budget_measured_nothing

    refuse_if_the_budget_measured_nothing(1, 5, 6, "rung", 10, 60, None)  # one measured: the rest say "skipped"
    refuse_if_the_budget_measured_nothing(0, 0, 5, "rung", 10, 60, None)  # CUDA rungs on a CPU, --only: no budget's
    with pytest.raises(BudgetTooSmall) as e:
        refuse_if_the_budget_measured_nothing(0, 3, 5, "rung", 10, 60, None)
    assert e.value.budget_s == 60 and str(e.value) == (
        "bench --budget-s 10: spent before the first rung could start (3 of 5 rung(s) not started for it): nothing "
        "was measured"
    )


def _rung(name, ips, low, high, base_ratio=None, prev="", prev_ratio=None):
    row = {"name": name, "rung": "0", "technique": name, "status": "ok", "builds_on": prev, "prev_rung": prev}
    row.update(images_per_s=ips, images_per_s_min=low, images_per_s_max=high, repeats_run=3, steps_per_repeat=4)
    if base_ratio is not None:
        row["speedup_vs_baseline"] = base_ratio
    if prev_ratio is not None:
        row["speedup_vs_prev"] = prev_ratio
    return row


def test_x_baseline_is_marked_inside_the_noise_when_the_ranges_overlap():
    # the audit's case: compile's 300-3,121 overlaps the baseline's 372-603; fast's 900-1,000 does not
    rows = [
        _rung("baseline", 480, 372, 603, base_ratio=1.0),
        _rung("compile", 1258, 300, 3121, base_ratio=2.62, prev="baseline", prev_ratio=2.62),
        _rung("fast", 950, 900, 1000, base_ratio=1.98, prev="baseline", prev_ratio=1.98),
    ]
    table = {ln.split(" | ")[1]: ln for ln in ladder_markdown(rows).splitlines() if ln.startswith("| 0 |")}
    assert table["compile"].endswith("| 2.62x, inside the noise | 2.62x, inside the noise |")
    assert table["fast"].endswith("| 1.98x | 1.98x |")
    assert table["baseline"].endswith("| 1.00x |  |")
    assert throughput_labels(rows) == ["480  (1.00x)", "1,258  (2.62x, inside the noise)", "950  (1.98x)"]


def test_compare_shows_each_runs_host_load_and_marks_ratios_inside_the_noise(tmp_path):
    # the audit's case: two runs of one config on a loaded host, 2.4-3.1 against 1.0-1.2
    columns = ["name", "status", "images_per_s", "images_per_s_min", "images_per_s_max", "step_ms", "host_load_1m"]
    a = [["baseline", "ok", 100, 90, 110, 5, 2.4], ["uint8_device", "ok", 200, 190, 210, 3, 3.1]]
    b = [["baseline", "ok", 999, 105, 1100, 1, 1.0], ["uint8_device", "ok", 1760, 1700, 1800, 1, 1.2]]
    paths = []
    for name, rows in (("a", a), ("b", b)):
        paths.append(tmp_path / f"{name}.csv")
        paths[-1].write_text("\n".join(",".join(map(str, r)) for r in [columns, *rows]) + "\n")
    md = compare_markdown(*paths).splitlines()
    assert "| host load (1 min, over the rungs) (differs) | 2.4-3.1 | 1.0-1.2 |" in md
    assert "| baseline | 100 (90-110) | 999 (105-1,100) | 9.99x, inside the noise |" in md
    assert "| uint8_device | 200 (190-210) | 1,760 (1,700-1,800) | 8.80x |" in md


def test_compare_marks_threads_processes_and_timing_that_differ(tmp_path):
    """torch_threads 1 against 2 changed the ratio on a 2-core CPU, under a setup table whose lines all matched."""
    columns = ["name", "status", "images_per_s", "step_ms", "torch_threads", "world_size", "warmup_steps",
               "timed_steps", "repeats", "timed_s"]  # fmt: skip
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(",".join(columns) + "\nbaseline,ok,100,5,1,1,5,20,3,0\n")
    b.write_text(",".join(columns) + "\nbaseline,ok,162,3,2,1,5,30,1,0\n")
    md = compare_markdown(a, b).splitlines()
    assert "| torch_threads (differs) | 1 | 2 |" in md and "| world_size | 1 | 1 |" in md
    assert "| timed_steps (differs) | 20 | 30 |" in md and "| repeats (differs) | 3 | 1 |" in md


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_a_typed_budget_of_0_is_refused_alike_by_bench_and_tune(command, capsys, monkeypatch):
    """bench took `--budget-s 0` as its mode's default (the ladder: no limit) while tune took it as 0 s and refused
    it after start-up: one figure, "none" to one command and "unlimited" to the other. Both refuse it as they parse,
    naming inf and the default."""
    _measuring_fails(monkeypatch)  # nothing may be measured: the refusal comes first
    with pytest.raises(SystemExit) as e:
        main([command, "--device", "cpu", "--budget-s", "0"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"cnnpar {command}: error: argument --budget-s: 0: expected seconds above 0, or inf for no limit (leave it "
        "out for the default)"
    )


def test_compare_of_two_ladders_with_no_rung_in_common_is_refused_naming_each_ones(tmp_path, capsys):
    """`bench --compare A B` of ladders with no rung of the same name printed a table of no ratio and exited 0."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("name,status,images_per_s,step_ms\nbaseline,ok,100,5\nworkers,ok,120,4\n")
    b.write_text("name,status,images_per_s,step_ms\nbf16,ok,300,2\n")
    out = tmp_path / "out"
    assert main(["bench", "--compare", str(a), str(b), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"cnnpar: error: bench --compare {a} {b}: no rung in common, nothing to compare (A has baseline, workers; "
        "B has bf16): expected two ladders that measured at least one rung of the same name\n"
    )
    assert not out.exists()  # nothing written


def test_compare_of_two_setups_that_differ_says_so_beside_its_ratios(tmp_path, capsys):
    """Another device or batch size is in every ratio: the table's "(differs)" marks alone let a 2.00x read as the
    rung's. A value one side never recorded (an older CSV) is unknown, not different; the date always differs."""
    columns = "name,status,images_per_s,step_ms,device,batch_size,world_size,torch,date"
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(f"{columns}\nbaseline,ok,100,5,cpu,64,1,,d1\n")
    b.write_text(f"{columns}\nbaseline,ok,200,3,cuda,128,1,2.14.1,d2\n")
    said = "A and B differ in device, batch_size: each B / A ratio measures that difference too, not the rung alone"
    md = compare_markdown(a, b).splitlines()
    assert f"**{said}**" in md
    # the table reads a blank as the note does: A's torch, not recorded, was marked "(differs)" there alone
    assert "| torch |  | 2.14.1 |" in md and "| device (differs) | cpu | cuda |" in md
    assert main(["bench", "--compare", str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == f"cnnpar: note: bench --compare: {said}\n"
    b.write_text(f"{columns}\nbaseline,ok,200,3,cpu,64,1,2.14.1,d2\n")
    assert not any(ln.startswith("**A and B differ") for ln in compare_markdown(a, b).splitlines())
    assert main(["bench", "--compare", str(a), str(b), "--out", str(tmp_path / "out2")]) == 0
    assert capsys.readouterr().err == ""


def test_compare_reads_the_setup_of_a_rung_both_measured_not_each_ones_first(tmp_path, capsys):
    """Each rung records the batch it ran (--batch-size auto searches its own on a GPU, larger under bf16): a full
    ladder against a `--only bf16` one was said to differ in batch_size, baseline's 256 against bf16's 512, though
    the one ratio's two rows ran 512 both."""
    columns = "name,status,images_per_s,step_ms,device,batch_size"
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(f"{columns}\nbaseline,ok,100,5,cuda,256\nbf16,ok,300,2,cuda,512\n")
    b.write_text(f"{columns}\nbf16,ok,330,2,cuda,512\n")
    md = compare_markdown(a, b).splitlines()
    assert "| batch_size | 512 | 512 |" in md
    assert not any(ln.startswith("**A and B differ") for ln in md)
    assert main(["bench", "--compare", str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == ""
    b.write_text(f"{columns}\nbf16,ok,330,2,cuda,1024\n")  # the rung itself ran another batch: said
    md = compare_markdown(a, b).splitlines()
    assert "| batch_size (differs) | 512 | 1024 |" in md and any(
        ln.startswith("**A and B differ in batch_size") for ln in md
    )


def test_compare_with_a_ladder_from_before_the_ranges_says_its_noise_is_unknown(tmp_path):
    """An unmarked ratio reads as outside the noise: where one run kept no range (an older CSV) it says so."""
    old = tmp_path / "a.csv"
    old.write_text("name,status,images_per_s,step_ms\nbaseline,ok,100,5\n")
    new = tmp_path / "b.csv"
    new.write_text(
        "name,status,images_per_s,images_per_s_min,images_per_s_max,step_ms,host_load_1m\n"
        "baseline,ok,200,190,210,3,1.5\n"
    )
    md = compare_markdown(old, new).splitlines()
    assert "| baseline | 100 | 200 (190-210) | 2.00x, noise unknown (no range) |" in md
    assert "| host load (1 min, over the rungs) | not recorded | 1.5 |" in md


# the budget counts from the process's start (cli.py): in a pytest process minutes old, the default would be spent
# (without BENCH's --image-size: each claim has its own workload, and a typed --image-size is named as not used)
CLAIMS = [*(a for a in BENCH if a not in ("--image-size", "8")), "--claims", "--timed-s", "1", "--budget-s", "100000"]


@pytest.mark.parametrize(
    "modes, typed",
    [
        (["--claims", "--compare", "a.csv", "b.csv"], "--claims and --compare"),
        (["--preset", "claims", "--time-to-accuracy"], "--claims and --time-to-accuracy"),
        (["--time-to-accuracy", "--target", "0.9", "--compare", "a.csv", "b.csv"], "--time-to-accuracy and --compare"),
    ],
)
def test_two_bench_modes_at_once_are_refused_before_anything_runs(tmp_path, capsys, modes, typed):
    """`--claims --compare A B` ran the comparison and `--claims --time-to-accuracy` the claims: the other mode's
    flag was dropped without a word."""
    assert main(["bench", "--device", "cpu", "--out-dir", str(tmp_path), *modes]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"cnnpar: error: bench {typed}: one mode at a time: expected one of --claims, --time-to-accuracy, --compare"
    )
    assert list(tmp_path.iterdir()) == []


def _bundle_out_of_memory(self, w):
    raise RuntimeError("out of memory (injected)")


def test_claims_where_every_claim_started_failed_exit_non_zero_saying_so(tmp_path, capsys, monkeypatch):
    """The table said *not measurable here* (as for a claim needing CUDA) and the command exited 0."""
    from cnnpar.bench.claims import ClaimContext

    monkeypatch.setattr(ClaimContext, "bundle", _bundle_out_of_memory)
    out = tmp_path / "c"
    assert main([*CLAIMS, "--only", "collate_speed", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == (
        "bench: nothing was measured: every claim started failed or was cut off (1 of 10, the rest not measurable "
        "here or not measured); first, collate_speed: failed (measurement failed: RuntimeError: out of memory "
        f"(injected)); rows in {out / 'claims.csv'}\n"
    )
    by = {r["claim"]: r for r in _ladder_rows(out / "claims.csv")}
    assert by["collate_speed"]["verdict"] == "failed"
    assert by["collate_speed"]["note"] == "measurement failed: RuntimeError: out of memory (injected)"
    assert by["pin_memory"]["verdict"] == "not measurable here"  # needs CUDA: no failure


def test_claims_where_one_claim_failed_exit_zero_and_its_row_says_it_failed(tmp_path, capsys, monkeypatch):
    from cnnpar.bench import probes
    from cnnpar.bench.claims import ClaimContext
    from cnnpar.bench.timing import Spread

    monkeypatch.setattr(ClaimContext, "bundle", _bundle_out_of_memory)
    monkeypatch.setattr(probes, "warm_compiler", lambda device: None)  # a measured claim without a CPU compile
    monkeypatch.setattr(probes, "preprocess_ms", lambda b, compiled, d, t: (Spread(1, 0.9, 1.1), 3) if compiled
                        else (Spread(3, 2.9, 3.1), 3))  # fmt: skip
    out = tmp_path / "c"
    assert main([*CLAIMS, "--only", "collate_speed,compiled_preprocess", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "nothing was measured" not in captured.err
    by = {r["claim"]: r for r in _ladder_rows(out / "claims.csv")}
    measured = by["compiled_preprocess"]
    assert measured["verdict"] == "confirmed" and float(measured["measured_ratio"]) == 3
    assert measured["steps_per_repeat"] == "3/3"
    assert by["collate_speed"]["verdict"] == "failed" and "out of memory (injected)" in by["collate_speed"]["note"]
    assert "| failed |  | measurement failed: RuntimeError: out of memory (injected) |" in captured.out  # claims.md


def test_a_claims_table_exits_non_zero_only_when_claims_started_and_none_was_measured():
    from pathlib import Path

    from cnnpar.bench.run import _claims_exit

    def row(claim, verdict, ratio=""):
        return {"claim": claim, "verdict": verdict, "note": "n", "measured_ratio": ratio}

    cut = [row("max_autotune", "cut off"), row("pin_memory", "not measurable here")]
    assert _claims_exit(cut, Path("c.csv")) == 1  # started, killed at its limit: no measurement
    assert _claims_exit([*cut, row("collate_speed", "confirmed", 3.1)], Path("c.csv")) == 0
    # nothing started (CUDA claims on a CPU, --only, the budget): no failure, as the ladder's skipped rungs
    assert _claims_exit([row("pin_memory", "not measurable here"), row("a", "not measured")], Path("c.csv")) == 0


TTA = [*BENCH, "--time-to-accuracy", "--data", "synthetic", "--epochs", "1", "--max-steps", "2", "--batch-size", "16"]


def test_time_to_accuracy_where_no_seed_reached_the_target_exits_non_zero_saying_so(tmp_path, capsys):
    """Random images never reach 99 %: the rows hold the time of the epochs allowed, which is no time to accuracy."""
    out = tmp_path / "t"
    assert main([*TTA, "--target", "0.99", "--repeats", "2", "--out", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        "bench: nothing was measured: no run reached the target 99.00% (each of 2 seed(s) stopped after 1 epoch(s), "
        "the best at "
    ), err
    assert err[0].endswith(f"more --epochs or a lower --target); rows in {out / 'time_to_accuracy.csv'}")
    assert [r["reached"] for r in _ladder_rows(out / "time_to_accuracy.csv")] == ["False", "False"]


def test_time_to_accuracy_where_one_seed_reached_the_target_exits_zero(tmp_path, capsys, monkeypatch):
    import cnnpar.bench.tta as tta

    def fake(cfg, bundle, info, target, seed):
        acc = 0.995 if seed == 0 else 0.5
        keys = ("wall_s", "wall_with_compile_s", "train_s", "eval_s", "compile_s", "lr")
        return {"seed": seed, "target": target, "reached": acc >= target, "epochs": 1, "max_epochs": 1,
                "final_val_acc": acc, "best_val_acc": acc, **dict.fromkeys(keys, 1.0)}  # fmt: skip

    monkeypatch.setattr(tta, "time_to_accuracy", fake)
    out = tmp_path / "t"
    assert main([*TTA, "--target", "0.99", "--repeats", "2", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "nothing was measured" not in captured.err
    assert "bench: seed 1: NOT reached after 1 epoch(s)" in captured.out
    assert [r["reached"] for r in _ladder_rows(out / "time_to_accuracy.csv")] == ["True", "False"]


def test_time_to_accuracy_goes_on_after_a_seed_that_fails_and_says_when_every_seed_failed(
    tmp_path, capsys, monkeypatch
):
    """A seed whose run raised (out of memory, say) ended the command with a traceback, losing the seeds
    measured before it: now it is a failed row and the other seeds run."""
    import cnnpar.bench.tta as tta

    def fake(cfg, bundle, info, target, seed):
        if seed != 1:
            raise RuntimeError("CUDA out of memory (injected)")
        keys = ("wall_s", "wall_with_compile_s", "train_s", "eval_s", "compile_s", "lr")
        return {"seed": seed, "target": target, "reached": True, "epochs": 1, "max_epochs": 1,
                "final_val_acc": 0.995, "best_val_acc": 0.995, **dict.fromkeys(keys, 1.0)}  # fmt: skip

    monkeypatch.setattr(tta, "time_to_accuracy", fake)
    out = tmp_path / "t"
    assert main([*TTA, "--target", "0.99", "--repeats", "3", "--out", str(out)]) == 0
    rows = _ladder_rows(out / "time_to_accuracy.csv")
    assert [(r["seed"], r["status"], r["reached"]) for r in rows] == [
        ("0", "failed", "False"),
        ("1", "ok", "True"),
        ("2", "failed", "False"),
    ]
    assert rows[0]["error"] == "RuntimeError: CUDA out of memory (injected)"
    assert "| 0 | 99.00% | failed: RuntimeError: CUDA out of memory (injected) |" in capsys.readouterr().out
    out2 = tmp_path / "t2"
    monkeypatch.setattr(tta, "time_to_accuracy", lambda *a: fake(*a[:4], seed=0))
    assert main([*TTA, "--target", "0.99", "--repeats", "2", "--out", str(out2)]) == 1
    assert "no run reached the target 99.00% (every seed's run failed (2; first: RuntimeError: CUDA out of memory" in (
        capsys.readouterr().err
    )


def _stopped_on_call(n: int, real):
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt  # Ctrl-C, or SIGTERM (errors.Terminated is one)
        return real(*args, **kwargs)

    return wrapped


def test_a_bench_stopped_mid_ladder_writes_the_rungs_it_measured(tmp_path, capsys, monkeypatch):
    """Ctrl-C after the baseline's row was printed left no folder: the rows were written only at the end."""
    import cnnpar.bench.ladder as ladder

    monkeypatch.setattr(ladder, "measure_steps", _stopped_on_call(2, ladder.measure_steps))
    out = tmp_path / "b"
    assert main([*BENCH, "--only", "baseline,channels_last", "--out", str(out)]) == 130
    assert f"bench: stopped; the 1 row(s) so far are in {out / 'ladder.csv'}" in capsys.readouterr().err
    row, stopped = _ladder_rows(out / "ladder.csv")
    assert (row["name"], row["status"]) == ("baseline", "ok") and float(row["images_per_s"]) > 0
    assert (stopped["name"], stopped["status"]) == ("(stopped)", "stopped")  # the table says it is not whole


def _a_worker_killed_by(signal_words: str, n: int, real):
    """`real`, whose `n`th call dies as torch reports a DataLoader worker killed by a signal ("Terminated": the
    group's SIGTERM, which `timeout` sends to the workers too), under the "exited unexpectedly" torch raises from it."""
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            try:
                raise RuntimeError(f"DataLoader worker (pid 4242) is killed by signal: {signal_words}. ")
            except RuntimeError as e:
                raise RuntimeError("DataLoader worker (pid(s) 4242) exited unexpectedly") from e
        return real(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_ladder_whose_workers_the_groups_stop_killed_stops_as_the_bench_stops(tmp_path, capsys, monkeypatch, sig):
    """`timeout 8 cnnpar bench`: the SIGTERM killed the rung's loader workers too, torch raised their death in place
    of the stop, and the ladder recorded a "workers" rung failure that never happened, went on past the limit and
    exited 0. A closing terminal's SIGHUP (torch's words: "Hangup") reaches the group alike."""
    import cnnpar.bench.ladder as ladder

    monkeypatch.setattr(ladder, "measure_steps", _a_worker_killed_by(signal.strsignal(sig), 2, ladder.measure_steps))
    out = tmp_path / "b"
    assert main([*BENCH, "--only", "baseline,channels_last", "--out", str(out)]) == 128 + sig
    err = capsys.readouterr().err
    assert f"bench: stopped; the 1 row(s) so far are in {out / 'ladder.csv'}" in err
    assert err.strip().splitlines()[-1] == f"cnnpar: stopped ({sig.name})"
    assert [(r["name"], r["status"]) for r in _ladder_rows(out / "ladder.csv")] == [
        ("baseline", "ok"),
        ("(stopped)", "stopped"),
    ]
    # a worker killed otherwise (the out-of-memory killer) is still a failed rung, and the ladder goes on
    monkeypatch.undo()
    monkeypatch.setattr(ladder, "measure_steps", _a_worker_killed_by("Killed", 1, ladder.measure_steps))
    out2 = tmp_path / "b2"
    assert main([*BENCH, "--only", "baseline,channels_last", "--out", str(out2)]) == 0
    rows = _ladder_rows(out2 / "ladder.csv")
    assert [(r["name"], r["status"]) for r in rows] == [("baseline", "failed"), ("channels_last", "ok")]


def test_a_claims_bench_stopped_mid_way_writes_what_it_measured_and_marks_the_rest(tmp_path, capsys, monkeypatch):
    import cnnpar.bench.claims as claims

    monkeypatch.setattr(claims, "_measure_here", _stopped_on_call(2, claims._measure_here))
    out = tmp_path / "c"
    assert main([*CLAIMS, "--only", "collate_speed,compiled_preprocess", "--out", str(out)]) == 130
    capsys.readouterr()
    by = {r["claim"]: r for r in _ladder_rows(out / "claims.csv")}
    measured = [k for k, r in by.items() if r.get("measured_ratio", "") != ""]
    stopped = [k for k, r in by.items() if r.get("note") == "the bench stopped before it ran"]
    assert (
        len(measured) == 1
        and len(stopped) == 1
        and measured == ["collate_speed"]
        and stopped == ["compiled_preprocess"]
    )


@pytest.mark.parametrize("ddp", ["1,x", "2", "1,0"])
def test_a_bad_ddp_list_stops_the_bench_before_it_measures_anything(ddp, capsys, monkeypatch):
    """`--ddp 1,x` was a traceback after the whole ladder ran; `--ddp 2` said its rows failed and exited 0."""
    import cnnpar.bench.run as bench_run

    monkeypatch.setattr(bench_run, "_measurement_setup", lambda *a: pytest.fail("the bench measured"))
    assert main(["bench", "--device", "cpu", "--ddp", ddp]) == 2
    assert capsys.readouterr().err == (
        f"cnnpar: error: bench --ddp {ddp}: expected process counts of 1 or more, comma-separated, 1 first "
        "(the baseline), e.g. 1,2\n"
    )


@pytest.mark.parametrize("mode", ["--claims", "--time-to-accuracy"])
def test_ddp_in_a_mode_without_ddp_rows_is_refused_not_dropped(mode, capsys, monkeypatch):
    import cnnpar.bench.run as bench_run

    monkeypatch.setattr(bench_run, "_measurement_setup", lambda *a: pytest.fail("the bench measured"))
    assert main(["bench", "--device", "cpu", mode, "--ddp", "1,2"]) == 2
    err = capsys.readouterr().err
    assert f"bench --ddp 1,2: DDP rows go beside the ladder only: expected no --ddp with {mode}\n" in err


def test_a_bench_whose_ddp_rows_failed_exits_non_zero_saying_so(tmp_path, capsys, monkeypatch):
    import cnnpar.bench.ddp_scaling as ddp_scaling

    def failed_launch(argv):
        raise SystemExit("ddp_scaling: world size 2 failed (exit 1)")

    monkeypatch.setattr(ddp_scaling, "main", failed_launch)
    out = tmp_path / "b"
    assert main([*BENCH, "--only", "baseline", "--ddp", "1,2", "--out", str(out)]) == 1
    assert "bench: DDP rows failed: ddp_scaling: world size 2 failed (exit 1)\n" in capsys.readouterr().err
    assert [r["status"] for r in _ladder_rows(out / "ladder.csv")] == ["ok"]  # the ladder's rows are kept


def test_nan_seconds_and_a_negative_budget_are_refused_by_the_options_too():
    from cnnpar.bench.run import BenchOptions
    from cnnpar.errors import UserError

    with pytest.raises(UserError, match=r"^bench --timed-s = nan: expected seconds >= 0"):
        Timing(seconds=float("nan"))
    with pytest.raises(UserError, match=r"^bench --budget-s -1: expected seconds >= 0"):
        BenchOptions("ladder", budget_s=-1)


def test_infinite_timed_seconds_are_refused_in_one_line_before_measuring(tmp_path, capsys):
    """--timed-s inf passed the check and failed every rung ("OverflowError: cannot convert float infinity to
    integer"), exit 1 with a table of failures."""
    assert main([*BENCH, "--only", "baseline", "--timed-s", "inf", "--out", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err == (
        "cnnpar: error: bench --timed-s = inf: expected seconds >= 0, finite (0: a fixed step count)\n"
    )
    assert not (tmp_path / "b").exists()


def test_time_to_accuracy_records_the_batch_the_search_chose_not_autos_zero(monkeypatch):
    """With --batch-size auto on a GPU the bench's metadata holds 0 (each Trainer searches its own batch), and
    time_to_accuracy.csv recorded that 0. The search is faked here: auto stays 0 on the CPU as on a GPU."""
    import cnnpar.config as config
    import cnnpar.engine.trainer as trainer_mod
    from cnnpar.engine.batch_size import BatchChoice

    monkeypatch.setattr(config, "resolve_batch_size", lambda batch, device_type: batch)
    monkeypatch.setattr(trainer_mod, "search_on_device", lambda *a, **k: BatchChoice(16, "faked"))
    cfg = with_overrides(
        Config(), data={"image_size": 8}, speed={"device": "cpu"}, run={"epochs": 1, "max_steps": 2, "batch_size": 0}
    )
    bundle = load_data(cfg.data, cfg.run.seed)
    [row] = run_tta(cfg, bundle, CPU, 0.99, 1, {"batch_size": 0}, log=lambda s: None)
    assert row["status"] == "ok" and row["batch_size"] == 16


def test_compare_names_the_file_row_and_column_of_a_rate_that_is_not_a_number(tmp_path):
    """A ValueError traceback from float() before."""
    from cnnpar.errors import UserError

    a = tmp_path / "a.csv"
    a.write_text("name,status,images_per_s,step_ms\nbaseline,ok,100.0,1\nbf16,ok,fast,1\nfp16,failed,,\n")
    with pytest.raises(UserError) as e:
        compare_markdown(a, a)
    assert str(e.value) == (
        f"{a}, line 3 (data row 2, rung 'bf16'), column 'images_per_s': 'fast' is not a number: expected images "
        "per second"
    )


def test_compare_says_what_it_expected_of_a_file_that_is_no_readable_csv(tmp_path):
    """A field past csv's size limit (a binary file given as A.csv) stopped on "not a readable CSV" alone."""
    from cnnpar.errors import UserError

    a = tmp_path / "a.csv"
    a.write_bytes(b"name,status,images_per_s,step_ms\n" + b"x" * 200_000 + b"\n")
    # the csv module's default limit, as `cnnpar bench --compare` starts with: data/csv_source.py raises it for the
    # whole process, so after any test that read a pixel CSV this one read the 200,000 characters and raised nothing
    limit = csv.field_size_limit(131_072)
    try:
        with pytest.raises(UserError) as e:
            compare_markdown(a, a)
    finally:
        csv.field_size_limit(limit)
    message = str(e.value)  # csv's own words in the brackets are Python's, not pinned here
    assert message.startswith(f"{a}: not a readable CSV (") and message.endswith(
        "): expected a ladder.csv written by `cnnpar bench`, with the columns name, status, images_per_s, step_ms"
    )


def test_a_ladder_of_one_repeat_says_its_noise_is_unknown_not_zero(tmp_path):
    """--repeats 1 showed "396-396 (±0.0%)" and plain ratios, as if measured without noise."""
    from cnnpar.bench.output import ladder_markdown

    def row(name, rate, prev=""):
        return {"rung": "0", "name": name, "technique": name, "status": "ok", "images_per_s": rate,
                "images_per_s_min": rate, "images_per_s_max": rate, "repeats_run": "1", "steps_per_repeat": "3",
                "speedup_vs_baseline": rate / 396, "speedup_vs_prev": rate / 396 if prev else "", "prev_rung": prev,
                "builds_on": prev}  # fmt: skip

    rows = [row("baseline", 396), row("uint8_device", 2020, "baseline")]
    table = {ln.split(" | ")[1]: ln for ln in ladder_markdown(rows).splitlines() if ln.startswith("| 0 |")}
    assert "| one repeat: noise unknown |" in table["baseline"] and "±0.0%" not in table["baseline"]
    assert table["uint8_device"].endswith("| 5.10x, noise unknown | 5.10x, noise unknown |")
    columns = ["name", "status", "images_per_s", "images_per_s_min", "images_per_s_max", "step_ms", "repeats_run"]
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(",".join(columns) + "\nbaseline,ok,396,396,396,5,1\n")
    b.write_text(",".join(columns) + "\nbaseline,ok,6077,6000,6100,1,3\n")
    assert "| baseline | 396 (396-396) | 6,077 (6,000-6,100) | 15.35x, noise unknown (no range) |" in (
        compare_markdown(a, b).splitlines()
    )


def test_a_claims_table_of_one_repeat_says_its_figures_are_single_samples():
    """`bench --claims --repeats 1 --warmup-steps 1` headed claims.md with "1 warm-up steps (2 where the second still
    takes 1 s or more)", "fewer repeats (at least 3)" and "figures are medians, ranges the slowest and fastest
    repeat": of one sample per side, after one warm-up step. The default counts keep their line."""
    from cnnpar.bench.output import claims_markdown

    meta = {"warmup_steps": 1, "timed_steps": 3, "repeats": 1, "timed_s": 0.5, "git_rev": "abc"}
    row = {**meta, "claim_text": "c", "claimed_ratio": 2.0, "verdict": "not measured"}
    head = claims_markdown([row]).splitlines()[3]
    assert "figures are single samples: no range, noise unknown" in head
    assert "2 where the second" not in head and "at least 3)" not in head and "medians" not in head
    default = claims_markdown([{**row, "warmup_steps": 3, "timed_steps": 30, "repeats": 5, "timed_s": 1.5}])
    assert (
        "- 3 warm-up steps (2 where the second still takes 1 s or more), then 5 repeats of timed steps sized from the "
        "last warm-up step so the repeats take about 1.5 s: at least 3 steps per repeat (1 for steps of 1 s or more), "
        "at most 30, and where even that takes longer, fewer repeats (at least 3); figures are medians, ranges the "
        "slowest and fastest repeat (each row's counts are its repeats x steps)"
    ) in default.splitlines()


def test_a_stopped_ladder_writes_its_rows_so_far_and_a_row_saying_it_stopped(tmp_path, capsys):
    """The table of a ladder stopped after two of three rungs read as a whole run."""
    from cnnpar.bench.output import LADDER_COLUMNS, write_ladder
    from cnnpar.bench.run import kept_if_stopped, stopped_row

    row = {k: "" for k in LADDER_COLUMNS} | {"rung": "0", "name": "baseline", "technique": "t", "status": "ok",
                                             "images_per_s": 100.0, "git_rev": "abc", "model": "cnn3"}  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        with kept_if_stopped(lambda rows: write_ladder(tmp_path, rows), stopped_row) as keep:
            keep([row])
            raise KeyboardInterrupt
    assert "bench: stopped; the 1 row(s) so far are in" in capsys.readouterr().err
    with open(tmp_path / "ladder.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["name"] for r in rows] == ["baseline", "(stopped)"]
    assert rows[1]["status"] == "stopped" and rows[1]["git_rev"] == "abc" and rows[1]["images_per_s"] == ""
    assert "stopped: the bench was stopped here: the rungs after it were not measured" in (
        (tmp_path / "ladder.md").read_text()
    )


def test_bench_probes_time_the_step_that_trains():
    """The claims' compile-time and step-memory probes once built a bare step on the plain model: no
    clipping, no weight average (whose copy of the weights is memory the step holds), no rewritten stem."""
    from cnnpar.bench.probes import fresh_step
    from cnnpar.parallel.stem import SpaceToDepthConv2d

    cfg = with_overrides(
        Config(),
        model={"name": "resnet18"},
        optim={"grad_clip": 2.0, "label_smoothing": 0.1, "ema": 0.9},
        speed={"device": "cpu", "precision": "fp32", "channels_last": "on", "stem_space_to_depth": "on"},
    )
    step = fresh_step(cfg, (3, 64, 64), 10, torch.device("cpu"))
    assert isinstance(step.raw_model.conv1, SpaceToDepthConv2d)
    assert (step.grad_clip, step.label_smoothing) == (2.0, 0.1) and step.average is not None
    step([(torch.randn(2, 3, 64, 64).contiguous(memory_format=torch.channels_last), torch.tensor([0, 1]))])
    assert step.average.started


def test_a_second_bench_on_the_same_day_keeps_the_first_ones_results(tmp_path, capsys):
    """The default folder was <date>-<device>-<model>: a second bench the same day wrote over the first's ladder
    (and left an earlier run's ddp.csv beside the new one), saying nothing."""
    root = tmp_path / "runs"
    for rung in ("baseline", "channels_last"):
        assert main([*BENCH, "--only", rung, "--out-dir", str(root)]) == 0
    capsys.readouterr()
    folders = sorted((root / "bench").iterdir())
    assert len(folders) == 2, folders
    names = sorted(r["name"] for f in folders for r in _ladder_rows(f / "ladder.csv"))
    assert names == ["baseline", "channels_last"]  # each bench's own rows, in a folder of its own


@pytest.mark.parametrize("earlier", ["ladder.csv", "ddp.csv", "claims.csv", "time_to_accuracy.csv"])
def test_an_out_folder_holding_an_earlier_benchs_results_is_refused_before_measuring(
    earlier, tmp_path, capsys, monkeypatch
):
    """`--out` naming a folder with results in it mixed the new run's files with the earlier one's (a new
    ladder.csv beside a stale ddp.csv), saying nothing."""
    import cnnpar.bench.run as bench_run

    monkeypatch.setattr(bench_run, "_measurement_setup", lambda *a: pytest.fail("the bench measured"))
    out = tmp_path / "b"
    out.mkdir()
    (out / earlier).write_text("an earlier bench's rows\n")
    assert main([*BENCH, "--only", "baseline", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"cnnpar: error: bench --out {out}: already holds an earlier bench's results ({earlier}): expected a new "
        "or empty folder, or no --out (a new folder under --out-dir for each run)\n"
    )
    assert sorted(p.name for p in out.iterdir()) == [earlier]
    assert (out / earlier).read_text() == "an earlier bench's rows\n"


def test_workers_0_is_the_workers_rungs_count_not_replaced_by_the_cores():
    """`--workers 0` was read as "not given" (-1): the workers rung and every rung after it ran 1 or more."""
    cfg = with_overrides(Config(), data={"image_size": 8, "workers": 0}, speed={"device": "cpu"})
    plan = {p.rung.name: p for p in plan_ladder(cfg, torch.device("cpu"), load_data(cfg.data, cfg.run.seed))}
    assert plan["workers"].cfg.data.workers == 0 and plan["compile"].cfg.data.workers == 0
    auto = with_overrides(cfg, data={"workers": -1})  # not given: the cores left after the main process
    [workers] = [p for p in plan_ladder(auto, torch.device("cpu"), load_data(auto.data)) if p.rung.name == "workers"]
    assert workers.cfg.data.workers >= 1


def test_a_stop_noted_before_a_ddp_launch_starts_no_torchrun(tmp_path, monkeypatch):
    """A Ctrl-C noted, not raised, inside an import (errors.stop_on_signals) as `cnnpar bench --ddp` began: every
    world size launched and measured in full before the command stopped."""
    import argparse
    import signal
    import subprocess
    import sys

    import cnnpar.bench.ddp_scaling as ddp_scaling
    from cnnpar import errors

    started = tmp_path / "started"
    real = subprocess.Popen
    script = f"open({str(started)!r}, 'w')"
    monkeypatch.setattr(ddp_scaling.subprocess, "Popen", lambda cmd, **kw: real([sys.executable, "-c", script], **kw))
    args = argparse.Namespace(**dict.fromkeys(ddp_scaling.WORKER_FLAGS, "1"))
    args.launch_timeout = 60
    errors.note_stop(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        ddp_scaling.launch(args, 1, 1, tmp_path / "result.json")
    assert not started.exists()
