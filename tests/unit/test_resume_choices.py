"""A resumed run keeps the switches its user set and resolves again only what was "auto" (the run's
config.toml says which: a `# requested:` line stands beside every field that was resolved)."""

from __future__ import annotations

import torch

from cnnpar.cliargs import stored_run_config
from cnnpar.config import Config
from cnnpar.dist import DistInfo
from cnnpar.engine.resolved import read_requested
from cnnpar.engine.trainer import Trainer
from cnnpar.presets import with_overrides

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
    resumed = stored_run_config("auto", str(tmp_path), "r")
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
    resumed = stored_run_config("auto", str(tmp_path), "r")
    assert (resumed.speed.cuda_graphs, resumed.data.workers, resumed.speed.precision) == ("on", -1, "bf16")
    (run / "config.toml").write_text(body)  # written before requested lines existed: nothing known, so auto
    resumed = stored_run_config("auto", str(tmp_path), "r")
    assert (resumed.speed.cuda_graphs, resumed.data.workers, resumed.speed.precision) == ("auto", -1, "auto")
    assert read_requested("# requested: run.batch_size = auto\n# requested: x.y = <object>\n") == {
        ("run", "batch_size"): 0
    }
