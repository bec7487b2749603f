"""`cnnpar tune` on the CPU: time limits on a fake clock, the order of trials, tuned.toml written as it
goes, and the child process really killed at its limit."""

from __future__ import annotations

import csv
import math
import sys
import textwrap
import time
import tomllib

import psutil
import pytest

import cnnpar.bench.tune as tune_mod
from cnnpar.bench.trial import CUT_OFF, FAILED, OK, ChildResult, run_child
from cnnpar.config import Config, from_dict, load_toml
from cnnpar.models import build_model
from cnnpar.parallel.stem import has_stem_to_rewrite, space_to_depth_stem
from cnnpar.presets import with_overrides

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

CUDA_FACTS = {"device_type": "cuda", "bf16_ok": True, "in_memory": True, "folder": False, "train_samples": 50_000}


class FakeMachine:
    """Trials that take `cost(cfg)` seconds of a fake clock and run at `rate(cfg)` img/s; a trial whose
    cost passes its limit is cut off at the limit, as run_child does with a real child."""

    def __init__(self, rate, cost, facts=CUDA_FACTS, fail=lambda cfg: "", warmup_s=1.0, kill_s=0.0):
        self.now, self.rate, self.cost, self.facts, self.fail = 0.0, rate, cost, facts, fail
        self.warmup_s = warmup_s
        self.kill_s = kill_s  # what a cut-off costs past its limit (run_child's kill, the child's exit)
        self.calls: list[tuple[float, float, Config]] = []  # (started at, limit, config)

    def clock(self) -> float:
        return self.now

    def run_trial(self, cfg: Config, limit: float) -> ChildResult:
        self.calls.append((self.now, limit, cfg))
        cost = self.cost(cfg)
        if cost > limit:
            self.now += limit + self.kill_s
            return ChildResult(CUT_OFF, error=f"cut off at the {limit:.0f} s limit", wall_s=limit)
        self.now += cost
        if self.fail(cfg):
            return ChildResult(FAILED, error=self.fail(cfg), wall_s=cost)
        r = self.rate(cfg)
        resolved = {
            "speed": {
                "precision": "bf16" if cfg.speed.precision == "auto" else cfg.speed.precision,
                "channels_last": "on" if cfg.speed.channels_last == "auto" else cfg.speed.channels_last,
                "compile": "default" if cfg.speed.compile == "auto" else cfg.speed.compile,
                "cuda_graphs": "on" if cfg.speed.cuda_graphs == "auto" else cfg.speed.cuda_graphs,
                "stem_space_to_depth": (
                    ("on" if self.facts["device_type"] == "cuda" else "off")
                    if cfg.speed.stem_space_to_depth == "auto"
                    else cfg.speed.stem_space_to_depth
                ),
                "device": self.facts["device_type"],
                # a trial's run is short: the long compiles' "auto" is off there (presets.long_compiles_default)
                "compile_tuning": "off" if cfg.speed.compile_tuning == "auto" else cfg.speed.compile_tuning,
                "compile_tiling": "off" if cfg.speed.compile_tiling == "auto" else cfg.speed.compile_tiling,
            },
            "data": {"resident": "on" if cfg.data.resident == "auto" else cfg.data.resident, "workers": 0},
        }
        value = {
            "images_per_s": r,
            "images_per_s_min": 0.99 * r,
            "images_per_s_max": 1.01 * r,
            "warmup_s": self.warmup_s,
            "resolved": resolved,
            "facts": {**self.facts, "env": {"device": "fake GPU", "torch": "x", "git_rev": "r", "date": "d"}},
        }
        return ChildResult(OK, value, wall_s=cost)

    def tune(self, cfg: Config, budget_s: float, out, trial_s: float = 0.0):
        return tune_mod.tune(
            cfg, budget_s, out, trial_s, run_trial=self.run_trial, clock=self.clock, log=lambda s: None
        )


def resnet50(batch: int = 64) -> Config:
    return with_overrides(Config(), model={"name": "resnet50"}, run={"batch_size": batch})


def compiled_cost(cfg: Config) -> float:
    """Like ResNet-50 on an H200 in a fresh process: 10 s to start, 45 s more for a compile,
    and max-autotune's compile far longer than any limit."""
    return {"off": 10.0, "max-autotune-no-cudagraphs": 10_000.0}.get(cfg.speed.compile, 55.0)


def test_every_trial_is_limited_to_what_the_budget_leaves_and_the_run_ends_within_it(tmp_path):
    def cost(cfg: Config) -> float:  # batch 512 takes longer than the 136 s the budget leaves it
        return 100.0 if cfg.run.batch_size == 512 else compiled_cost(cfg)

    m = FakeMachine(rate=lambda c: 1000.0 * min(c.run.batch_size, 256) / 64, cost=cost)
    best, trials = m.tune(resnet50(), 310, tmp_path / "tuned.toml")
    assert m.now <= 310 * 1.1
    for started, limit, _ in m.calls:
        assert started + limit <= 310 + 1e-9  # no trial may run past the budget
    assert m.calls[0][1] == pytest.approx(310 * (1 - tune_mod.END_RESERVE))  # the start may use it all
    # 64 -> 128 -> 256 kept (55 s each, to 165 s); 512 would get 26 s of the 136 s left: once a trial is kept, the
    # checks keep 55 s each, the best config and the start's measured again
    b512 = next(t for t in trials if t.value == "512")
    assert b512.status == "skipped" and "a limit of 26 s, 110 s kept for the check, shorter than" in b512.note
    checks = [t for t in trials if t.group == tune_mod.CHECK_GROUP]
    assert all(t.status == "skipped" for t in trials[trials.index(b512) + 1 : -len(checks)])
    assert [(t.switch, t.status) for t in checks] == [  # both ran, in time
        (tune_mod.CHECK_SWITCH, tune_mod.AGREES),
        (tune_mod.CHECK_START, tune_mod.AGREES),
    ]
    assert best.run.batch_size == 256
    text = (tmp_path / "tuned.toml").read_text()
    assert tomllib.loads(text)["run"]["batch_size"] == 256
    assert "# measured again at the end, back to back: the best config 4,000 img/s, the start's 1,000 (4.00x)" in text
    # the start, 128, 256 and the two checks measured; the rest skipped ("after N trial(s)" alone read as N measured)
    assert f"after {len(trials)} trial(s), 5 of them measured\n" in text


def test_a_budget_of_inf_cuts_no_trial_off_as_tunes_help_says(tmp_path):
    """`--budget-s inf` (the help: no limit, each trial runs to its end unless --trial-s cuts it off): every trial
    runs, max-autotune's 10,000 s compile too, and none is cut off or skipped; with --trial-s, that is the limit."""
    m = FakeMachine(rate=lambda c: 1000.0, cost=compiled_cost)
    best, trials = m.tune(resnet50(), float("inf"), tmp_path / "a.toml")
    assert best is not None and {limit for _, limit, _ in m.calls} == {float("inf")}
    assert not [t for t in trials if t.status in (CUT_OFF, tune_mod.SKIPPED)]
    m = FakeMachine(rate=lambda c: 1000.0, cost=compiled_cost)
    _, trials = m.tune(resnet50(), float("inf"), tmp_path / "b.toml", trial_s=100.0)
    assert [t.value for t in trials if t.status == CUT_OFF] == ["max-autotune-no-cudagraphs"]


def test_the_first_line_states_the_trial_limit_that_applies(tmp_path):
    """It said "each trial at most a third of it" (40 s of 120) where a trial was given 1.5x the start's 31 s."""
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 31.0)
    said: list[str] = []
    tune_mod.tune(resnet50(), 120, tmp_path / "tuned.toml", run_trial=m.run_trial, clock=m.clock, log=said.append)
    assert "each trial at most a third of it or 1.5x the start trial's time, whichever is longer" in said[0]
    assert m.calls[1][1] == pytest.approx(46.5)  # the second trial's limit: 1.5 x 31 s, above 120 / 3
    said.clear()  # --budget-s inf: the line read "budget inf s, each trial at most a third of it or ..."
    tune_mod.tune(
        resnet50(), float("inf"), tmp_path / "inf.toml", run_trial=m.run_trial, clock=m.clock, log=said.append
    )
    assert said[0].startswith("tune: budget no time limit (--budget-s inf), each trial without a time limit; ")


@pytest.mark.parametrize("budget", [180.0, 200.0])
def test_no_trial_starts_with_a_limit_shorter_than_the_start_trial_took(tmp_path, budget):
    # as call ZZB: trials of ~45 s, and a budget that leaves less than that at the end
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 45.0)
    _, trials = m.tune(resnet50(), budget, tmp_path / "tuned.toml")
    started = [t for t in trials if t.status != "skipped"]
    assert all(t.status != CUT_OFF for t in started)  # each one that started had the time to measure
    last = trials[len(started)]
    assert last.status == "skipped" and "shorter than the start trial's 45 s" in last.note
    assert len(m.calls) == len(started)  # the skipped ones never reached a child


def test_a_trial_limit_below_the_start_trials_time_skips_the_trials_saying_so(tmp_path):
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 45.0)
    _, trials = m.tune(resnet50(), 600, tmp_path / "tuned.toml", trial_s=30)
    assert trials[0].status == "start" and len(m.calls) == 1
    assert all(t.status == "skipped" and "a limit of 30 s" in t.note for t in trials[1:])


def test_a_trial_past_its_own_limit_is_cut_off_and_the_search_goes_on(tmp_path):
    m = FakeMachine(rate=lambda c: 1000.0, cost=compiled_cost)
    _, trials = m.tune(resnet50(), 700, tmp_path / "tuned.toml", trial_s=90)
    autotune = next(t for t in trials if t.value == "max-autotune-no-cudagraphs")
    assert autotune.status == CUT_OFF and autotune.limit_s == 90 and autotune.images_per_s is None
    searched = [t for t in trials if t.group != tune_mod.CHECK_GROUP]  # the check comes after the search
    assert autotune is searched[-1]  # the longest compile comes last
    before = searched[1:-1]
    assert before and all(t.status in ("ok", "kept") for t in before)  # the data and precision trials ran
    rows = list(csv.DictReader((tmp_path / "tuned.csv").open()))
    assert [r["status"] for r in rows] == [t.status for t in trials]
    assert next(r for r in rows if r["value"] == "max-autotune-no-cudagraphs")["images_per_s"] == ""


def test_trials_go_batch_compile_data_precision_and_a_bf16_gpu_tries_no_fp32(tmp_path):
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 1.0)
    _, trials = m.tune(resnet50(), 600, tmp_path / "tuned.toml")
    assert trials[-1].group == tune_mod.CHECK_GROUP and trials[-1].status == tune_mod.AGREES
    trials = trials[:-1]  # the search's own trials, in order
    groups = [t.group for t in trials[1:]]
    assert groups == sorted(groups, key=tune_mod.GROUPS.index)  # in the order of expected gain
    assert groups[0] == "batch size" and groups[-1] == "long compiles"
    tried = [(t.switch, t.value) for t in trials]
    assert ("precision", "fp32") not in tried
    assert tried[-4:] == [
        ("precision", "fp16"),
        ("compile_tiling", "on"),
        ("compile_tuning", "on"),
        ("compile", "max-autotune-no-cudagraphs"),
    ]
    assert ("compile", "off") in tried and ("cuda_graphs", "off") in tried and ("resident", "off") in tried


def test_a_gpu_started_in_fp32_tries_bf16_and_fp16(tmp_path):
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 1.0)
    _, trials = m.tune(with_overrides(resnet50(), speed={"precision": "fp32"}), 600, tmp_path / "tuned.toml")
    assert [t.value for t in trials if t.switch == "precision"] == ["bf16", "fp16"]
    no_bf16 = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 1.0, facts={**CUDA_FACTS, "bf16_ok": False})
    _, trials = no_bf16.tune(with_overrides(resnet50(), speed={"precision": "fp32"}), 600, tmp_path / "t2.toml")
    assert [t.value for t in trials if t.switch == "precision"] == ["fp16"]


def test_a_cpu_tries_the_other_precision_and_no_gpu_switches(tmp_path):
    facts = {**CUDA_FACTS, "device_type": "cpu"}
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 1.0, facts=facts)
    _, trials = m.tune(Config(), 600, tmp_path / "tuned.toml")
    tried = {(t.switch, t.value) for t in trials}
    assert ("precision", "fp32") in tried  # the fake resolved bf16
    assert not {s for s, _ in tried} & {"cuda_graphs", "resident", "decode"}


def test_tuned_toml_holds_the_best_so_far_before_the_next_trial_starts(tmp_path):
    out = tmp_path / "tuned.toml"
    seen_on_disk = []

    def rate(cfg):
        return {64: 100.0, 128: 150.0, 256: 151.0}[cfg.run.batch_size]  # 256: inside the 3 % margin

    m = FakeMachine(rate=rate, cost=lambda c: 1.0)
    real = m.run_trial

    def spy(cfg, limit):
        seen_on_disk.append(tomllib.loads(out.read_text())["run"]["batch_size"] if out.exists() else None)
        return real(cfg, limit)

    m.run_trial = spy
    _, trials = m.tune(resnet50(), 600, out)
    assert seen_on_disk[:4] == [None, 64, 128, 128]  # written after the start, then after the kept 128
    assert [t.status for t in trials[:3]] == ["start", "kept", "ok"]
    assert from_dict(tomllib.loads(out.read_text())).run.batch_size == 128
    assert "# best so far: batch_size=128, 150 img/s (1.50x" in out.read_text()


def test_a_stopped_tune_says_where_the_best_config_so_far_and_its_trials_are(tmp_path):
    """A Ctrl-C or SIGTERM ended `cnnpar tune` with "cnnpar: stopped (SIGTERM)" alone: tuned.toml and its CSV were
    kept, but nothing said so, and the CSV lacked the trials after the last kept one."""
    from cnnpar.errors import Terminated

    out, lines = tmp_path / "tuned.toml", []
    m = FakeMachine(rate=lambda c: {64: 100.0, 128: 150.0, 256: 151.0}[c.run.batch_size], cost=lambda c: 1.0)
    real = m.run_trial

    def stopped_at_the_fourth(cfg, limit):
        if len(m.calls) == 3:
            raise Terminated  # as run_child lets it through, once it has killed its child
        return real(cfg, limit)

    m.run_trial = stopped_at_the_fourth
    with pytest.raises(Terminated):
        tune_mod.tune(resnet50(), 600, out, run_trial=m.run_trial, clock=m.clock, log=lines.append)
    csv_path = out.with_suffix(".csv")
    assert (
        lines[-1]
        == f"tune: stopped; the best config so far (3 trial(s), 3 measured) is in {out} (the trials in {csv_path})"
    )
    assert from_dict(tomllib.loads(out.read_text())).run.batch_size == 128
    with csv_path.open() as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["start", "kept", "ok"]  # 256's row too, not kept


def test_batch_doubling_scales_lr_by_the_batch_size_auto_rule_and_stops_at_out_of_memory(tmp_path):
    cfg = with_overrides(resnet50(), optim={"lr": 0.1, "lr_scaling": "linear"})
    m = FakeMachine(
        rate=lambda c: float(c.run.batch_size),
        cost=lambda c: 1.0,
        fail=lambda c: "OutOfMemoryError: CUDA out of memory" if c.run.batch_size >= 512 else "",
    )
    best, trials = m.tune(cfg, 600, tmp_path / "tuned.toml")
    batch = [t for t in trials if t.switch == "batch_size"]
    assert [(t.value, t.status) for t in batch] == [("128", "kept"), ("256", "kept"), ("512", "failed")]
    assert "out of memory" in batch[-1].note
    lrs = {c.run.batch_size: c.optim.lr for _, _, c in m.calls}  # AdamW: the square root, --lr-scaling linear aside
    assert lrs[128] == pytest.approx(0.1 * 2**0.5) and lrs[256] == pytest.approx(0.2)
    assert best.run.batch_size == 256 and best.optim.lr == pytest.approx(0.2)


def test_a_start_the_budget_cut_off_is_refused_naming_a_budget_and_writes_nothing(tmp_path):
    """A budget under the start trial's time ended in exit 1, a failure, after a CSV of one unmeasured row: the budget
    is the user's input, refused as bad data at the start is (tune_cli), with a budget to try."""
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 500.0)
    with pytest.raises(tune_mod.BudgetTooSmall) as e:
        m.tune(resnet50(), 100, tmp_path / "tuned.toml")
    assert str(e.value) == (
        "tune --budget-s 100: the first trial ('start', the config as given) needs more than that here "
        "(cut off at the 97 s limit)"
    )
    assert e.value.budget_s == 200 and len(m.calls) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_start_that_failed_with_time_to_run_still_writes_its_trial(tmp_path):
    """A start that failed (not for the budget, nor for bad data) is the tool's failure: its row is kept."""
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 10.0, fail=lambda c: "CUDA error: launch failure")
    best, trials = m.tune(resnet50(), 100, tmp_path / "tuned.toml")
    assert best is None and [t.status for t in trials] == [FAILED]
    assert not (tmp_path / "tuned.toml").exists()
    [row] = list(csv.DictReader((tmp_path / "tuned.csv").open()))
    assert row["status"] == FAILED
    assert row["device"] and row["torch"] and row["world_size"] == "1"  # this machine's, with no start measured


def test_the_child_and_its_own_children_are_killed_at_the_limit(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = textwrap.dedent(
        f"""
        import subprocess, sys, time
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pid_file)!r}, "w").write(str(g.pid))
        print("compiling forever", flush=True)
        time.sleep(120)
        """
    )
    start = time.monotonic()
    r = run_child({}, 2.0, log=lambda s: None, command=lambda spec, res: [sys.executable, "-c", script])
    assert r.status == CUT_OFF and time.monotonic() - start < 10
    assert "cut off at the 2 s limit" in r.error and "compiling forever" in r.error
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the grandchild outlived the kill"
        time.sleep(0.1)


def test_the_childs_children_in_sessions_of_their_own_are_killed_at_the_limit(tmp_path):
    """A `killpg` of the child's session missed what it started in another session (as torch elastic starts its
    workers)."""
    from tests.unit.test_process_tree import gone_soon, launcher_of_a_new_session_child, running_with

    marker = f"trial-worker-{tmp_path.name}"
    script = launcher_of_a_new_session_child(marker)
    try:
        r = run_child({}, 2.0, log=lambda s: None, command=lambda spec, res: [sys.executable, "-c", script])
        assert r.status == CUT_OFF
        assert gone_soon(marker), "the child's child in a session of its own outlived the kill"
    finally:
        for p in running_with(marker):
            p.kill()


def test_the_progress_lines_show_only_the_childs_own_marked_lines():
    """`bench --claims` printed "... 15 s: warn_once(": the last line of a torch warning's traceback in the child's
    log read as its progress. Before its first own line the child is "starting"; the warnings are not shown."""
    script = textwrap.dedent(
        """
        import sys, time
        print("UserWarning: something in torch", flush=True)
        print("  warn_once(", flush=True)
        time.sleep(1.5)
        print("trial: static compile ...", flush=True)
        print("  warn_once(", flush=True)
        time.sleep(1.5)
        """
    )
    shown: list[str] = []
    r = run_child({}, 30.0, log=shown.append, poll_s=0.3, command=lambda spec, res: [sys.executable, "-c", script])
    assert r.status == FAILED  # (no result file: it measured nothing)
    assert shown and not any("warn_once" in line or "UserWarning" in line for line in shown), shown
    assert shown[0].endswith(": starting") and shown[-1].endswith(": static compile ..."), shown


def test_a_stop_noted_before_a_trial_starts_no_child(tmp_path):
    """A Ctrl-C noted, not raised, inside an import (errors.stop_on_signals) as `cnnpar tune` or `bench --claims`
    began: the child started and measured in full before the command stopped."""
    import signal

    from cnnpar import errors

    started = tmp_path / "started"
    errors.note_stop(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        run_child(
            {},
            30.0,
            log=lambda s: None,
            command=lambda spec, res: [sys.executable, "-c", f"open({str(started)!r}, 'w')"],
        )
    assert not started.exists()


def test_a_child_that_fails_reports_its_error_line(tmp_path):
    r = run_child(
        {}, 30.0, log=lambda s: None, command=lambda spec, res: [sys.executable, "-c", "raise SystemExit('boom')"]
    )
    assert r.status == FAILED and "boom" in r.error


def test_a_tuned_batch_carries_the_lr_a_searched_batch_would():
    import math

    from cnnpar.bench.tune import batch_lr
    from cnnpar.config import Config
    from cnnpar.presets import with_overrides

    adamw, note = batch_lr(Config(), 4)
    assert math.isclose(adamw, 0.002 * 2) and "square root (AdamW)" in note
    sgd, _ = batch_lr(with_overrides(Config(), optim={"optimizer": "sgd", "lr": 0.1}), 4)
    assert math.isclose(sgd, 0.4)
    # --lr-scaling scales with the processes x accumulation in cnnpar train, never with the per-process batch: a kept
    # batch carries --batch-size auto's lr whatever it says (AdamW had the linear 0.008 here, SGD under sqrt 0.2)
    linear, note = batch_lr(with_overrides(Config(), optim={"lr_scaling": "linear"}), 4)
    assert math.isclose(linear, 0.002 * 2) and "square root (AdamW)" in note and "--lr-scaling linear scales" in note
    sqrt, _ = batch_lr(with_overrides(Config(), optim={"optimizer": "sgd", "lr": 0.1, "lr_scaling": "sqrt"}), 4)
    assert math.isclose(sqrt, 0.4)


def test_the_stem_is_tried_the_other_way_on_a_gpu_only_where_the_model_has_one_it_rewrites(tmp_path):
    def tried(facts):
        m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 1.0, facts=facts)
        _, trials = m.tune(resnet50(), 600, tmp_path / f"tuned{len(list(tmp_path.iterdir()))}.toml")  # a new --out
        return [(t.group, t.value) for t in trials if t.switch == "stem_space_to_depth"]

    assert tried({**CUDA_FACTS, "stem_fits": True}) == [("layout and precision", "off")]  # auto resolved on
    assert tried({**CUDA_FACTS, "stem_fits": False}) == []  # the switch would change nothing
    assert tried({**CUDA_FACTS, "device_type": "cpu", "stem_fits": True}) == []  # not measured on a CPU


def test_a_stem_that_wins_off_is_kept_off_in_tuned_toml(tmp_path):
    m = FakeMachine(
        rate=lambda c: 1100.0 if c.speed.stem_space_to_depth == "off" else 1000.0,
        cost=lambda c: 1.0,
        facts={**CUDA_FACTS, "stem_fits": True},
    )
    best, _ = m.tune(resnet50(), 600, tmp_path / "tuned.toml")
    assert best.speed.stem_space_to_depth == "off"
    assert load_toml(tmp_path / "tuned.toml").speed.stem_space_to_depth == "off"


def test_the_stem_fact_sees_the_7x7_stem_before_and_after_its_rewrite_and_not_a_3x3_one():
    big = build_model("resnet50", 3, 10, 224)
    assert has_stem_to_rewrite(big)
    space_to_depth_stem(big)
    assert has_stem_to_rewrite(big)
    assert not has_stem_to_rewrite(build_model("resnet18", 3, 10, 32))


def test_a_gpu_tries_compile_tuning_on_a_compiled_best_and_keeps_it_in_tuned_toml(tmp_path):
    m = FakeMachine(rate=lambda c: 1050.0 if c.speed.compile_tuning == "on" else 1000.0, cost=lambda c: 1.0)
    best, trials = m.tune(resnet50(), 600, tmp_path / "tuned.toml")
    [t] = [t for t in trials if t.switch == "compile_tuning"]
    assert (t.group, t.value, t.status) == ("long compiles", "on", tune_mod.KEPT)
    assert best.speed.compile_tuning == "on" and load_toml(tmp_path / "tuned.toml").speed.compile_tuning == "on"
    # the tiling trial was measured and not kept: the file says off, not the "auto" a long run would turn on
    assert best.speed.compile_tiling == "off" and load_toml(tmp_path / "tuned.toml").speed.compile_tiling == "off"


def test_compile_tuning_is_skipped_saying_why_when_the_best_runs_uncompiled(tmp_path):
    # compile off wins its trial: tuning has no compile to tune, so no device time goes to it
    m = FakeMachine(rate=lambda c: 2000.0 if c.speed.compile == "off" else 1000.0, cost=lambda c: 1.0)
    best, trials = m.tune(resnet50(), 600, tmp_path / "tuned.toml")
    [t] = [t for t in trials if t.switch == "compile_tuning"]
    assert best.speed.compile == "off" and t.status == tune_mod.SKIPPED
    assert t.note == "tunes a compile in default or reduce-overhead mode; the best so far has off"
    assert not any(c.speed.compile_tuning == "on" for _, _, c in m.calls)  # never measured
    [tiling] = [t for t in trials if t.switch == "compile_tiling"]  # nor inductor's tiling, with nothing compiled
    assert (
        tiling.status == tune_mod.SKIPPED
        and tiling.note == "changes the compiled kernels; the best so far runs uncompiled"
    )
    assert not any(c.speed.compile_tiling == "on" for _, _, c in m.calls)
    cpu = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 1.0, facts={**CUDA_FACTS, "device_type": "cpu"})
    _, trials = cpu.tune(Config(), 600, tmp_path / "cpu.toml")
    assert not [t for t in trials if t.switch in ("compile_tuning", "compile_tiling")]  # GPU levers, GPU-measured


def test_a_long_compile_cut_off_at_its_limit_costs_no_other_trial_its_time(tmp_path):
    # as call ZZF (ResNet-18 32 px, 540 s): trials of ~40 s, inductor's tuning ~170 s, max-autotune past any limit,
    # and since session 16 inductor's tiling (~95 s for ResNet-18, call ZZK) first among the long compiles, the
    # shortest compile first. The cheap trials are all measured before any long compile, whatever the budget.
    def cost(cfg: Config) -> float:
        if cfg.speed.compile == "max-autotune-no-cudagraphs":
            return 10_000.0
        return 40.0 + 130.0 * (cfg.speed.compile_tuning == "on") + 55.0 * (cfg.speed.compile_tiling == "on")

    def long_compiles(budget: float) -> list[tuple[str, str]]:
        m = FakeMachine(rate=lambda c: 1000.0, cost=cost)
        _, trials = m.tune(resnet50(), budget, tmp_path / f"tuned{budget:g}.toml")
        cheap = [t for t in trials[1:] if t.group not in ("long compiles", tune_mod.CHECK_GROUP)]
        assert cheap and all(t.status in ("ok", "kept") for t in cheap), [(t.switch, t.status) for t in cheap]
        return [(t.switch, t.status) for t in trials if t.group == "long compiles"]

    # ZZF's budget: the tiling fits, the tuning is cut off at its limit, saying so, and max-autotune has no
    # time left (the price of the tiling trial there: ZZF measured the tuning at 1.04x within 540 s)
    assert long_compiles(540) == [("compile_tiling", "ok"), ("compile_tuning", CUT_OFF), ("compile", "skipped")]
    # tuned.toml: the tiling measured and not kept is pinned off; the tuning, never measured, keeps its "auto" for
    # the long run the file is for (the start trial's short run resolved it off, which must not stick)
    tuned = load_toml(tmp_path / "tuned540.toml").speed
    assert (tuned.compile_tiling, tuned.compile_tuning) == ("off", "auto")
    # with a minute more both fit, and max-autotune alone pays for its compile
    assert long_compiles(660) == [("compile_tiling", "ok"), ("compile_tuning", "ok"), ("compile", CUT_OFF)]


def test_a_long_compile_measured_and_not_kept_is_off_on_disk_before_the_next_trial_starts(tmp_path):
    # a tuner stopped during max-autotune (the longest trial; Ctrl-C, SIGTERM) leaves a tuned.toml that a long run
    # loads: it must not say "auto" for a long compile this machine measured as not worth keeping
    class Stopped(Exception):
        pass

    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 1.0)
    measure = m.run_trial

    def run_trial(cfg: Config, limit: float):
        if cfg.speed.compile == "max-autotune-no-cudagraphs":
            raise Stopped
        return measure(cfg, limit)

    m.run_trial = run_trial
    with pytest.raises(Stopped):
        m.tune(resnet50(), 600, tmp_path / "tuned.toml")
    tuned = load_toml(tmp_path / "tuned.toml").speed
    assert (tuned.compile_tiling, tuned.compile_tuning) == ("off", "off")


def test_a_faster_median_whose_repeats_overlap_the_bests_is_not_kept_and_says_so(tmp_path):
    """On a busy host one config's repeats spread wide: a batch 128 "1.5x" whose slowest repeat is below the
    start's fastest is noise, not a measurement of the batch: not kept, and the doubling stops there."""
    spread = {64: (40.0, 100.0, 160.0), 128: (120.0, 150.0, 200.0)}
    m = FakeMachine(rate=lambda cfg: spread[cfg.run.batch_size][1], cost=lambda c: 1.0)
    real = m.run_trial

    def wide(cfg, limit):
        r = real(cfg, limit)
        low, _, high = spread[cfg.run.batch_size]
        r.value.update(images_per_s_min=low, images_per_s_max=high)
        return r

    m.run_trial = wide
    _, trials = m.tune(resnet50(), 600, tmp_path / "tuned.toml")
    b128 = next(t for t in trials if t.switch == "batch_size")
    assert b128.status == "ok"
    assert "inside the noise: its slowest repeat 120 img/s is not above the best's fastest 160" in b128.note
    # the doubling stops at a trial not kept (as at a failure): nothing after 128 is a batch trial
    assert [t.value for t in trials if t.switch == "batch_size"] == ["128"]
    assert from_dict(tomllib.loads((tmp_path / "tuned.toml").read_text())).run.batch_size == 64


def bad_data_machine(fails: str) -> FakeMachine:
    """A FakeMachine on an image folder where one trial, the start ("start") or the decoder's ("decode"), fails as a
    child fails on bad input (trial.main: the error and the message, "user_error")."""
    facts = {**CUDA_FACTS, "in_memory": False, "folder": True}
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 10.0, facts=facts)
    measure = m.run_trial

    def run_trial(cfg: Config, limit: float) -> ChildResult:
        if fails == "start" or cfg.data.decode != "auto":  # the start, or the decoder's trial
            m.now += 5.0
            text = "photos/c1/2.jpg: cannot decode as an image: expected a readable JPEG or PNG file"
            value = {"status": FAILED, "error": f"DataError: {text}", "oom": False, "user_error": text}
            return ChildResult(FAILED, value, value["error"], 5.0)
        return measure(cfg, limit)

    m.run_trial = run_trial
    return m


def test_a_start_that_fails_on_bad_input_stops_with_its_error_and_leaves_no_file_or_folder(tmp_path):
    """Exit 1 and a tuned.csv of one failed row: a trials file that measured nothing, for data no trial can read."""
    from cnnpar.errors import UserError

    out = tmp_path / "new" / "sub" / "tuned.toml"
    with pytest.raises(UserError, match=r"^photos/c1/2\.jpg: cannot decode as an image: expected a readable"):
        bad_data_machine("start").tune(resnet50(), 600, out)
    assert list(tmp_path.iterdir()) == []  # neither the folder made for --out nor its parent
    kept = tmp_path / "kept"  # a folder that was there before stays as it was
    kept.mkdir()
    (kept / "tuned.csv").write_text("an earlier run's trials\n")
    with pytest.raises(UserError):
        bad_data_machine("start").tune(resnet50(), 600, kept / "tuned.toml")
    assert [p.name for p in kept.iterdir()] == ["tuned.csv"]
    assert (kept / "tuned.csv").read_text() == "an earlier run's trials\n"


def test_a_later_trial_failing_on_its_input_is_a_failed_row_and_the_search_goes_on(tmp_path):
    """Only the start's bad input stops the run: a switch whose trial fails (the other decoder) is a result."""
    best, trials = bad_data_machine("decode").tune(resnet50(), 600, tmp_path / "tuned.toml")
    decode = next(t for t in trials if t.switch == "decode")
    assert decode.status == FAILED and "DataError: photos/c1/2.jpg: cannot decode" in decode.note
    assert trials.index(decode) < len(trials) - 1  # trials after it ran
    rows = list(csv.DictReader((tmp_path / "tuned.csv").open()))
    assert [r["status"] for r in rows if r["switch"] == "decode"] == [FAILED]
    assert best is not None and best.data.decode == "auto"


def test_a_child_that_fails_on_bad_data_reports_it_as_bad_input_naming_the_file(tmp_path):
    """What the parent stops on: the child's own result says the error is bad input, and gives the message."""
    import json

    import numpy as np

    from cnnpar.bench import trial
    from cnnpar.config import to_dict

    data = tmp_path / "d.npz"
    np.savez(data, x_train=np.zeros((8, 8, 8), np.uint8), y_train=np.zeros(8, np.int64))  # one class
    cfg = with_overrides(Config(), data={"source": str(data)}, speed={"device": "cpu"})
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"kind": "train", "config": to_dict(cfg), "steps": 1, "repeats": 1}))
    assert trial.main([str(spec), str(tmp_path / "result.json")]) == 1
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == FAILED and result["user_error"].startswith(f"{data}: every training label is 0")
    assert result["error"] == f"DataError: {result['user_error']}"


@pytest.mark.parametrize("name", ["folder", "tuned.csv"])
def test_an_out_that_is_a_folder_or_the_trials_csv_is_refused_before_any_trial(tmp_path, name):
    """A folder failed with IsADirectoryError after the start trial; `x.csv` made tuned.toml and tuned.csv one file."""
    from cnnpar.errors import UserError

    (tmp_path / "folder").mkdir()
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 10.0)
    with pytest.raises(UserError, match=rf"^tune --out {tmp_path / name}: .*expected a"):
        m.tune(resnet50(), 600, tmp_path / name)
    assert m.calls == []


@pytest.mark.parametrize("earlier", [["tuned.toml"], ["tuned.csv"], ["tuned.toml", "tuned.csv"]])
def test_an_out_holding_an_earlier_runs_results_is_refused_before_any_trial(tmp_path, earlier):
    """An earlier run's tuned.toml and tuned.csv were rewritten by the next tune (tuned.toml in the current folder by
    default), and a start that measured nothing removed the earlier tuned.toml: refused now, as bench refuses an
    --out holding results."""
    from cnnpar.errors import UserError

    out = tmp_path / "tuned.toml"
    for name in earlier:
        (tmp_path / name).write_text(f"an earlier run's {name}\n")
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 10.0)
    with pytest.raises(UserError, match=rf"^tune --out {out}: already holds an earlier tune's results \("):
        m.tune(resnet50(), 600, out)
    assert m.calls == []
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {n: f"an earlier run's {n}\n" for n in earlier}


def test_a_start_that_measured_nothing_keeps_the_config_it_started_from_where_that_is_out(tmp_path):
    """`cnnpar tune --config tuned.toml` (the default --out) re-tunes a tuned config: a start that failed must not
    delete the user's own file, which the printed retry command names."""
    out = tmp_path / "tuned.toml"
    out.write_text("# the user's config\n")
    lines = []
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 10.0, fail=lambda c: "CUDA error: launch failure")
    best, _ = tune_mod.tune(
        resnet50(), 100, out, run_trial=m.run_trial, clock=m.clock, log=lines.append, config_read=out
    )
    assert best is None and out.read_text() == "# the user's config\n"
    assert f"tune: kept {out}: it is the --config this run started from, not a result of it" in lines


def test_a_budget_start_up_leaves_no_trial_time_in_is_refused_before_any_work(tmp_path, capsys):
    """The start not started (the budget spent on start-up) said only "the start skipped: time budget spent", and
    then exited 1, a failure, after writing a trials file of that one row: refused now in one line, exit 2, nothing
    written, no child started, with the command to rerun."""
    from cnnpar.cli import main

    out = tmp_path / "tuned.toml"
    started = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tune_mod, "child_trial", lambda *a: lambda cfg, limit: started.append(cfg))
        assert main(["tune", "--device", "cpu", "--budget-s", "0.001", "--out", str(out)]) == 2
    out_text, err = capsys.readouterr()
    assert err == (
        "cnnpar: error: tune --budget-s 0.001: the first trial ('start', the config as given) could not start: time "
        "budget spent (0 s left), under the 5 s a trial needs at least: expected a larger --budget-s, such as: "
        f"cnnpar tune --device cpu --out {out} --budget-s 60\n"
    )
    assert out_text == "" and started == [] and list(tmp_path.iterdir()) == []


def test_a_start_the_budget_cut_off_exits_2_with_the_command_and_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """The CLI side of a cut-off start: it exited 1 after the trial, with a CSV of the cut-off row."""
    from cnnpar.cli import main

    cut = lambda cfg, limit: ChildResult(CUT_OFF, error=f"cut off at the {limit:.0f} s limit", wall_s=limit)  # noqa: E731
    monkeypatch.setattr(tune_mod, "child_trial", lambda steps, repeats, log: cut)
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--device", "cpu", "--budget-s", "30", "--out-dir", "runs"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(
        "cnnpar: error: tune --budget-s 30: the first trial ('start', the config as given) needs more than that here "
        "(cut off at the "
    ), last
    assert last.endswith("expected a larger --budget-s, such as: cnnpar tune --device cpu --out-dir runs --budget-s 60")
    assert list(tmp_path.iterdir()) == []  # neither runs/tune/<stamp>/ nor its tuned.csv


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: prctl's parent-death signal")
def test_a_trial_ends_with_a_tuner_killed_outright(tmp_path):
    """`cnnpar tune` killed with SIGKILL (or by the OOM killer) left its trial, in a session of its own, measuring on
    with no time limit."""
    import os
    import signal
    import subprocess

    from tests.conftest import cli_env

    pid_file = tmp_path / "child.pid"
    child = (  # the trial's own main, measuring for longer than the test runs
        "import os, sys, time; from cnnpar.bench import trial; "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
        "trial._run = lambda spec: time.sleep(120); sys.exit(trial.main(sys.argv[1:]))"
    )
    tuner = (
        "import sys; from cnnpar.bench.trial import run_child; "
        f"run_child({{}}, 120.0, command=lambda spec, res: [sys.executable, '-c', {child!r}, str(spec), str(res)])"
    )
    proc = subprocess.Popen([sys.executable, "-c", tuner], env=cli_env())
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the trial never started"
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    time.sleep(0.5)  # past the child's prctl: a parent dead before it is the other branch
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the trial outlived the tuner that started it")
        time.sleep(0.05)


def test_a_trial_folder_whose_parent_is_gone_is_removed_by_the_next_trial(tmp_path, monkeypatch):
    """A SIGKILLed tune's child now ends with it, but its /tmp/cnnpar-trial-* folder stayed for good."""

    from cnnpar.bench import trial
    from tests.conftest import dead_process_folder

    dead = dead_process_folder(tmp_path, monkeypatch, trial.TRIAL_PREFIX)
    (dead / "spec.json").write_text("{}")
    r = run_child({}, 30.0, log=lambda s: None, command=lambda spec, res: [sys.executable, "-c", "pass"])
    assert r.status == FAILED  # (no result file: it measured nothing)
    assert list(tmp_path.iterdir()) == []


def test_a_cut_off_childs_temporary_files_go_with_its_trial_folder(tmp_path, monkeypatch):
    """A trial cut off at its limit is killed with everything it started, and none of them cleans up: gcc's `cc*.s`
    from an Inductor compile and the DataLoader workers' `pymp-*` folders stayed in /tmp after every cut-off trial.
    torch.compile's cache stays where it would have been, shared by the trials."""
    import tempfile

    from cnnpar.bench.trial import INDUCTOR_CACHE_ENV, inductor_cache_dir

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    said = tmp_path / "said.txt"
    script = textwrap.dedent(
        f"""
        import os, tempfile, time
        os.close(tempfile.mkstemp(prefix="cc", suffix=".s")[0])  # as gcc leaves its assembly
        tempfile.mkdtemp(prefix="pymp-")  # as a DataLoader worker's multiprocessing leaves its listener folder
        open({str(said)!r}, "w").write(os.environ.get({INDUCTOR_CACHE_ENV!r}, "unset"))
        print("compiling forever", flush=True)
        time.sleep(120)
        """
    )
    r = run_child({}, 2.0, log=lambda s: None, command=lambda spec, res: [sys.executable, "-c", script])
    assert r.status == CUT_OFF and "compiling forever" in r.error
    assert list(temp.iterdir()) == []
    assert said.read_text() == inductor_cache_dir() == str(temp / f"torchinductor_{__import__('getpass').getuser()}")


def test_the_inductor_cache_a_trial_is_given_is_torchs_default(tmp_path, monkeypatch):
    """trial.inductor_cache_dir spells torch's default out (importing it takes seconds): a change in torch's would
    give the trials a cache of their own, compiled from nothing, beside the one every other run uses."""
    import tempfile

    from cnnpar.bench.trial import INDUCTOR_CACHE_ENV, inductor_cache_dir

    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # torch 2.5
        from torch._inductor.runtime.runtime_utils import default_cache_dir
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    assert inductor_cache_dir() == default_cache_dir()
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "mine"))
    assert inductor_cache_dir() == str(tmp_path / "mine")


def test_tune_on_a_mac_says_that_the_apple_gpu_is_not_used(tmp_path, monkeypatch):
    """The trials' children pick the device and say nothing (trial.PARENT_ENV): the tuner's own lines say it."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    m = FakeMachine(rate=lambda c: 1000.0, cost=lambda c: 10.0)
    said: list[str] = []
    tune_mod.tune(resnet50(), 60, tmp_path / "tuned.toml", run_trial=m.run_trial, clock=m.clock, log=said.append)
    assert sum("Apple GPU (MPS)" in line for line in said) == 1


def test_tuned_toml_says_tune_measured_no_accuracy_and_names_a_kept_batch_and_precision(tmp_path):
    # a bigger batch (fewer optimizer steps an epoch, another lr) and fp16 kept as speed-ups, their accuracy never
    # measured: tuned.toml and the summary said only "best so far"
    def rate(cfg):
        return cfg.run.batch_size * (1.5 if cfg.speed.precision == "fp16" else 1.0) if cfg.run.batch_size < 256 else 1

    m = FakeMachine(rate=rate, cost=lambda c: 1.0)
    out = tmp_path / "tuned.toml"
    best, trials = m.tune(with_overrides(resnet50(), optim={"optimizer": "sgd", "lr": 0.1}), 600, out)
    assert best.run.batch_size == 128 and best.speed.precision == "fp16"
    header = next(line for line in out.read_text().splitlines() if "speed only" in line)
    assert "not accuracy" in header
    assert "batch_size=128 (batch 64 -> 128: 1/2 of the optimizer steps an epoch, lr 0.1 -> 0.2" in header
    assert "precision=fp16 (bf16 -> fp16: the step's arithmetic rounded differently; fp16's GradScaler skips" in header
    assert tune_mod.accuracy_line(trials) == header.removeprefix("# ")
    assert best.optim.lr == pytest.approx(0.2) and best.optim.lr_batch == 128  # the lr rule stays coherent


def test_tuned_toml_names_what_a_kept_batch_does_to_an_ema_average_only_where_one_is_set(tmp_path):
    # the average decays per step: a 2x batch spans 2x the images over the same steps, unsaid in the header
    def header(cfg, out):
        m = FakeMachine(rate=lambda c: c.run.batch_size if c.run.batch_size < 256 else 1, cost=lambda c: 1.0)
        m.tune(cfg, 600, out)
        return next(line for line in out.read_text().splitlines() if "speed only" in line)

    ema = header(with_overrides(resnet50(), optim={"ema": 0.99}), tmp_path / "ema.toml")
    assert "batch 64 -> 128: 1/2 of the optimizer steps an epoch" in ema
    assert "--ema 0.99 averages over the same ~100 steps, so 2x the images" in ema
    assert "--ema" not in header(resnet50(), tmp_path / "plain.toml")


def test_tuned_toml_of_pure_speed_switches_says_so(tmp_path):
    m = FakeMachine(rate=lambda c: 2000.0 if c.speed.compile == "off" else 1000.0, cost=lambda c: 1.0)
    out = tmp_path / "tuned.toml"
    best, _ = m.tune(resnet50(), 600, out)
    assert best.speed.compile == "off" and best.run.batch_size == 64
    text = out.read_text()
    assert "# speed only: tune measured images/s, not accuracy; the switches kept here train the same maths" in text


def test_a_faster_trial_whose_training_loss_is_not_finite_is_never_kept(tmp_path):
    m = FakeMachine(rate=lambda c: 2000.0 if c.speed.precision == "fp16" else 1000.0, cost=lambda c: 1.0)

    def fp16_diverges(cfg, limit):
        r = m.run_trial(cfg, limit)
        if r.status == OK:
            r.value["loss_finite"] = cfg.speed.precision != "fp16"
        return r

    out = tmp_path / "tuned.toml"
    best, trials = tune_mod.tune(resnet50(), 600, out, run_trial=fp16_diverges, clock=m.clock, log=lambda s: None)
    (fp16,) = [t for t in trials if t.switch == "precision"]
    assert fp16.status == FAILED and "not finite (diverged): not kept" in fp16.note and fp16.images_per_s == 2000
    assert best.speed.precision == "bf16" and load_toml(out).speed.precision == "bf16"


def test_a_budget_refused_says_the_seconds_left_below_the_minimum_a_trial_needs(tmp_path):
    """4.6 s left was said as "(5 s left), under the 5 s a trial needs at least": rounded up to the very minimum it
    is refused for."""
    left = tune_mod.MIN_TRIAL_S - 0.4
    budget = 10.0
    started = 100.0 - (budget * (1 - tune_mod.END_RESERVE) - left)  # the clock reads 100 with `left` seconds left
    with pytest.raises(tune_mod.BudgetTooSmall) as refused:
        tune_mod.tune(resnet50(), budget, tmp_path / "tuned.toml", clock=lambda: 100.0, started=started)
    assert f"time budget spent ({math.floor(left)} s left), under the {tune_mod.MIN_TRIAL_S:g} s" in str(refused.value)
