"""A trainer publishing its experience to a real exchange over a real socket."""
from helpers import tiny_config
from mrl.exchange_client import ExchangeClient
from mrl.experience import kind_name
from mrl_trainer.config import TrainerConfig
from mrl_trainer.trainer import build_trainer


def test_publishes_its_experience_to_the_exchange(tmp_path, exchange, run_id):
    config = TrainerConfig.model_validate(tiny_config(tmp_path, run_id=run_id, steps=1, exchange={
        "target": exchange.target, "tokenizer_id": "gpt2"}))
    with ExchangeClient(config.exchange.target) as client:
        trainer = build_trainer(config, exchange=client)
        trainer.run()
        trainer.close()
        counts = {kind_name(t.topic.kind): t.length for t in client.topic_stats(run_id)}
    # successes depend on what the untrained policy sampled; the rest is fixed by the batch shape
    assert {k: counts.get(k) for k in ("rollout", "group_stats", "policy_stats")} == \
        {"rollout": 6, "group_stats": 2, "policy_stats": 1}


def _counts(client, run_id) -> dict:
    counts = {kind_name(t.topic.kind): t.length for t in client.topic_stats(run_id)}
    return {k: counts.get(k) for k in ("rollout", "group_stats", "policy_stats")}


def test_experience_of_a_step_while_the_exchange_is_down_waits_in_the_outbox(tmp_path, start_exchange, run_id):
    """The exchange is down during step 0: its experience waits in the outbox (files under checkpoint.dir)
    and goes out with step 1's once the exchange is back; nothing is lost."""
    from mrl.exchange_client import Backoff
    first = start_exchange()
    port, target = first.server.port, first.target
    first.stop()
    config = TrainerConfig.model_validate(tiny_config(tmp_path, run_id=run_id, steps=2, exchange={
        "target": target, "tokenizer_id": "gpt2"}))
    # a budget that gives up on the exchange while it is down, and covers the channel's reconnection (<= 2 s) after
    with ExchangeClient(target, backoff=Backoff(attempts=None, budget_s=4.0)) as client:
        trainer = build_trainer(config, exchange=client)
        assert trainer.step()["published"] == 0
        start_exchange(port=port)
        assert trainer.step()["published"] > 0
        trainer.close()
        assert _counts(client, run_id) == {"rollout": 12, "group_stats": 4, "policy_stats": 2}
    assert not any((tmp_path / "ckpt" / "outbox").iterdir())


def test_a_restarted_trainer_sends_what_its_outbox_holds(tmp_path, start_exchange, run_id):
    """A trainer ends (its last step unpublished: the exchange was down); started again once the exchange is
    back, with no step left to run, it sends the outbox."""
    import yaml

    from mrl.exchange_client import Backoff
    from mrl_trainer import app
    first = start_exchange()
    port, target = first.server.port, first.target
    first.stop()
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, run_id=run_id, steps=1, exchange={
        "target": target, "tokenizer_id": "gpt2"})))
    with ExchangeClient(target, backoff=Backoff(attempts=1)) as client:
        trainer = build_trainer(app.load_config(path), exchange=client)
        trainer.run()
        trainer.close()
    start_exchange(port=port)
    summary = app.run(str(path))
    assert (summary["step"], summary["unpublished"]) == (1, 0)
    with ExchangeClient(target) as client:
        assert _counts(client, run_id) == {"rollout": 6, "group_stats": 2, "policy_stats": 1}


def test_unpublished_steps_are_counted_warned_and_stop_the_run_at_the_limit(tmp_path, start_exchange, run_id,
                                                                             caplog):
    """An exchange that stays down: each step that leaves its experience in the outbox counts and warns, and at
    exchange.max_unpublished_steps the run stops, naming the exchange and the setting, rather than train solo."""
    import pytest

    from mrl.exchange_client import Backoff
    from mrl_trainer.errors import TrainerError
    first = start_exchange()
    target = first.target
    first.stop()
    config = TrainerConfig.model_validate(tiny_config(tmp_path, run_id=run_id, steps=5, exchange={
        "target": target, "tokenizer_id": "gpt2", "max_unpublished_steps": 2}))
    with ExchangeClient(target, backoff=Backoff(attempts=1)) as client:
        trainer = build_trainer(config, exchange=client)
        with caplog.at_level("WARNING", logger="mrl.trainer"):
            assert trainer.step()["unpublished_steps"] == 1
        assert f"the exchange at {target} has taken nothing for 1 step(s) in a row" in caplog.text
        with pytest.raises(TrainerError, match=f"exchange at {target} took nothing for 2 steps in a row "
                                               r"\(exchange.max_unpublished_steps\)"):
            trainer.step()
        trainer.close()


def test_the_trainer_checks_its_connection_before_loading_the_model(tmp_path, exchange, run_id, monkeypatch):
    """A trainer pointed at the exchange's REST port stops at once with what to fix, before its model is loaded
    (here a model folder that does not exist: loading it would fail otherwise)."""
    import pytest
    import yaml

    from mrl import errors
    from mrl_trainer import app
    path = tmp_path / "policy.yaml"
    monkeypatch.delenv("MRL_TOKEN", raising=False)
    rest = f"127.0.0.1:{exchange.server.admin_port}"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, run_id=run_id, steps=1, model={
        "source": "hf", "path": str(tmp_path / "no-such-model")}, exchange={"target": rest, "tokenizer_id": "gpt2"})))
    with pytest.raises(errors.Unavailable, match=f"the exchange at {rest} from exchange.target in {path} "
                                                 r"\(plaintext, no token sent\).*this is the REST port"):
        app.run(str(path))
