"""A resumed run keeps the switches its user set and resolves again only what was "auto" (the run's
config.toml says which: a `# requested:` line stands beside every field that was resolved)."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from cnnpar.cliargs import stored_run_config
from cnnpar.config import Config
from cnnpar.dist import DistInfo
from cnnpar.engine.resolved import read_requested, requested_lines
from cnnpar.engine.trainer import Trainer
from cnnpar.presets import with_overrides

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

CPU = DistInfo(0, 0, 1, torch.device("cpu"))


def test_a_run_resumed_keeps_an_explicit_precision_and_layout_and_re_resolves_the_autos(tmp_path):
    cfg = with_overrides(
        Config(),
        data={"source": "digits"},
        model={"name": "cnn3"},
        speed={"device": "cpu", "precision": "fp32", "channels_last": "off"},  # chosen; compile etc. stay auto
        run={"epochs": 1, "batch_size": 64, "max_steps": 2, "out_dir": str(tmp_path), "name": "r",
             "progress": False, "tensorboard": False},
    )  # fmt: skip
    Trainer(cfg, CPU, log=lambda *a, **k: None).fit()
    text = (tmp_path / "r" / "config.toml").read_text()
    assert ("speed", "compile") in read_requested(text) and ("speed", "precision") not in read_requested(text)
    _, resumed = stored_run_config("auto", str(tmp_path), "r")
    assert (resumed.speed.precision, resumed.speed.channels_last) == ("fp32", "off")  # as the user set them
    assert (resumed.speed.compile, resumed.speed.cuda_graphs, resumed.speed.stem_space_to_depth) == (
        "auto",
        "auto",
        "auto",
    )
    assert resumed.speed.device == "cpu" and resumed.data.pin_memory == "auto"


def test_a_requested_value_the_run_could_not_keep_is_asked_for_again_and_an_old_file_resets_to_auto(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    body = '[speed]\nprecision = "bf16"\ncuda_graphs = "off"\n[data]\nworkers = 3\n'
    # graphs asked on but not applicable there (so stored off), workers auto (-1) resolved to 3
    (run / "config.toml").write_text(
        "# requested: speed.cuda_graphs = 'on'\n# requested: data.workers = -1\n# requested: run.batch_size = auto\n"
        + body
    )
    _, resumed = stored_run_config("auto", str(tmp_path), "r")
    assert (resumed.speed.cuda_graphs, resumed.data.workers, resumed.speed.precision) == ("on", -1, "bf16")
    (run / "config.toml").write_text(body)  # written before requested lines existed: nothing known, so auto
    _, resumed = stored_run_config("auto", str(tmp_path), "r")
    assert (resumed.speed.cuda_graphs, resumed.data.workers, resumed.speed.precision) == ("auto", -1, "auto")
    assert read_requested("# requested: run.batch_size = auto\n# requested: x.y = <object>\n") == {
        ("run", "batch_size"): 0
    }


def test_a_record_says_workers_auto_as_the_user_typed_it_and_resumes_at_auto_as_an_older_record_does(tmp_path):
    """The default --workers auto was recorded as `# requested: data.workers = -1`, the number that stands for it;
    the record says `auto` now, beside the count it became, and reads back as -1 (auto), not the 0 of the other
    automatic counts (--workers 0 is no worker process). An older record's -1 still resumes at auto."""
    requested = Config()
    resolved = replace(requested, data=replace(requested.data, workers=3))
    lines = requested_lines(requested, resolved)
    assert lines == ["# requested: data.workers = auto", "# resolved: data.workers = 3"]
    assert read_requested("\n".join(lines)) == {("data", "workers"): -1}
    run = tmp_path / "r"
    run.mkdir()
    for said in ("auto", "-1"):  # this cnnpar's record, and one written before it
        (run / "config.toml").write_text(f"# requested: data.workers = {said}\n[data]\nworkers = 3\n")
        _, resumed = stored_run_config("auto", str(tmp_path), "r")
        assert resumed.data.workers == -1, said
    explicit = replace(requested, data=replace(requested.data, workers=2000))  # capped to the cores
    assert requested_lines(explicit, resolved) == ["# requested: data.workers = 2000", "# resolved: data.workers = 3"]


def test_a_record_older_than_the_requested_lines_resumes_at_its_checkpoints_image_size(tmp_path):
    """An older cnnpar (5bfa0df) trained a folder of 40x48 photos at 224, its automatic size then, and wrote
    image_size = 0 without requested lines: resolved again by today's rule (the photos' own 40), the resume was
    refused with a line asking for the --image-size it had not given. The checkpoint's size is the run's."""
    run = tmp_path / "r"
    (run / "ckpt").mkdir(parents=True)
    (run / "config.toml").write_text('[data]\nsource = "photos"\nimage_size = 0\n')
    _, resumed = stored_run_config("auto", str(tmp_path), "r")
    assert resumed.data.image_size == 0  # no checkpoint yet (killed before its first): auto, as it started
    for shape, side in (([3, 224, 224], 224), ([1, 28, 32], 0)):  # a non-square array's own shape stays auto
        torch.save({"meta": {"image_shape": shape}}, run / "ckpt" / "last.pt")
        _, resumed = stored_run_config("auto", str(tmp_path), "r")
        assert resumed.data.image_size == side


def test_an_older_record_in_a_folder_not_named_in_utf8_resumes_at_its_checkpoints_image_size(tmp_path):
    """The same record in a folder whose name is not UTF-8 (latin-1's café, or a UTF-8 name read under LC_ALL=C):
    torch's mmap refuses the name, the checkpoint read as telling no size, and the resume was refused as before."""
    run = tmp_path / "caf\udce9"
    (run / "ckpt").mkdir(parents=True)
    (run / "config.toml").write_text('[data]\nsource = "photos"\nimage_size = 0\n')
    torch.save({"meta": {"image_shape": [3, 224, 224]}}, run / "ckpt" / "last.pt")
    _, resumed = stored_run_config("auto", str(tmp_path), run.name)
    assert resumed.data.image_size == 224


def _parsed(*words: str) -> Config:
    from cnnpar.cli import build_parser
    from cnnpar.cliargs import config_from_args

    return config_from_args(build_parser().parse_args(["train", *words]))


def _record(tmp_path, resume: str) -> str:
    """The config.toml of run r4 once it was resumed (`resume` is how its last attempt started)."""
    run = tmp_path / "r4"
    run.mkdir()
    (run / "config.toml").write_text(f'[run]\nout_dir = "{tmp_path}"\nname = "r4"\nresume = "{resume}"\nepochs = 3\n')
    return str(run / "config.toml")


def test_a_runs_config_toml_re_run_with_config_is_a_new_run_not_that_run_resumed(tmp_path, capsys):
    record = _record(tmp_path, str(tmp_path / "r4"))
    named = _parsed("--config", record, "--name", "r5")
    assert (named.run.name, named.run.resume, named.run.epochs) == ("r5", "", 3)  # its settings, not its identity
    unnamed = _parsed("--config", record)
    assert (unnamed.run.name, unnamed.run.resume) == ("", "")  # a new default name, not r4's folder
    assert capsys.readouterr().err == ""  # a record's own resume dropped: nothing to say
    # asked for on the command line, the run's identity stands
    again = _parsed("--config", record, "--resume", "auto")
    assert (again.run.name, again.run.resume) == ("r4", "auto")


def test_a_preset_beside_a_resume_is_not_dropped_without_a_word_and_starts_a_run_that_auto_does_not_find(
    tmp_path, capsys, monkeypatch
):
    """The run's record replaced the preset whole: cifar10-resnet18 beside --resume trained the stored cnn3 and
    said nothing. It still continues (the command that started a run is re-run to continue it), and says so."""
    _record(tmp_path, "")
    (tmp_path / "r4" / "ckpt").mkdir()
    (tmp_path / "r4" / "ckpt" / "last.pt").write_bytes(b"")  # found, not read here
    for resume in (
        ["--resume", str(tmp_path / "r4")],
        ["--resume", "auto", "--name", "r4", "--out-dir", str(tmp_path)],
    ):
        cfg = _parsed(*resume, "--preset", "cifar10-resnet18")
        assert cfg.model.name != "resnet18"  # the run's own record
        assert "--preset cifar10-resnet18 not used: a resumed run continues" in capsys.readouterr().err
    new = _parsed("--resume", "auto", "--name", "r5", "--out-dir", str(tmp_path), "--preset", "cifar10-resnet18")
    assert (new.model.name, new.optim.optimizer) == ("resnet18", "sgd")  # no run r5 yet: the preset starts it
    assert "not used" not in capsys.readouterr().err
    # under --nproc the launcher said it; its rank 0 said it again
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("CNNPAR_LAUNCHED_NPROC", "2")
    _parsed("--resume", str(tmp_path / "r4"), "--preset", "cifar10-resnet18")
    assert "not used" not in capsys.readouterr().err


def test_a_resume_in_another_config_file_is_not_used_and_says_so(tmp_path, capsys):
    _record(tmp_path, "auto")
    copy = tmp_path / "copy.toml"
    copy.write_text((tmp_path / "r4" / "config.toml").read_text())
    cfg = _parsed("--config", str(copy))
    assert (cfg.run.name, cfg.run.resume) == ("r4", "")  # a name in a file of its own stands (a second run is refused)
    assert f'{copy}: resume = "auto" not used' in capsys.readouterr().err


def test_a_resume_under_another_name_is_refused_and_a_renamed_folder_resumes_as_itself(tmp_path):
    from cnnpar.engine.rundir import resolve_run
    from cnnpar.errors import UserError

    cfg = with_overrides(
        Config(),
        data={"source": "digits"},
        speed={"device": "cpu", "precision": "fp32"},
        run={"epochs": 1, "batch_size": 64, "max_steps": 1, "out_dir": str(tmp_path), "name": "r4",
             "progress": False, "tensorboard": False},
    )  # fmt: skip
    Trainer(cfg, CPU, log=lambda *a, **k: None).fit()
    record = (tmp_path / "r4" / "config.toml").read_bytes()
    with pytest.raises(UserError, match="continues the run in .*r4, not .*r5 "):
        resolve_run(_parsed("--resume", str(tmp_path / "r4"), "--name", "r5"), CPU)
    other = tmp_path / "elsewhere"
    with pytest.raises(UserError, match=f"continues the run in .*r4, not {other / 'r4'} "):
        resolve_run(_parsed("--resume", str(tmp_path / "r4"), "--out-dir", str(other)), CPU)
    assert (tmp_path / "r4" / "config.toml").read_bytes() == record
    (tmp_path / "r4").rename(tmp_path / "r4b")
    moved = _parsed("--resume", str(tmp_path / "r4b"))
    assert moved.run.name == "r4b" and resolve_run(moved, CPU)[0] == tmp_path / "r4b"


def test_a_run_made_through_a_link_to_its_folder_resumes_through_it(tmp_path):
    """out_dir/name reached through a symbolic link (links/b -> real/exp123): the name is the link's, and the
    resume must not be refused as "not a run named b" because the folder it resolves to is named otherwise."""
    from cnnpar.engine.rundir import resolve_run

    (tmp_path / "real" / "exp123").mkdir(parents=True)
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "b").symlink_to(tmp_path / "real" / "exp123")
    cfg = with_overrides(
        Config(),
        data={"source": "digits"},
        speed={"device": "cpu", "precision": "fp32"},
        run={"epochs": 1, "batch_size": 64, "max_steps": 1, "out_dir": str(tmp_path / "links"), "name": "b",
             "progress": False, "tensorboard": False},
    )  # fmt: skip
    Trainer(cfg, CPU, log=lambda *a, **k: None).fit()
    again = _parsed("--resume", str(tmp_path / "links" / "b"), "--epochs", "2")
    run_dir, ckpt = resolve_run(again, CPU)
    assert Path(run_dir).resolve() == (tmp_path / "real" / "exp123").resolve() and ckpt is not None


def test_a_runs_config_given_with_config_resolves_its_autos_again_and_keeps_what_its_user_set(tmp_path):
    """A CPU run's config.toml re-run with --config on a GPU machine must not train on the CPU: the switches
    the run resolved for its machine ("auto" in its requested lines) come back as "auto"; the ones its user
    set stay set. A file without requested lines (hand-written, tuned.toml) is taken as written."""
    cfg = with_overrides(
        Config(),
        data={"source": "digits"},
        model={"name": "cnn3"},
        speed={"precision": "fp32"},  # chosen; device, layout, compile... stay auto
        run={"epochs": 1, "batch_size": 64, "max_steps": 2, "out_dir": str(tmp_path), "name": "r",
             "progress": False, "tensorboard": False},
    )  # fmt: skip
    Trainer(cfg, CPU, log=lambda *a, **k: None).fit()
    record = tmp_path / "r" / "config.toml"
    assert 'device = "cpu"' in record.read_text()  # the run stored what auto chose on this machine
    again = _parsed("--config", str(record), "--name", "r2")
    assert (again.speed.device, again.speed.channels_last, again.speed.compile) == ("auto", "auto", "auto")
    assert again.speed.precision == "fp32" and again.run.name == "r2"
    written = tmp_path / "mine.toml"
    written.write_text('[speed]\ndevice = "cpu"\nchannels_last = "off"\n')
    mine = _parsed("--config", str(written))
    assert (mine.speed.device, mine.speed.channels_last) == ("cpu", "off")


def test_a_resumed_runs_record_still_says_what_its_first_run_resolved_so_other_data_is_read_as_asked(tmp_path):
    """A resume trains with the first run's resolved format, image size and batch size (from its record); its
    new record must keep their `# requested:` lines, or `--config` of it with another --data would read that
    data as the first run's format (a digits record then trained on the digits again, silently)."""
    import numpy as np

    from cnnpar.cli import main

    common = ["--device", "cpu", "--max-steps", "2", "--no-progress", "--no-tensorboard", "--out-dir", str(tmp_path)]
    assert main(["train", *common, "--epochs", "1", "--name", "r"]) == 0
    first = read_requested((tmp_path / "r" / "config.toml").read_text())
    assert main(["train", *common, "--epochs", "2", "--resume", str(tmp_path / "r")]) == 0
    record = tmp_path / "r" / "config.toml"
    after = read_requested(record.read_text())
    assert {("data", "format"), ("data", "image_size"), ("run", "batch_size")} <= set(after)
    assert after == first
    _, again = stored_run_config(str(tmp_path / "r"))  # what the data decides is found again; the size as stored
    assert (again.data.format, again.data.num_classes, again.data.image_size) == ("auto", 0, 16)
    arrays = tmp_path / "a.npz"
    np.savez(arrays, x_train=np.zeros((40, 8, 8, 3), np.uint8), y_train=np.arange(40) % 2)
    other = _parsed("--config", str(record), "--data", str(arrays))
    assert (other.data.format, other.data.image_size, other.run.batch_size) == ("auto", 0, 0)


def test_a_built_in_format_with_a_file_named_is_refused_not_trained_on_the_built_in_data():
    from cnnpar.data.sources import DataError, detect_format

    with pytest.raises(DataError, match=r"a\.npz: --format digits reads no file .* expected --data digits"):
        detect_format("a.npz", "digits")
    assert detect_format("synthetic", "synthetic") == "synthetic" and detect_format("digits", "auto") == "digits"
    assert detect_format("digits", "synthetic") == "synthetic"  # --format synthetic alone: --data's default stands


def test_a_link_to_a_runs_checkpoint_resumes_that_run_with_its_own_config(tmp_path):
    """The run folder was found through the link, but its config.toml was looked for beside the link: the
    defaults (digits) met the run's synthetic data and the resume was refused for another --data."""
    from cnnpar.cli import main

    synthetic = ["--data", "synthetic", "--image-shape", "1x8x8", "--synthetic-samples", "128"]
    common = ["--device", "cpu", "--max-steps", "1", "--no-progress", "--no-tensorboard", "--out-dir", str(tmp_path)]
    assert main(["train", *common, *synthetic, "--epochs", "1", "--name", "r"]) == 0
    (tmp_path / "link.pt").symlink_to(tmp_path / "r" / "ckpt" / "last.pt")
    assert stored_run_config(str(tmp_path / "link.pt"))[1].data.source == "synthetic"
    assert main(["train", "--resume", str(tmp_path / "link.pt"), "--epochs", "2", "--no-progress"]) == 0
    assert stored_run_config(str(tmp_path / "r"))[1].run.epochs == 2


def test_a_searched_batch_searched_again_starts_from_the_lr_asked_for_not_the_scaled_one(tmp_path):
    """A GPU run's `--batch-size auto` stores the batch it found and the lr scaled for it (requested lines name
    auto and the lr at batch 64). Where the batch is searched again (another --data, or --batch-size auto typed
    over the record, on --config or --resume), the lr goes back to the one asked for: the new search scales it
    once. The same data without --batch-size keeps the record's pair as it trained."""
    import numpy as np

    run = tmp_path / "r"
    run.mkdir()
    body = '[data]\nsource = "digits"\n[run]\nbatch_size = 1024\nname = "r"\nout_dir = "%s"\n[optim]\nlr = 0.008\n'
    (run / "config.toml").write_text(
        "# requested: optim.lr = 0.002\n# requested: run.batch_size = auto\n" + body % tmp_path.as_posix()
    )
    record = str(run / "config.toml")
    arrays = tmp_path / "a.npz"
    np.savez(arrays, x_train=np.zeros((40, 8, 8, 3), np.uint8), y_train=np.arange(40) % 2)
    same = _parsed("--config", record)
    assert (same.run.batch_size, same.optim.lr) == (1024, 0.008)
    for args in (["--data", str(arrays)], ["--batch-size", "auto"]):
        again = _parsed("--config", record, *args)
        assert (again.run.batch_size, again.optim.lr) == (0, 0.002), args
    typed = _parsed("--config", record, "--data", str(arrays), "--lr", "0.01")
    assert (typed.run.batch_size, typed.optim.lr) == (0, 0.01)  # a typed lr stands
    fixed = _parsed("--config", record, "--data", str(arrays), "--batch-size", "1024")
    assert (fixed.run.batch_size, fixed.optim.lr) == (1024, 0.008)  # no search: the lr the batch trained at
    assert stored_run_config("auto", str(tmp_path), "r")[1].optim.lr == 0.008  # a resume at the stored batch keeps it
    resumed = _parsed("--resume", "auto", "--name", "r", "--out-dir", str(tmp_path), "--batch-size", "auto")
    assert (resumed.run.batch_size, resumed.optim.lr) == (0, 0.002)


def test_a_record_re_run_with_config_keeps_what_its_first_run_resolved_for_the_next_re_run(tmp_path):
    """`--config` of a run's record trains with the first run's resolved image size, batch size and augment; the
    new run's record keeps the first one's `# requested:` lines for them, so that `--config` of it with other data
    finds them again from that data, as `--config` of the first record does (before, the second generation
    enlarged 8 px photos to the digits' 16 px and credited a --image-size nobody typed)."""
    import numpy as np

    from cnnpar.cli import main

    common = ["--device", "cpu", "--max-steps", "2", "--no-progress", "--no-tensorboard", "--out-dir", str(tmp_path)]
    assert main(["train", *common, "--epochs", "1", "--name", "r"]) == 0
    first = read_requested((tmp_path / "r" / "config.toml").read_text())
    assert {("data", "image_size"), ("run", "batch_size")} <= set(first)
    record = str(tmp_path / "r" / "config.toml")
    assert main(["train", *common, "--epochs", "1", "--config", record, "--name", "r2"]) == 0
    second = tmp_path / "r2" / "config.toml"
    assert read_requested(second.read_text()) == first
    arrays = tmp_path / "a.npz"
    np.savez(arrays, x_train=np.zeros((40, 8, 8, 3), np.uint8), y_train=np.arange(40) % 2)
    other = _parsed("--config", str(second), "--data", str(arrays))
    assert (other.data.format, other.data.image_size, other.run.batch_size) == ("auto", 0, 0)


def test_a_config_file_beside_a_resume_is_not_applied_and_says_where_it_differs(tmp_path, capsys, monkeypatch):
    """`--resume runs/r3 --config small.toml` trained the resumed epochs with the file's defaults (no label
    smoothing, no augment, the default weight decay) and rewrote the run's record with them, saying nothing. The
    run continues with its stored settings, as beside a --preset (re-running the command that started a run with
    --resume auto continues it); flags typed beside --resume still change single settings, and a note names
    what the file would have changed. The file that started the run, or the run's own record, is no news."""
    run = tmp_path / "r3"
    (run / "ckpt").mkdir(parents=True)
    (run / "ckpt" / "last.pt").write_bytes(b"")  # found, not read here
    settings = '[optim]\nlabel_smoothing = 0.1\nweight_decay = 0.01\n[data]\naugment = "flip"\n'
    (run / "config.toml").write_text(
        "# requested: data.image_size = 0\n# requested: speed.device = 'auto'\n# requested: run.batch_size = auto\n"
        f'{settings}image_size = 16\n[speed]\ndevice = "cpu"\n'
        f'[run]\nout_dir = "{tmp_path.as_posix()}"\nname = "r3"\nbatch_size = 64\n'
    )
    small = tmp_path / "small.toml"
    small.write_text("[run]\nprogress = false\n")
    for resume in ([str(run)], ["auto", "--name", "r3", "--out-dir", str(tmp_path)]):
        cfg = _parsed("--resume", *resume, "--config", str(small), "--epochs", "2")
        assert (cfg.optim.label_smoothing, cfg.data.augment, cfg.optim.weight_decay) == (0.1, "flip", 0.01)
        assert (cfg.run.progress, cfg.run.epochs, cfg.run.name) == (True, 2, "r3")  # a typed flag still applies
        err = capsys.readouterr().err
        assert f"--config {small}: not applied on resume: the run continues with the settings of its own" in err
        differ = err.partition("differs in ")[2].partition(")")[0].split(", ")
        assert sorted(differ) == ["data.augment", "optim.label_smoothing", "optim.weight_decay", "run.progress"]
    started = tmp_path / "started.toml"  # the file that started the run: its image size and device were auto
    started.write_text(settings)
    cfg = _parsed("--config", str(started), "--resume", "auto", "--name", "r3", "--out-dir", str(tmp_path))
    assert (cfg.run.name, cfg.data.image_size, cfg.speed.device) == ("r3", 16, "auto")
    _parsed("--config", str(run / "config.toml"), "--resume", str(run))
    assert capsys.readouterr().err == ""
    new = _parsed("--config", str(small), "--resume", "auto", "--name", "r9", "--out-dir", str(tmp_path))
    assert new.run.progress is False and capsys.readouterr().err == ""  # no run r9 yet: the file starts it
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("CNNPAR_LAUNCHED_NPROC", "2")  # the launcher said it
    _parsed("--resume", str(run), "--config", str(small))
    assert capsys.readouterr().err == ""


def test_a_value_edited_in_a_record_since_the_run_wrote_it_stays_and_an_unedited_one_is_resolved_again(tmp_path):
    """`--config` of a run's record (or a resume of it) put every field with a `# requested:` line back to the
    value asked for: precision = "fp32" edited over the bf16 auto chose trained bf16, num_classes = 12 trained
    10 classes. The record's `# resolved:` lines say what the run wrote: a value that differs is the user's."""
    import numpy as np

    run = tmp_path / "r"
    run.mkdir()
    pairs = {
        "speed.precision": ("'auto'", "'bf16'"),
        "speed.channels_last": ("'auto'", "'on'"),
        "speed.compile": ("'auto'", "'off'"),
        "data.format": ("'auto'", "'digits'"),
        "data.num_classes": ("0", "10"),
        "run.batch_size": ("auto", "1024"),
        "optim.lr": ("0.002", "0.008"),
    }
    lines = "".join(f"# requested: {k} = {a}\n# resolved: {k} = {b}\n" for k, (a, b) in pairs.items())
    body = (
        '[speed]\nprecision = "fp32"\nchannels_last = "off"\ncompile = "off"\n'
        '[data]\nsource = "digits"\nformat = "digits"\nnum_classes = 12\n'
        f'[run]\nbatch_size = 256\nname = "r"\nout_dir = "{tmp_path.as_posix()}"\n[optim]\nlr = 0.008\n'
    )
    (run / "config.toml").write_text(lines + body)
    for cfg in (_parsed("--config", str(run / "config.toml")), stored_run_config("auto", str(tmp_path), "r")[1]):
        assert (cfg.speed.precision, cfg.speed.channels_last, cfg.data.num_classes) == ("fp32", "off", 12)  # edited
        assert (cfg.speed.compile, cfg.data.format) == ("auto", "auto")  # as the run wrote them: found again
    arrays = tmp_path / "a.npz"
    np.savez(arrays, x_train=np.zeros((40, 8, 8, 3), np.uint8), y_train=np.arange(40) % 2)
    other = _parsed("--config", str(run / "config.toml"), "--data", str(arrays))
    assert (other.run.batch_size, other.optim.lr) == (256, 0.008)  # an edited batch is not searched, as a typed one
    (run / "config.toml").write_text(lines + body.replace("256", "1024").replace("fp32", "bf16"))
    same = _parsed("--config", str(run / "config.toml"), "--data", str(arrays))
    assert (same.run.batch_size, same.optim.lr, same.speed.precision) == (0, 0.002, "auto")


def test_a_run_writes_what_it_resolved_so_that_a_hand_edit_of_its_record_is_kept(tmp_path):
    """The writing side of the test above: a real run's record names each resolved "auto" with both lines, a
    re-run's record keeps the first run's pairs, and a value edited in the file since is what --config takes."""
    from cnnpar.cli import main
    from cnnpar.engine.resolved import read_resolved

    common = ["--device", "cpu", "--max-steps", "1", "--no-progress", "--no-tensorboard", "--out-dir", str(tmp_path)]
    assert main(["train", *common, "--epochs", "1", "--name", "r"]) == 0
    record = tmp_path / "r" / "config.toml"
    text = record.read_text()
    asked, got = read_requested(text), read_resolved(text)
    assert set(asked) == set(got) and ("speed", "channels_last") in got and ("run", "batch_size") in got
    stored = tomllib.loads(text)
    assert all(stored[sec][name] == value for (sec, name), value in got.items())  # what the run wrote
    assert main(["train", *common, "--epochs", "1", "--config", str(record), "--name", "r2"]) == 0
    second = (tmp_path / "r2" / "config.toml").read_text()
    assert {k: v for k, v in read_resolved(second).items() if k in read_requested(second)} == read_resolved(second)
    assert read_resolved(second)[("run", "batch_size")] == got[("run", "batch_size")]
    assert _parsed("--config", str(record)).speed.channels_last == "auto"  # unedited: resolved again here
    was = got[("speed", "channels_last")]
    other = "off" if was == "on" else "on"
    record.write_text(text.replace(f'channels_last = "{was}"', f'channels_last = "{other}"'))
    assert _parsed("--config", str(record)).speed.channels_last == other  # edited by hand: the user's choice
