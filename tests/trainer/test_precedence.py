"""One precedence for the connection settings (mrl.precedence): --set > the environment > the config file >
the default, the same in the trainer's config as in the SDK clients, and the source of each value named."""
import pytest
import yaml

from helpers import tiny_config
from mrl.exchange_client import ExchangeClient
from mrl_trainer.app import parse_overrides
from mrl_trainer.config import load_config

SECTIONS = {"exchange": {"target": "file-exchange:1", "tokenizer_id": "gpt2", "token": "file-token"},
            "scheduler": {"target": "file-scheduler:3", "token": "file-token"},
            "sharing.mode": "sgt", "sharing.align": {"target": "file-thl:2"}}


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    for variable in ("MRL_TOKEN", "MRL_EXCHANGE_TARGET", "MRL_SCHEDULER_TARGET", "MRL_ALIGN_TARGET"):
        monkeypatch.delenv(variable, raising=False)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, **SECTIONS)))
    return path


def test_the_file_wins_over_the_default(config_file):
    config = load_config(config_file)
    assert (config.exchange.token, config.source("exchange.token")) == ("file-token", f"exchange.token in {config_file}")
    assert config.source("sharing.align.token") == f"exchange.token in {config_file}"   # THL's: the exchange's
    assert (config.sharing.align.target, config.scheduler.target) == ("file-thl:2", "file-scheduler:3")


def test_the_environment_wins_over_the_file(config_file, monkeypatch):
    monkeypatch.setenv("MRL_TOKEN", "env-token")
    monkeypatch.setenv("MRL_EXCHANGE_TARGET", "env-exchange:1")
    monkeypatch.setenv("MRL_ALIGN_TARGET", "env-thl:2")
    config = load_config(config_file)
    assert (config.exchange.token, config.scheduler.token, config.sharing.align.token) == ("env-token",) * 3
    assert [config.source(k) for k in ("exchange.token", "scheduler.token", "sharing.align.token")] == ["MRL_TOKEN"] * 3
    assert (config.exchange.target, config.source("exchange.target")) == ("env-exchange:1", "MRL_EXCHANGE_TARGET")
    assert (config.sharing.align.target, config.scheduler.target) == ("env-thl:2", "file-scheduler:3")


def test_set_wins_over_the_environment(config_file, monkeypatch):
    monkeypatch.setenv("MRL_TOKEN", "env-token")
    monkeypatch.setenv("MRL_ALIGN_TARGET", "env-thl:2")
    config = load_config(config_file, parse_overrides(["exchange.token=set-token", "sharing.align={target: set:2}"]))
    assert (config.exchange.token, config.source("exchange.token")) == ("set-token", "--set exchange.token")
    assert (config.scheduler.token, config.source("scheduler.token")) == ("env-token", "MRL_TOKEN")
    assert (config.sharing.align.target, config.source("sharing.align.target")) == ("set:2", "--set sharing.align.target")


def test_the_environment_adds_no_section_the_config_does_not_have(tmp_path, monkeypatch):
    monkeypatch.setenv("MRL_SCHEDULER_TARGET", "env-scheduler:3")
    path = tmp_path / "solo.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    assert load_config(path).scheduler is None


def test_the_sdk_client_takes_the_same_rule(monkeypatch):
    monkeypatch.setenv("MRL_TOKEN", "env-token")
    with ExchangeClient("127.0.0.1:1") as client:
        assert (client._connection.metadata, client._connection.token_source) == (
            (("authorization", "Bearer env-token"),), "MRL_TOKEN")
    with ExchangeClient("127.0.0.1:1", "arg-token", token_source="--token") as client:
        assert (client._connection.metadata, client._connection.token_source) == (
            (("authorization", "Bearer arg-token"),), "--token")
    monkeypatch.delenv("MRL_TOKEN")
    with ExchangeClient("127.0.0.1:1") as client:
        assert (client._connection.metadata, client._connection.token_source) == ((), None)
        assert client._connection.where() == "the exchange at 127.0.0.1:1 (plaintext, no token sent)"
