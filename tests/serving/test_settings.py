"""Service settings: keyword arguments over MRL_* environment variables over the MRL_CONFIG YAML over defaults."""
import pytest
from pydantic import Field

from mrl.errors import InvalidArgument

from mrl_serving.settings import ServerSettings


class DemoSettings(ServerSettings):
    max_batch: int = Field(10, gt=0)


def test_settings_come_from_the_config_file_under_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "mrl.yaml"
    path.write_text("port: 6000\nmax_batch: 7\n")
    monkeypatch.setenv("MRL_CONFIG", str(path))
    monkeypatch.setenv("MRL_MAX_BATCH", "5")
    s = DemoSettings()
    assert (s.port, s.max_batch) == (6000, 5)
    assert DemoSettings(max_batch=3).max_batch == 3


def test_a_missing_config_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("MRL_CONFIG", str(tmp_path / "nope.yaml"))
    with pytest.raises(InvalidArgument, match="nope.yaml"):
        DemoSettings()
