from cnnpar.config import Config
from cnnpar.models import describe_models


def test_registry_lists_the_four_models():
    names = [n for n, _ in describe_models()]
    assert {"cnn3", "resnet18", "resnet50", "fastnet"} <= set(names)


def test_default_config_is_cnn3_on_digits():
    cfg = Config()
    assert cfg.model.name == "cnn3" and cfg.data.source == "digits"
