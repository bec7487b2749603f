"""An output folder that is a file, or lies under one, is refused before any measuring: bench, doctor and profile
measured and then ended in a FileExistsError or NotADirectoryError traceback. So is one that holds an earlier run's
results: they were written over without a word."""

from __future__ import annotations

import pytest

from cnnpar.cli import main
from cnnpar.config import Config

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

TINY = ["--device", "cpu", "--timed-steps", "2", "--repeats", "1"]


@pytest.mark.parametrize(
    "words, said",
    [
        (["bench", "--out", "afile", "--only", "baseline", *TINY], "bench --out afile: is a file"),
        (["bench", "--out-dir", "afile", "--only", "baseline", *TINY], "--out-dir afile: is a file"),
        (["bench", "--compare", "a.csv", "b.csv", "--out", "afile"], "bench --out afile: is a file"),
        (
            ["doctor", "--device", "cpu", "--report-dir", "afile/sub"],
            "--report-dir afile/sub: lies under afile, a file",
        ),
        (["profile", "--device", "cpu", "--report-dir", "afile"], "--report-dir afile: is a file"),
    ],
    ids=["bench-out", "bench-out-dir", "compare-out", "doctor", "profile"],
)
def test_an_output_folder_that_is_a_file_is_refused_before_measuring(tmp_path, monkeypatch, capsys, words, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    assert main(words) == 2
    out, err = capsys.readouterr()
    assert err.strip().endswith(f"{said}: expected a folder (or a path where one can be made)"), err
    assert "img/s" not in out  # nothing was measured
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize(
    "words, said",
    [
        (["--target", "0.9", "--only", "baseline"], "bench --target: read only with --time-to-accuracy: expected no "
         "--target with a ladder"),
        (["--time-to-accuracy", "--target", "0.9", "--budget-s", "1"], "bench --budget-s: read only with --claims or "
         "a ladder: expected no --budget-s with --time-to-accuracy"),
        (["--compare", "a.csv", "b.csv", "--only", "baseline"], "bench --only: read only with --claims or a ladder: "
         "expected no --only with --compare"),
    ],
    ids=["target", "budget", "only"],
)  # fmt: skip
def test_a_bench_flag_its_mode_does_not_read_is_refused(tmp_path, monkeypatch, capsys, words, said):
    """--target beside a ladder ran the ladder; --only and --budget-s beside --time-to-accuracy were dropped."""
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--device", "cpu", *words]) == 2
    assert capsys.readouterr().err.strip() == f"cnnpar: error: {said}"
    assert not list(tmp_path.iterdir())


def _nothing_measured(monkeypatch) -> None:
    """Every command's first step past its output checks fails the test: a refusal must come before it."""
    import cnnpar.bench.tune as tune
    import cnnpar.doctor.profile as profile
    import cnnpar.doctor.run as doctor

    for module, first in ((doctor, "init_distributed"), (doctor, "load_data"), (profile, "build_trainer")):
        monkeypatch.setattr(module, first, lambda *a, **k: pytest.fail("measured before refusing"))
    monkeypatch.setattr(tune.Tuner, "start", lambda *a: pytest.fail("a trial started before refusing"))


EXPECTED_FOLDER = "expected a new or empty folder, or no --report-dir (a new folder under --out-dir for each run)"


@pytest.mark.parametrize(
    "words, earlier, said",
    [
        (["doctor", "--report-dir", "rep"], ["report.md", "doctor.json"], "doctor --report-dir rep: already holds an "
         f"earlier doctor's results (report.md, doctor.json): {EXPECTED_FOLDER}"),
        # a train run folder: the doctor's --monitor would write over the run's own telemetry
        (["doctor", "--report-dir", "rep"], ["metrics.csv", "telemetry.csv"], "doctor --report-dir rep: already "
         f"holds an earlier doctor's results (telemetry.csv): {EXPECTED_FOLDER}"),
        (["profile", "--report-dir", "rep"], ["trace_rank1.json", "notes.txt"], "profile --report-dir rep: already "
         f"holds an earlier profile's results (trace_rank1.json): {EXPECTED_FOLDER}"),
        (["tune", "--out", "rep/tuned.toml"], ["tuned.toml", "tuned.csv"], "tune --out rep/tuned.toml: already holds "
         "an earlier tune's results (tuned.toml, tuned.csv): expected another --out or --config rep/tuned.toml (to "
         "re-tune that config in place), or no --out (a new folder under --out-dir for each run)"),
        (["tune", "--out", "rep/tuned.toml"], ["tuned.csv"], "tune --out rep/tuned.toml: already holds an earlier "
         "tune's results (tuned.csv): expected another --out, or no --out (a new folder under --out-dir for each run)"),
    ],
    ids=["doctor", "doctor-over-a-run", "profile", "tune", "tune-trials-only"],
)  # fmt: skip
def test_an_output_place_holding_an_earlier_runs_results_is_refused_before_measuring(
    tmp_path, monkeypatch, capsys, words, earlier, said
):
    """doctor --report-dir, profile --report-dir and tune --out (tuned.toml in the current folder by default) wrote
    over an earlier run's report, traces or tuned config without a word, after measuring for minutes; bench --out
    was refused so already."""
    monkeypatch.chdir(tmp_path)
    _nothing_measured(monkeypatch)
    (tmp_path / "rep").mkdir()
    for name in earlier:
        (tmp_path / "rep" / name).write_text(f"an earlier {name}\n")
    assert main([*words, "--device", "cpu"]) == 2
    assert capsys.readouterr().err == f"cnnpar: error: {said}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # nothing else made (no runs/ either)
    assert {p.name: p.read_text() for p in (tmp_path / "rep").iterdir()} == {n: f"an earlier {n}\n" for n in earlier}


def test_tune_re_tunes_its_config_in_place_where_out_is_that_config(tmp_path, monkeypatch, capsys):
    """`cnnpar tune --config T --out T` (with T's trials beside it) refines a tuned config and rewrites both, as
    asked: not refused as an earlier tune's results. (A budget of 0.001 s: past --out's checks, the first trial
    ('start') cannot start, and T and its trials are kept.)"""
    from cnnpar.config import dumps_toml

    monkeypatch.chdir(tmp_path)
    tuned = tmp_path / "t.toml"
    tuned.write_text(dumps_toml(Config()))
    (tmp_path / "t.csv").write_text("the trials that made t.toml\n")
    assert main(["tune", "--config", str(tuned), "--out", str(tuned), "--budget-s", "0.001"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "cnnpar: error: tune --budget-s 0.001: the first trial ('start', the config as given) could "
    ), err
    assert tuned.read_text() == dumps_toml(Config())
    assert (tmp_path / "t.csv").read_text() == "the trials that made t.toml\n"


@pytest.fixture
def read_only_ro(tmp_path, monkeypatch):
    """tmp_path/ro as a read-only file system would have it: a file made in it (or in a folder under it) raises
    EROFS. Simulated where the write checks make their trial file (`_create_temp`): tests may not mount."""
    import errno

    from cnnpar.report import files

    ro = tmp_path / "ro"
    ro.mkdir()
    made = files._create_temp

    def create_temp(folder, name):
        if ro in (folder.resolve(), *folder.resolve().parents):
            raise OSError(errno.EROFS, "Read-only file system", str(folder / name))
        return made(folder, name)

    monkeypatch.setattr(files, "_create_temp", create_temp)
    return ro


def _nothing_trained_or_benched(monkeypatch) -> None:
    """train's and bench's first steps past their output checks fail the test too."""
    import cnnpar.bench.run as bench
    import cnnpar.engine.trainer as trainer

    _nothing_measured(monkeypatch)
    monkeypatch.setattr(trainer, "Trainer", lambda *a, **k: pytest.fail("a Trainer was built before refusing"))
    monkeypatch.setattr(bench, "_measurement_setup", lambda *a, **k: pytest.fail("measured before refusing"))


FOLDER_CANNOT = "cannot be written (Read-only file system): expected a folder where files can be made"
FILE_CANNOT = "cannot be written (Read-only file system): expected a path in a folder where files can be made"


@pytest.mark.parametrize(
    "words, said",
    [
        (["train", "--out-dir", "ro"], f"--out-dir ro: {FOLDER_CANNOT}"),
        (["train", "--out-dir", "ro/sub/deeper"], f"--out-dir ro/sub/deeper: {FOLDER_CANNOT}"),
        (["doctor", "--report-dir", "ro/doc"], f"doctor --report-dir ro/doc: {FOLDER_CANNOT}"),
        (["doctor", "--out-dir", "ro"], f"--out-dir ro: {FOLDER_CANNOT}"),
        (["bench", "--out", "ro/b", "--only", "baseline", *TINY], f"bench --out ro/b: {FOLDER_CANNOT}"),
        (["bench", "--out-dir", "ro", "--only", "baseline", *TINY], f"--out-dir ro: {FOLDER_CANNOT}"),
        (["tune", "--out", "ro/t/tuned.toml"], f"tune --out ro/t/tuned.toml: {FILE_CANNOT}"),
        # the folder is there: the whole start trial ran, then a traceback at the first write
        (["tune", "--out", "ro/tuned.toml"], f"tune --out ro/tuned.toml: {FILE_CANNOT}"),
        (["tune", "--out-dir", "ro"], f"--out-dir ro: {FOLDER_CANNOT}"),
        (["profile", "--report-dir", "ro/p"], f"profile --report-dir ro/p: {FOLDER_CANNOT}"),
        (["profile", "--out-dir", "ro"], f"--out-dir ro: {FOLDER_CANNOT}"),
    ],
    ids=[
        "train", "train-deeper", "doctor-report-dir", "doctor-out-dir", "bench-out", "bench-out-dir", "tune-new-folder",
        "tune-folder-there", "tune-out-dir", "profile-report-dir", "profile-out-dir",
    ],
)  # fmt: skip
def test_a_read_only_output_folder_is_one_line_before_any_work(
    tmp_path, monkeypatch, capsys, read_only_ro, words, said
):
    """A read-only output folder (or one under a read-only folder) ended in an OSError traceback at its mkdir or first
    write, after the bench's peak measurement or the tune's start trial; now refused first, as predict's --out is."""
    monkeypatch.chdir(tmp_path)
    _nothing_trained_or_benched(monkeypatch)
    assert main([*words, "--device", "cpu", "--data", "synthetic", "--image-shape", "1x8x8"]) == 2
    assert capsys.readouterr().err == f"cnnpar: error: {said}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro"]  # nothing made (no runs/ either)
    assert not list(read_only_ro.iterdir())


def _a_saved_run(folder) -> None:
    """A run folder a resume takes: its config.toml and a checkpoint (never read: the refusal comes first)."""
    from cnnpar.config import dumps_toml

    (folder / "ckpt").mkdir(parents=True)
    (folder / "ckpt" / "last.pt").write_bytes(b"")
    (folder / "config.toml").write_text(dumps_toml(Config()))


@pytest.mark.parametrize(
    "words, said",
    [
        (["--resume", "ro/s"], "--resume ro/s: the run folder ro/s"),
        (["--resume", "auto", "--out-dir", "ro", "--name", "s"], "--resume auto: the run folder ro/s"),
    ],
    ids=["resume-path", "resume-auto"],
)
def test_a_resume_into_a_read_only_run_folder_is_one_line_before_any_work(
    tmp_path, monkeypatch, capsys, read_only_ro, words, said
):
    """A resume writes its records and checkpoints into its run folder: a read-only one ended in a traceback at
    resumes.csv, after the data was loaded and the checkpoint read."""
    monkeypatch.chdir(tmp_path)
    _a_saved_run(read_only_ro / "s")
    _nothing_trained_or_benched(monkeypatch)
    assert main(["train", *words]) == 2
    assert capsys.readouterr().err == (
        f"cnnpar: error: {said} cannot be written (Read-only file system): expected a run folder where files can be "
        "made (a run writes its checkpoints and records there)\n"
    )
    assert sorted(p.name for p in (read_only_ro / "s").iterdir()) == ["ckpt", "config.toml"]


# the three commands that train into an existing run folder s: its checks run before any work in each
EVERY_WAY_INTO_RUN_S = pytest.mark.parametrize(
    "words, said",
    [
        (["--resume", "s"], "--resume s"),
        (["--resume", "auto", "--name", "s", "--out-dir", "."], "--resume auto"),
        (["--name", "s", "--out-dir", "."], "--name s"),
    ],
    ids=["resume-path", "resume-auto", "name-there"],
)


@EVERY_WAY_INTO_RUN_S
def test_a_read_only_checkpoint_folder_in_a_writable_run_folder_is_one_line_before_any_work(
    tmp_path, monkeypatch, capsys, words, said
):
    """Only the run folder was tried: with its ckpt/ read-only, a resume trained a whole epoch and then failed at the
    first checkpoint. Read-only simulated as in `read_only_ro` (tests may run as root, where chmod blocks nothing)."""
    import errno

    from cnnpar.report import files

    monkeypatch.chdir(tmp_path)
    _a_saved_run(tmp_path / "s")
    ckpt = (tmp_path / "s" / "ckpt").resolve()
    made = files._create_temp

    def create_temp(folder, name):
        if folder.resolve() == ckpt:
            raise OSError(errno.EROFS, "Read-only file system", str(folder / name))
        return made(folder, name)

    monkeypatch.setattr(files, "_create_temp", create_temp)
    _nothing_trained_or_benched(monkeypatch)
    assert main(["train", *words, "--device", "cpu", "--data", "synthetic", "--image-shape", "1x8x8"]) == 2
    assert capsys.readouterr().err == (
        f"cnnpar: error: {said}: the checkpoint folder s/ckpt cannot be written (Read-only file system): expected a "
        "folder where files can be made (a run writes its checkpoints there)\n"
    )
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["ckpt", "config.toml"]


@EVERY_WAY_INTO_RUN_S
def test_a_checkpoint_place_that_is_a_file_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, words, said):
    """A run folder's `ckpt` that is a file was never probed: `--resume s` said "no finished epoch" and sent the user
    to --resume auto, which (as `--name s`) loaded the data and ended in a FileExistsError traceback at its mkdir."""
    from cnnpar.config import dumps_toml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "config.toml").write_text(dumps_toml(Config()))
    (tmp_path / "s" / "ckpt").write_text("not a folder")
    _nothing_trained_or_benched(monkeypatch)
    assert main(["train", *words, "--device", "cpu", "--data", "synthetic", "--image-shape", "1x8x8"]) == 2
    assert capsys.readouterr().err == (
        f"cnnpar: error: {said}: s/ckpt is a file: expected a folder there (a run writes its checkpoints in ckpt/); "
        "move it away, or choose another --name\n"
    )
    assert (tmp_path / "s" / "ckpt").read_text() == "not a folder"


HOLD = """
import sys
from cnnpar.bench.tune import tuned_file
from cnnpar.report.files import output_folder
what, given = sys.argv[1:]
with (tuned_file(given, "runs", "cnn3") if what == "tune" else output_folder(given, "", "")):
    print("held", flush=True)
    sys.stdin.read()  # until the test is done with it
"""


@pytest.fixture
def held_by_another(tmp_path):
    """Another cnnpar command started at the same time, past its output checks (nothing written yet) and not yet
    writing: the race of two commands given one output is forced, not waited for."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    started = []

    def hold(what: str, given: str) -> subprocess.Popen:
        child = subprocess.Popen(
            [sys.executable, "-c", HOLD, what, given], cwd=tmp_path, env=env, stdin=subprocess.PIPE, text=True,
            stdout=subprocess.PIPE,
        )  # fmt: skip
        started.append(child)
        assert child.stdout.readline() == "held\n"
        return child

    yield hold
    for child in started:
        if child.poll() is None:
            child.communicate("")


@pytest.mark.parametrize(
    "words, what, given",
    [
        (["bench", "--out", "rep", "--only", "baseline", *TINY], "bench", "rep"),
        (["tune", "--out", "rep/tuned.toml", "--budget-s", "0.001"], "tune", "rep/tuned.toml"),
    ],
    ids=["bench", "tune"],
)
def test_an_output_another_command_is_writing_now_is_refused_naming_it(
    tmp_path, monkeypatch, capsys, held_by_another, words, what, given
):
    """Two benches (or tunes) given one --out at the same time each found it free of results, then both wrote into
    it: one's rows over the other's, tuned.toml from one tune and tuned.csv from the other, and a bench that failed
    removed the other's results as its own. The second is refused in one line naming the first's pid, before any
    trial (bench: after its set-up, before any timed step), and leaves the first's folder as it was."""
    monkeypatch.chdir(tmp_path)
    _nothing_measured(monkeypatch)
    pid = held_by_another(what, given).pid
    there = sorted(p.name for p in (tmp_path / "rep").iterdir())
    assert main(words) == 2
    said = f"tune --out {given}" if what == "tune" else given
    expected = f"cnnpar: error: {said}: another cnnpar command (pid {pid}) is writing there now: expected it to end "
    assert capsys.readouterr().err == expected + "first, or another output\n"
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == there  # its claim only: nothing written, kept


def test_an_output_of_a_command_that_ended_is_free_again(tmp_path, held_by_another):
    """The claim goes with its command: one that ended leaves no file behind, and one killed outright (SIGKILL: no
    clean-up ran) leaves a file whose flock went with it, which blocks nobody."""
    import signal

    from cnnpar.report.files import output_folder

    rep = tmp_path / "rep"
    held_by_another("bench", str(rep)).communicate("")
    assert list(rep.iterdir()) == []
    killed = held_by_another("bench", str(rep))
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert [p.name for p in rep.iterdir()] == [".cnnpar-output.lock"]
    with output_folder(str(rep), "", "") as folder:
        (folder / "ladder.csv").write_text("rows\n")
    assert [p.name for p in rep.iterdir()] == ["ladder.csv"]


def test_a_claim_taken_as_its_ended_holder_removes_the_file_is_taken_again_on_the_file_there(tmp_path, monkeypatch):
    """A holder that ended removes its claim file between another command's open of it and that command's flock:
    the flock then held a file no later command could find, and a third command given the output took it too. The
    race is forced: the file goes just before the first flock."""
    import fcntl
    import types

    from cnnpar.report import files

    claim = tmp_path / ".cnnpar-output.lock"
    gone = []

    def flock(fd, op):
        if not gone:
            gone.append(claim.unlink())  # the ended holder's clean-up, at the worst moment
        fcntl.flock(fd, op)

    monkeypatch.setattr(
        files, "fcntl", types.SimpleNamespace(flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB)
    )
    claim.write_text("")  # the ended holder's
    with files.output_held(claim, "rep"):
        with pytest.raises(files.OutputInUse, match=r"^rep: another cnnpar command \(pid \d+\) is writing there now"):
            with files.output_held(claim, "rep"):
                pass
    assert not claim.exists()
