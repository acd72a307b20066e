"""The supervised warm start (mrl_trainer.sft) on a tiny GPT-2-architecture policy over the real GPT-2
tokenizer: the target is what the verifier accepts, the loss falls, results are cached atomically
under a key and spec, and bad specs are refused."""
import copy
import json
import pathlib
import threading

import pytest
import torch
from pydantic import ValidationError

from mrl.assets import tokenizer_cache_dir
from mrl_trainer import sft
from mrl_trainer.policy import ModelSpec, load_policy
from mrl_trainer.sft import WarmStartConfig, cache_folder, response_ids, response_nll, warm_start
from mrl.tasks import make_task

GPT2 = str(tokenizer_cache_dir() / "gpt2.tiktoken")
TINY = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 256}


@pytest.fixture(autouse=True)
def model_cache(tmp_path, monkeypatch):
    """Every test caches into its own folder, never the user's ~/.cache/mrl/models."""
    monkeypatch.setenv("MRL_MODEL_CACHE", str(tmp_path / "models"))
    return tmp_path / "models"


@pytest.fixture(scope="module")
def tiny():
    return load_policy(ModelSpec(source="config", tokenizer=GPT2, architecture=TINY), seed=1)


@pytest.fixture
def policy(tiny):
    """A fresh copy of the tiny model (same random init every test) and the shared tokenizer."""
    return copy.deepcopy(tiny[0]), tiny[1]


@pytest.fixture(scope="module")
def task():
    return make_task({"family": "arithmetic", "level": 1, "seed": 0})


def run(policy, task, key="k", system_prompt=None, **spec):
    model, tokenizer = policy
    return warm_start(model, tokenizer, task, WarmStartConfig(**{"batch_size": 8, **spec}),
                      system_prompt=system_prompt, seed=0, cache_key=key, device="cpu")


def entries(model_cache) -> list[pathlib.Path]:
    """The cache's entries (and any temporary folder), without the folder of locks."""
    return sorted(p for p in model_cache.iterdir() if p.name != ".locks")


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_target_response_is_what_the_verifier_accepts(tiny):
    _, tokenizer = tiny
    level2 = make_task({"family": "arithmetic", "level": 2, "seed": 0})
    for problem in level2.batch(0, 20, split="train") + level2.batch(0, 20, split="eval"):
        ids = response_ids(tokenizer, problem)
        assert ids[-1] == tokenizer.eos_token_id and tokenizer.eos_token_id not in ids[:-1]
        assert level2.reward(problem, tokenizer.decode(ids, skip_special_tokens=True)) == 1.0


def test_loss_decreases_on_train_and_held_out_problems(policy, task):
    model, tokenizer = policy
    held_out = task.batch(0, 16, split="eval")
    with torch.no_grad():
        before = response_nll(model, tokenizer, held_out).item()
    stats = run(policy, task, steps=40, lr=3e-3, cache=False)
    with torch.no_grad():
        after = response_nll(model, tokenizer, held_out).item()
    assert stats["cached"] is False and stats["steps"] == 40
    assert stats["final_loss"] < 0.5 * stats["initial_loss"]
    assert after < 0.5 * before, (before, after)
    assert model.training and all(p.grad is None for p in model.parameters())


def test_the_second_call_loads_the_cache_with_identical_weights(tiny, task, model_cache):
    first, second = (copy.deepcopy(tiny[0]), tiny[1]), (copy.deepcopy(tiny[0]), tiny[1])
    rng = torch.get_rng_state()
    trained = run(first, task, steps=5)
    assert torch.equal(torch.get_rng_state(), rng)          # the caller's RNG is left as it was
    assert trained["cached"] is False
    assert [p.name for p in entries(model_cache)] == [cache_folder(
        WarmStartConfig(steps=5, batch_size=8), system_prompt=None, seed=0, cache_key="k").name]
    # what trained it: the same spec and seed give other floats under other kernels, thread counts or torch
    meta = json.loads((entries(model_cache)[0] / "sft.json").read_text())
    assert meta["trained_with"] == {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                                    "threads": torch.get_num_threads(), "device": "cpu"}
    initial = weights(second[0])
    loaded = run(second, task, steps=5)
    assert loaded["cached"] is True and loaded["final_loss"] == trained["final_loss"]
    a, b = weights(first[0]), weights(second[0])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(initial[k], b[k]) for k in b)
    # tied embeddings stay tied after loading
    assert second[0].lm_head.weight.data_ptr() == second[0].transformer.wte.weight.data_ptr()


def test_a_different_spec_seed_prompt_or_key_is_another_entry(policy, task, model_cache):
    model, tokenizer = policy
    start = weights(model)
    variants = [dict(), dict(lr=2e-3), dict(steps=3), dict(batch_size=4), dict(system_prompt="Be brief."),
                dict(key="other")]
    for variant in variants:
        model.load_state_dict(start)
        assert run(policy, task, **{"steps": 2, **variant})["cached"] is False
    assert len([p for p in entries(model_cache) if p.name.startswith("sft-")]) == len(variants)
    assert cache_folder(WarmStartConfig(), system_prompt=None, seed=0, cache_key="k") != \
        cache_folder(WarmStartConfig(), system_prompt=None, seed=1, cache_key="k")
    # `cache` only says whether to use the cache: it is not part of the entry's identity
    assert cache_folder(WarmStartConfig(cache=False), system_prompt=None, seed=0, cache_key="k") == \
        cache_folder(WarmStartConfig(), system_prompt=None, seed=0, cache_key="k")


def test_cache_false_reads_and_writes_nothing(policy, task, model_cache):
    assert run(policy, task, steps=2)["cached"] is False
    before = entries(model_cache)
    assert run(policy, task, steps=2, cache=False)["cached"] is False
    assert entries(model_cache) == before


def test_a_failed_write_leaves_no_entry_and_trains_again(policy, task, model_cache, monkeypatch):
    def crash(model, path):
        with open(path, "wb") as f:
            f.write(b"half a file")
        raise OSError("disk full")
    monkeypatch.setattr(sft, "save_model", crash)
    assert run(policy, task, steps=2)["cached"] is False
    assert entries(model_cache) == []                        # neither the entry nor its temporary folder
    monkeypatch.undo()
    monkeypatch.setenv("MRL_MODEL_CACHE", str(model_cache))
    assert run(policy, task, steps=2)["cached"] is False
    assert run(policy, task, steps=2)["cached"] is True


@pytest.mark.parametrize("bad", [dict(steps=0), dict(lr=float("nan")), dict(lr=float("inf")), dict(lr=0.0),
                                 dict(lr=-1e-3), dict(batch_size=0), dict(epochs=3)])
def test_bad_specs_are_refused(bad):
    with pytest.raises(ValidationError):
        WarmStartConfig(**bad)


def test_a_cache_key_that_is_not_a_plain_name_is_refused(policy, task):
    from mrl_trainer.errors import TrainerError
    for key in ("", "../escape", "a/b"):
        with pytest.raises(TrainerError, match="cache_key"):
            run(policy, task, key=key, steps=1)


def test_asked_to_stop_it_ends_before_its_next_step_and_caches_nothing(policy, task, model_cache):
    asked = []

    def should_stop():
        asked.append(1)
        return len(asked) > 3              # three steps, then stop
    model, tokenizer = policy
    with pytest.raises(sft.WarmStartStopped, match="step 3 of 50"):
        warm_start(model, tokenizer, task, WarmStartConfig(steps=50, batch_size=8), system_prompt=None, seed=0,
                   cache_key="k", device="cpu", should_stop=should_stop)
    assert entries(model_cache) == []


def test_two_callers_of_one_entry_at_once_train_it_once(tiny, task, model_cache, monkeypatch):
    """Two arms of one seed start together: one trains, the other waits for its lock and loads what it stored.
    The first does not take its first step until the second has been seen waiting (asking should_stop)."""
    monkeypatch.setattr(sft, "LOCK_POLL_S", 0.01)
    policies = [(copy.deepcopy(tiny[0]), tiny[1]) for _ in range(2)]
    training, waiting = threading.Event(), threading.Event()
    stops = [lambda: training.set() or not waiting.wait(60),       # holds the lock until the other waits for it
             lambda: waiting.set() or False]
    stats = [None, None]

    def one(i):
        model, tokenizer = policies[i]
        stats[i] = warm_start(model, tokenizer, task, WarmStartConfig(steps=6, batch_size=8), system_prompt=None,
                              seed=0, cache_key="k", device="cpu", should_stop=stops[i])
    threads = [threading.Thread(target=one, args=(0,)), threading.Thread(target=one, args=(1,))]
    threads[0].start()
    assert training.wait(60)
    threads[1].start()
    for t in threads:
        t.join(120)
    assert waiting.is_set() and [s["cached"] for s in stats] == [False, True]
    a, b = (weights(m) for m, _ in policies)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_waiting_for_another_callers_lock_it_can_be_stopped(policy, task, model_cache, monkeypatch):
    import fcntl
    monkeypatch.setattr(sft, "LOCK_POLL_S", 0.01)
    folder = cache_folder(WarmStartConfig(steps=2, batch_size=8), system_prompt=None, seed=0, cache_key="k")
    (folder.parent / ".locks").mkdir(parents=True)
    with open(folder.parent / ".locks" / folder.name, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)               # another process is training this entry
        asked = []
        model, tokenizer = policy
        with pytest.raises(sft.WarmStartStopped, match="another process"):
            warm_start(model, tokenizer, task, WarmStartConfig(steps=2, batch_size=8), system_prompt=None, seed=0,
                       cache_key="k", device="cpu", should_stop=lambda: asked.append(1) or len(asked) > 5)
    assert len(asked) == 6 and entries(model_cache) == []
