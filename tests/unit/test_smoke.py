from cnnpar.config import Config


def test_default_config_is_cnn3_on_digits():
    cfg = Config()
    assert cfg.model.name == "cnn3" and cfg.data.source == "digits"
