"""doctor, bench, tune and profile on a disk that fills while they write their results: a traceback (exit 1) after
all the measuring, and a partial doctor report that a re-run into the same --report-dir refused as an earlier
doctor's. Now one line naming the file, why and what is kept, exit 2 (report/files.write_errors_explained)."""

from __future__ import annotations

import errno
import json
import tomllib

import pytest

from cnnpar.cli import main
from cnnpar.report.files import read_csv

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL_DATA = ["--data", "synthetic", "--image-shape", "1x8x8", "--synthetic-samples", "30", "--workers", "0",
              "--model", "cnn3", "--device", "cpu", "--batch-size", "16"]  # fmt: skip
DOCTOR = ["doctor", *SMALL_DATA, "--warmup-steps", "1", "--measure-steps", "2", "--try", "0"]
BENCH = ["bench", *SMALL_DATA, "--only", "baseline", "--warmup-steps", "1", "--timed-steps", "2", "--repeats", "1"]
PROFILE = ["profile", *SMALL_DATA, "--epochs", "1", "--no-progress", "--prof-wait", "0", "--prof-warmup", "1",
           "--prof-active", "1"]  # fmt: skip


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def the_error(capsys) -> str:
    """stderr's one error line, checked to be the only one and to come with no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.startswith("cnnpar: error: ")]
    assert len(lines) == 1 and err.strip().splitlines()[-1] == lines[0], err
    return lines[0].removeprefix("cnnpar: error: ")


def test_a_doctor_whose_picture_finds_the_disk_full_keeps_nothing_a_rerun_refuses(tmp_path, monkeypatch, capsys):
    """phases.csv and recommendations.csv were written, then a traceback at the picture; the run again (room made)
    was refused: --report-dir "already holds an earlier doctor's results (phases.csv, recommendations.csv)"."""
    from cnnpar.doctor import render

    rep = tmp_path / "full" / "doc"
    with monkeypatch.context() as patch:
        patch.setattr(render, "plot_phases", full_disk)
        assert main([*DOCTOR, "--report-dir", str(rep)]) == 2
    line = the_error(capsys)
    assert line.startswith(f"{rep / 'doctor.png'}: cannot be written (No space left on device; ") and (
        "MB free on its disk" in line
    )
    assert line.endswith(f"): {render.NOT_WRITTEN}")
    assert not (tmp_path / "full").exists()  # the folders it made, with the CSVs written before the picture
    assert main([*DOCTOR, "--report-dir", str(rep)]) == 0  # the same command, once there is room
    assert (rep / "report.md").is_file() and (rep / "doctor.png").is_file()


def test_a_doctor_report_cut_short_in_a_folder_that_was_there_leaves_it_empty(tmp_path, monkeypatch, capsys):
    from cnnpar.doctor import render

    rep = tmp_path / "doc"
    rep.mkdir()
    (rep / "notes.txt").write_text("the user's\n")
    monkeypatch.setattr(render, "write_text_atomic", full_disk)  # report.md, the last file
    assert main([*DOCTOR, "--report-dir", str(rep), "--monitor"]) == 2
    assert the_error(capsys).startswith(f"{rep / 'report.md'}: cannot be written (No space left on device; ")
    assert sorted(p.name for p in rep.iterdir()) == ["notes.txt"]  # no CSV, JSON, PNG nor telemetry of its own


@pytest.mark.parametrize("fails", ["throughput.png", "ladder.csv"])
def test_a_bench_whose_results_find_the_disk_full_says_whether_its_rows_are_kept(tmp_path, monkeypatch, capsys, fails):
    from cnnpar.bench import output

    out = tmp_path / "full" / "b"
    monkeypatch.setattr(output, "_save_figure" if fails.endswith(".png") else "write_csv_atomic", full_disk)
    assert main([*BENCH, "--out", str(out)]) == 2
    line = the_error(capsys)
    assert line.startswith(f"{out / fails}: cannot be written (No space left on device; ")
    if fails == "ladder.csv":
        assert line.endswith(f"): {output.ROOM}; the rows measured are not saved")
        assert not (tmp_path / "full").exists()  # nothing of it worth keeping: the folders it made are removed
        return
    assert line.endswith(f"): {output.ROOM}; the rows measured are kept, whole, in {out / 'ladder.csv'}")
    assert [r["name"] for r in read_csv(out / "ladder.csv")] == ["baseline"]
    assert sorted(p.name for p in out.iterdir()) == ["ladder.csv", "ladder.md"]


def test_a_tune_that_finds_the_disk_full_mid_search_says_its_files_are_whole(tmp_path, monkeypatch, capsys):
    """tuned.toml and tuned.csv of the start were written, then a traceback at the next improvement's write."""
    import cnnpar.bench.tune as tune_mod
    from tests.unit.test_tune import FakeMachine

    # each trial faster than the one before (the batch is typed: no batch trials), so the first after the start is kept
    machine = FakeMachine(rate=lambda cfg: 100.0 * len(machine.calls), cost=lambda cfg: 0.0)
    monkeypatch.setattr(tune_mod, "child_trial", lambda steps, repeats, log: machine.run_trial)
    writes = []
    real_write = tune_mod.write_text_atomic

    def second_write_fails(path, text):
        writes.append(path)
        if len(writes) == 2:  # the first kept trial's: the start's files are on disk
            full_disk()
        real_write(path, text)

    monkeypatch.setattr(tune_mod, "write_text_atomic", second_write_fails)
    out = tmp_path / "t" / "tuned.toml"
    words = ["tune", *SMALL_DATA, "--budget-s", "100000", "--repeats", "2", "--out", str(out)]
    assert main(words) == 2
    line = the_error(capsys)
    assert line.startswith(f"{out}: cannot be written (No space left on device; ")
    csv = out.with_suffix(".csv")
    assert line.endswith(f"): {tune_mod.ROOM}; {out} and {csv} stay as before, whole")
    assert tomllib.loads(out.read_text())["run"]["batch_size"] == 16  # the start's, whole
    assert [r["status"] for r in read_csv(csv)] == ["start"]


def test_a_profile_whose_tables_find_the_disk_full_leaves_its_folder_as_it_was(tmp_path, monkeypatch, capsys):
    from cnnpar.report import profiler

    rep = tmp_path / "prof"
    rep.mkdir()  # there before: the trace written before the tables goes, so a re-run into it is not refused
    monkeypatch.setattr(profiler, "write_text_atomic", full_disk)
    assert main([*PROFILE, "--report-dir", str(rep)]) == 2
    line = the_error(capsys)
    assert line.startswith(f"{rep / 'top_ops_rank0.txt'}: cannot be written (No space left on device; ")
    assert line.endswith(f"): {profiler.NOT_WRITTEN}")
    assert list(rep.iterdir()) == []


def test_a_tune_stopped_on_a_full_disk_says_both_the_stop_and_what_is_kept(tmp_path, monkeypatch, capsys):
    """A SIGTERM whose last write found the disk full ended with the write's error alone (exit 2): nothing said that
    the signal had stopped the tune, and a scheduler read a failure, not the stop (143)."""
    import cnnpar.bench.tune as tune_mod
    from cnnpar.errors import Terminated
    from tests.unit.test_tune import FakeMachine

    machine = FakeMachine(rate=lambda cfg: 100.0 * len(machine.calls), cost=lambda cfg: 0.0)

    def stopped_at_the_third(cfg, limit):
        if len(machine.calls) == 2:  # the start's and one kept trial's files are on disk
            monkeypatch.setattr(tune_mod, "write_text_atomic", full_disk)  # the disk fills by the stop's write
            raise Terminated
        return machine.run_trial(cfg, limit)

    monkeypatch.setattr(tune_mod, "child_trial", lambda steps, repeats, log: stopped_at_the_third)
    out = tmp_path / "t" / "tuned.toml"
    csv = out.with_suffix(".csv")
    assert main(["tune", *SMALL_DATA, "--budget-s", "100000", "--repeats", "2", "--out", str(out)]) == 143
    said = capsys.readouterr()
    assert "Traceback" not in said.err and "cnnpar: error" not in said.err
    assert said.err.strip().splitlines()[-1] == "cnnpar: stopped (SIGTERM)"
    line = said.out.strip().splitlines()[-1]
    assert line.startswith(f"tune: stopped; its last results could not be written: {out}: cannot be written (No ")
    assert line.endswith(f"): {tune_mod.ROOM}; {out} and {csv} stay as before, whole")
    assert [r["status"] for r in read_csv(csv)] == ["start", "skipped", "kept"]  # the last whole pair (batch: typed)


def fake_world(args, world_size, threads, result) -> dict:
    """ddp_scaling.launch's result for one world size, without launching torchrun."""
    resolved = {k: "" for k in ("precision", "channels_last", "compile", "pin_memory", "prefetch_stream")}
    return {
        "world_size": world_size, "images_per_s": 100.0 * world_size, "images_per_s_per_device": 100.0,
        "step_ms": 10.0, "data_wait_share": 0.1, "peak_mem_mb": 1.0, "peak_mem_kind": "rss", "step": "plain",
        "environment": {"device": "cpu", "torch": "x", "cuda": "", "date": "today"},
        "resolved": {**resolved, "resident": False, "ddp": None},
    }  # fmt: skip


@pytest.mark.parametrize("fails", ["ddp.csv", "ddp.json"])
def test_a_bench_whose_ddp_rows_find_the_disk_full_says_what_is_kept(tmp_path, monkeypatch, capsys, fails):
    """ddp.csv or ddp.json on a full disk ended `cnnpar bench --ddp` in a traceback after every world size ran."""
    from cnnpar.bench import ddp_scaling, output
    from cnnpar.report import files

    monkeypatch.setattr(ddp_scaling, "launch", fake_world)
    monkeypatch.setattr(files, "write_csv_atomic" if fails == "ddp.csv" else "write_json_atomic", full_disk)
    out = tmp_path / "b"
    assert main([*BENCH, "--ddp", "1,2", "--out", str(out)]) == 2
    line = the_error(capsys)
    assert line.startswith(f"{out / fails}: cannot be written (No space left on device; ")
    ddp_kept = f"kept, whole, in {out / 'ddp.csv'}" if fails == "ddp.json" else "not saved"
    assert line.endswith(f"): {output.ROOM}; the DDP rows measured are {ddp_kept}; the ladder's results are kept, "
                         f"whole, in {out}")  # fmt: skip
    assert [r["name"] for r in read_csv(out / "ladder.csv")] == ["baseline"]
    assert (out / "ddp.csv").is_file() == (fails == "ddp.json")


def launch_ending_at(world_size: int, ending: BaseException):
    """ddp_scaling.launch as fake_world, but `ending` raised at `world_size` (a failed launch, a stop)."""

    def launch(args, n, threads, result) -> dict:
        if n == world_size:
            raise ending
        return fake_world(args, n, threads, result)

    return launch


def test_a_bench_whose_later_ddp_world_size_fails_keeps_the_rows_before_it(tmp_path, monkeypatch, capsys):
    """`cnnpar bench --ddp 1,2,4` whose world size 4 failed (out of memory, a timeout) threw away the rows of 1 and 2,
    measured already: no ddp.csv or ddp.json. Now they are written, the JSON names the failure, the bench exits 1
    and its line says which rows were kept."""
    from cnnpar.bench import ddp_scaling

    timed_out = SystemExit("ddp_scaling: world size 4 timed out after 1200 s: stopped with its processes")
    monkeypatch.setattr(ddp_scaling, "launch", launch_ending_at(4, timed_out))
    out = tmp_path / "b"
    assert main([*BENCH, "--ddp", "1,2,4", "--out", str(out)]) == 1
    csv, js = out / "ddp.csv", out / "ddp.json"
    assert capsys.readouterr().err.endswith(
        "bench: DDP rows failed: ddp_scaling: world size 4 timed out after 1200 s: stopped with its processes; the "
        f"rows of world sizes 1,2, measured before it, are kept in {csv} and {js}\n"
    )
    rows = read_csv(csv)
    kept = [(r["world_size"], r["speedup"], r["scaling_efficiency"]) for r in rows]
    assert kept == [("1", "1.0", "1.0"), ("2", "2.0", "1.0")]  # speed-ups over world size 1, as in a whole run
    report = json.loads(js.read_text())
    assert [r["world_size"] for r in report["rows"]] == [1, 2]
    why = "world size 4 timed out after 1200 s: stopped with its processes"
    assert report["ended_at"] == {"world_size": 4, "why": why}
    assert [r["name"] for r in read_csv(out / "ladder.csv")] == ["baseline"]  # the ladder's files, as before


def test_a_later_ddp_failure_on_a_full_disk_says_both_in_one_line(tmp_path, monkeypatch, capsys):
    """World size 2 failed, then ddp.csv found the disk full: the one error line (exit 2) named the disk alone, and
    the launch's failure went unsaid."""
    from cnnpar.bench import ddp_scaling, output
    from cnnpar.report import files

    failed = SystemExit("ddp_scaling: world size 2 failed: torchrun exited 1")
    monkeypatch.setattr(ddp_scaling, "launch", launch_ending_at(2, failed))
    monkeypatch.setattr(files, "write_csv_atomic", full_disk)
    out = tmp_path / "b"
    assert main([*BENCH, "--ddp", "1,2", "--out", str(out)]) == 2
    assert the_error(capsys).endswith(
        f"): {output.ROOM}; the DDP rows measured are not saved; before that, world size 2 failed: torchrun exited 1; "
        f"the ladder's results are kept, whole, in {out}"
    )
    assert not (out / "ddp.json").exists()


def test_a_bench_stopped_during_a_later_ddp_world_size_keeps_the_rows_before_it(tmp_path, monkeypatch, capsys):
    """A SIGTERM while world size 2 ran threw away world size 1's row, measured already, as the ladder's rows so
    far are not. Now it is written, the JSON names the stop, and the bench stops as before (143, its stop line)."""
    from cnnpar.bench import ddp_scaling
    from cnnpar.errors import Terminated

    monkeypatch.setattr(ddp_scaling, "launch", launch_ending_at(2, Terminated()))
    out = tmp_path / "b"
    assert main([*BENCH, "--ddp", "1,2", "--out", str(out)]) == 143
    csv, js = out / "ddp.csv", out / "ddp.json"
    assert capsys.readouterr().err.endswith(
        "ddp_scaling: world size 2 stopped (SIGTERM) before its rows were measured; the rows of world size 1, "
        f"measured before it, are kept in {csv} and {js}\ncnnpar: stopped (SIGTERM)\n"
    )
    assert [r["world_size"] for r in read_csv(csv)] == ["1"]
    why = "world size 2 stopped (SIGTERM) before its rows were measured"
    assert json.loads(js.read_text())["ended_at"] == {"world_size": 2, "why": why}


def test_ddp_scaling_run_on_its_own_on_a_full_disk_says_it_in_one_line(tmp_path, monkeypatch, capsys):
    """`python -m cnnpar.bench.ddp_scaling` (its `__main__` calls `entry`) ended in a UserError traceback where
    `cnnpar bench --ddp` says the same in one line and exits 2."""
    from cnnpar.bench import ddp_scaling
    from cnnpar.report import files

    monkeypatch.setattr(ddp_scaling, "launch", fake_world)
    monkeypatch.setattr(files, "write_csv_atomic", full_disk)
    prefix = tmp_path / "ddp"
    monkeypatch.setattr("sys.argv", ["ddp_scaling", "--device", "cpu", "--out", str(prefix)])
    assert ddp_scaling.entry() == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"ddp_scaling: error: {prefix}.csv: cannot be written (No space left on device; ")
