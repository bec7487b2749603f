"""docs/learn.md names, for each piece of a training step, the function that does it (`engine.step.forward_backward`,
under `cnnpar/`), not a line number: a learner reads the code from those names, so each must still be there. A
function renamed or moved leaves the tour pointing at nothing, and nothing else would notice."""

from __future__ import annotations

import importlib
import re

from tests.conftest import REPO

LEARN = REPO / "docs" / "learn.md"
# a code span that is a dotted name under one of cnnpar's modules or packages
NAME = re.compile(r"`((?:config|dist|data|engine|parallel|report|models)\.[A-Za-z_][\w.]*)`")
FILES = (".py", ".toml", ".csv", ".json", ".pt", ".md")  # `dist.py`, `config.toml`: files, not names


def named_in_learn() -> list[str]:
    return sorted({name for name in NAME.findall(LEARN.read_text()) if not name.endswith(FILES)})


def resolves(dotted: str) -> bool:
    """Whether cnnpar.<dotted> is a module, or an attribute (a method too) of the longest module it starts with."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module("cnnpar." + ".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def class_methods_in_learn() -> list[str]:
    """`Precision.autocast`, `DeviceFeeder._ready`: a method named by its class alone, spelt out in full as the class
    the tour names elsewhere (`parallel.precision.Precision`); a class it does not name so (torch's `GradScaler`) is
    not cnnpar's."""
    classes = {name.rsplit(".", 1)[-1]: name for name in named_in_learn() if name.rsplit(".", 1)[-1][:1].isupper()}
    spans = re.findall(r"`([A-Z]\w*)\.(\w+)`", LEARN.read_text())
    return sorted({f"{classes[cls]}.{attr}" for cls, attr in spans if cls in classes})


def test_the_tour_names_many_functions():
    # the pattern still finds the tour's names (a change of their spelling would make the test below pass on none)
    assert len(named_in_learn()) >= 30
    assert "parallel.precision.Precision.autocast" in class_methods_in_learn()


def test_every_function_the_tour_names_exists():
    missing = [name for name in named_in_learn() + class_methods_in_learn() if not resolves(name)]
    assert not missing, "docs/learn.md names what cnnpar/ no longer has:\n" + "\n".join(missing)


def test_a_name_that_is_not_there_is_caught():
    assert resolves("engine.step.forward_backward")
    assert resolves("engine.train_step.TrainStep._accumulate")
    assert not resolves("engine.step.no_such_function")
    assert not resolves("engine.no_such_module.f")
