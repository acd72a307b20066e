"""`mrl lab bandit --quick` in-process: the JSON line's shape, every registered sharing mode, 95% intervals that
contain their means, and what holds by construction: with a peer (almost) always right where the receiver is
(almost) never right (--gap 1 --p-strong 0.99 --p-weak 0), SGT rescues, every sharing mode logs its own
statistics, and mode none logs no sharing statistic at all."""
import contextlib
import io
import json

import pytest

from mrl.cli import main
from mrl.errors import InvalidArgument
from mrl_research.lab.point import Point, sweep_points
from mrl_research.lab.stats import SHARING_KEYS
from mrl_tokenizer_align import catalog
from mrl_trainer.sharing import SHARING_MODES

ARGS = ["lab", "bandit", "--quick", "--gap", "1", "--p-strong", "0.99", "--p-weak", "0"]


@pytest.fixture(scope="module")
def quick():
    missing = {"gpt2", "mistral-v1"} - set(catalog.cached_paths())
    assert not missing, f"tokenizers {sorted(missing)} are not in {catalog.cache_dir()}: run `make tokenizers`"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(ARGS)
    lines = out.getvalue().strip().splitlines()
    return json.loads(lines[-1]), lines


def _inside(mean, ci):
    lo, hi = ci
    return lo is not None and hi is not None and lo - 1e-12 <= mean <= hi + 1e-12


def test_quick_prints_one_line_per_mode_and_ends_with_one_json_line(quick):
    result, lines = quick
    assert set(result) >= {"points", "settings", "seeds", "seconds"}
    assert len(result["points"]) == 1
    point = result["points"][0]
    assert point["point"] == {"gap": 1.0, "overlap": 0.5, "staleness": 0, "tokenizers": "gpt2/mistral-v1",
                              "group_size": 8, "interference": 0.0, "speed": 1}
    assert set(point["modes"]) == set(SHARING_MODES)          # every registered mode, nothing else
    for mode in SHARING_MODES:
        assert sum(line.strip().startswith(f"{mode} ") for line in lines) == 1, mode
    assert any(line.startswith("every policy at lr 0.15, solo's too: not tuned") for line in lines)


def test_every_mode_has_its_numbers_and_intervals_contain_their_means(quick):
    result, _ = quick
    for mode, e in result["points"][0]["modes"].items():
        assert e["seeds"] == result["seeds"] == 3
        assert 0.0 <= e["final_mean"] <= 1.0 and _inside(e["final_mean"], e["final_ci"]), mode
        assert _inside(e["delta_solo"], e["delta_solo_ci"]), mode
        assert _inside(e["grad_var"], e["grad_var_ci"]) and e["grad_var"] > 0, mode
        assert _inside(e["grad_rel_var"], e["grad_rel_var_ci"]), mode
        assert e["rollouts_to_solo"] is None or e["rollouts_to_solo"] in e["curve"]["rollouts"]
        c = e["curve"]
        assert len(c["rollouts"]) == len(c["mean"]) == len(c["lo"]) == len(c["hi"]) >= 2
        assert all(_inside(m, (lo, hi)) for m, lo, hi in zip(c["mean"], c["lo"], c["hi"])), mode
        for p in e["policies"].values():
            assert _inside(p["final_mean"], p["final_ci"]), mode
    none = result["points"][0]["modes"]["none"]
    assert none["delta_solo"] == 0.0 and none["rollouts_to_solo"] is not None


def test_sgt_rescues_where_the_peer_succeeds_and_the_receiver_fails(quick):
    result, _ = quick
    modes = result["points"][0]["modes"]
    assert modes["sgt"]["stats"]["sgt_rescued"] > 0
    assert modes["sgt"]["stats"]["sgt_rejected"] == 0          # the receiver's verifier agrees with the peer's


def test_each_sharing_mode_logs_its_own_stats_and_none_logs_none(quick):
    result, _ = quick
    modes = result["points"][0]["modes"]
    assert not SHARING_KEYS & set(modes["none"]["stats"])
    for name, cls in SHARING_MODES.items():
        if cls.kinds:
            assert set(cls.stats) & set(modes[name]["stats"]), name
    for name in ("prp", "sgt", "hacpo"):                       # retokenized by THL: different tokenizers
        assert 0.0 <= modes[name]["stats"]["thl_one_to_one"] <= 1.0
    assert modes["xgrpo"]["stats"]["xgrpo_pooled"] > 8             # own G plus the peer's group_stats
    assert "thl_one_to_one" not in modes["xgrpo"]["stats"]         # baselines only: nothing to retokenize


def test_the_sweep_moves_one_axis_at_a_time_around_the_default_point():
    points = sweep_points(Point())
    assert points[0] == Point() and len(set(points)) == len(points) == 12
    for p in points[1:]:
        assert sum(getattr(p, f) != getattr(Point(), f) for f in Point.__dataclass_fields__) == 1


def test_mode_variants_are_specs_of_a_modes_own_fields():
    from mrl.errors import FailedPrecondition
    from mrl_research.lab.run import mode_config
    assert mode_config("xgrpo").xgrpo.uniform_groups == "zero"
    assert mode_config("xgrpo:uniform_groups=pooled").xgrpo.uniform_groups == "pooled"
    cfg = mode_config("sgt:normalize=prompts:lam=0.2", max_staleness=2)
    assert (cfg.mode, cfg.sgt.normalize, cfg.sgt.lam, cfg.max_staleness) == ("sgt", "prompts", 0.2, 2)
    assert mode_config("sgt").guard.enabled and not mode_config("sgt-unguarded").guard.enabled
    cfg = mode_config("sgt:lam=1:guard.trust_rate=0-unguarded")
    assert (cfg.sgt.lam, cfg.guard.trust_rate, cfg.guard.enabled) == (1, 0, False)
    for bad, match in (("bogus", "unknown sharing mode"), ("sgt:lam", "mode:field=value"),
                       ("sgt:lambda=1", "not a valid sgt variant"), ("sgt:lam=-1", "not a valid sgt variant"),
                       ("sgt:guard.bogus=1", "not a valid sgt variant"), ("bogus-unguarded", "unknown sharing mode")):
        with pytest.raises(FailedPrecondition, match=match):
            mode_config(bad)


def test_a_variant_runs_under_its_own_name():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main([*ARGS, "--seeds", "2", "--modes", "none,xgrpo:uniform_groups=zero,sgt-unguarded", "--interference", "1"])
    result = json.loads(out.getvalue().strip().splitlines()[-1])["points"][0]
    modes = result["modes"]
    assert set(modes) == {"none", "xgrpo:uniform_groups=zero", "sgt-unguarded"}
    assert "xgrpo_uniform" in modes["xgrpo:uniform_groups=zero"]["stats"]
    assert "guard_trust" in modes["xgrpo:uniform_groups=zero"]["stats"]         # guarded by default
    assert "guard_trust" not in modes["sgt-unguarded"]["stats"]
    assert result["point"]["interference"] == 1.0


def test_a_slow_policys_guided_contexts_keep_the_peer_groups_it_chose_them_for():
    """Under async a step lasts: b's lasts `speed` of a's steps. b chooses half its contexts from a's groups when its
    step starts and takes them when it ends, after a published `speed` newer versions (max_staleness 1): XGRPO still
    pools a's group on every guided context (PeerIndex.hold). (Full guidance: XGRPO's trust starts at 0.)"""
    from dataclasses import replace
    from mrl_research.lab.point import Settings
    from mrl_research.lab.run import run_one
    settings = Settings(contexts=32, prompts_per_step=4, steps=8, eval_every=4, probes=1)
    b = run_one(replace(Point(), speed=4), settings, "xgrpo:coupling=async:guard.guidance=full",
                seed=0)["policies"]["b"]["stats"]
    assert b["peer_guided"] > 1.5                            # a mean per step: 2 of 4 after the first step
    group = Point().group_size
    assert b["xgrpo_pooled"] >= group * (1 + b["peer_guided"] / settings.prompts_per_step)


def test_the_testbeds_async_inbox_offers_only_what_is_within_the_bound_as_the_trainers_does():
    """PeerInbox.offered prunes before it offers: a context whose only peer experience is a group older than the
    peer's own version lag is not chosen for guidance (its group would be dropped at the hold)."""
    from mrl.experience import new_experience
    from mrl.v1 import experience_pb2 as pb
    from mrl_research.lab.exchange import AsyncInbox

    def stats(version, prompt_id, rewards):
        return new_experience("run", "a", version, pb.GroupStats(prompt_id=prompt_id, group_id="g", rewards=rewards),
                              f"a.{version}.{prompt_id}")
    inbox = AsyncInbox(("group_stats",), max_staleness=1)
    inbox.deliver([stats(0, "old", [1.0, 0.0]), stats(3, "new", [1.0, 0.0])])
    assert inbox.offered() == ["new"]
    inbox.hold(["new"])
    assert list(inbox.index.entries) == ["new"] and inbox.index.held == {"new"}


@pytest.mark.parametrize("coupling", ["lockstep", "async"])
def test_a_mode_alone_takes_no_peer_experience_and_is_the_control_for_its_own_loss(coupling):
    """`-alone`: the mode without peers. Every mode's own loss is the trainer's (GRPO), so its -alone is solo
    exactly, guarded or not, and it pools no peer rollout."""
    from mrl_research.lab.point import Settings
    from mrl_research.lab.run import mode_config, run_one
    assert mode_config("hacpo-alone") == mode_config("hacpo")
    assert not mode_config("hacpo-unguarded-alone").guard.enabled
    assert mode_config("hacpo-alone-unguarded") == mode_config("hacpo-unguarded-alone")
    settings = Settings(contexts=6, prompts_per_step=3, steps=6, eval_every=2, probes=2)
    point = Point(interference=1.0)
    suffixes = {"none": "", "sgt": "-alone", "xgrpo": "-alone", "prp": "-alone", "hacpo": "-unguarded-alone"}
    runs = {mode: run_one(point, settings, f"{mode}:coupling={coupling}{suffix}", seed=1)
            for mode, suffix in suffixes.items()}
    for policy in ("a", "b"):
        solo = runs["none"]["policies"][policy]
        for spec in ("sgt", "xgrpo", "prp", "hacpo"):
            alone = runs[spec]["policies"][policy]
            assert (alone["curve"], alone["reward"], alone["grad_var"]) == \
                (solo["curve"], solo["reward"], solo["grad_var"]), spec
        assert runs["sgt"]["policies"][policy]["stats"]["sgt_accepted"] == 0
        assert runs["hacpo"]["policies"][policy]["stats"]["peer_samples"] == 0


@pytest.mark.parametrize("mode", ["prp", "sgt", "xgrpo", "hacpo"])
def test_an_async_mode_its_guard_trusts_not_at_all_trains_exactly_as_solo(mode):
    """The guard turns a peer it does not trust down to solo, the prompts included: at τ = 0 (τ_0 = 0 and η = 0) the
    peers choose none of the batch (guidance ⌊guided_share·τ·P⌋), so every own step is solo's, prompt for prompt.
    With `guard.guidance=full` they still choose up to ⌊guided_share·P⌋, and the run is not solo's."""
    from dataclasses import replace
    from mrl_research.lab.point import Settings
    from mrl_research.lab.run import run_one
    settings = Settings(contexts=16, prompts_per_step=4, steps=6, eval_every=2, probes=1)
    point = replace(Point(), speed=2)
    solo = run_one(point, settings, "none:coupling=async", seed=3)
    untrusted = f"{mode}:coupling=async:guard.initial_trust=0:guard.trust_rate=0"
    guarded = run_one(point, settings, untrusted, seed=3)
    for policy in ("a", "b"):
        run, alone = guarded["policies"][policy], solo["policies"][policy]
        assert run["stats"]["peer_guided"] == 0
        assert (run["curve"], run["reward"], run["grad_var"]) == (alone["curve"], alone["reward"], alone["grad_var"])
    full = run_one(point, settings, f"{untrusted}:guard.guidance=full", seed=3)
    assert full["policies"]["b"]["stats"]["peer_guided"] > 0
    assert full["policies"]["b"]["reward"] != solo["policies"]["b"]["reward"]


def test_an_async_run_measures_each_policy_over_its_own_steps_and_shares_by_guidance():
    from dataclasses import replace
    from mrl_research.lab.point import Settings
    from mrl_research.lab.run import mode_config, run_one
    cfg = mode_config("sgt:coupling=async:guided_share=0.5:lam=0.2")
    assert (cfg.coupling, cfg.guided_share, cfg.sgt.lam) == ("async", 0.5, 0.2)
    settings = Settings(contexts=6, prompts_per_step=3, steps=6, eval_every=2, probes=1, p_strong=0.99, p_weak=0.0)
    point = replace(Point(), gap=1.0, speed=3)
    run = run_one(point, settings, "sgt:coupling=async", seed=0)
    assert run["eval_steps"] == [0, 2, 4, 6] and run["rollouts"] == [0, 48, 96, 144]
    for policy in ("a", "b"):
        p = run["policies"][policy]
        assert len(p["curve"]) == 4 and len(p["reward"]) == 6 and p["grad_var"] is None
        assert p["stats"]["peer_guided"] > 0 and p["stats"]["sgt_rescued"] > 0
    a, b = run["policies"]["a"], run["policies"]["b"]
    assert (a["end_steps"], b["end_steps"]) == (18, 6)       # a went on for speed × steps: equal wall time
    assert b["end"] == b["curve"][-1] and 0.0 <= a["end"] <= 1.0
    unguided = run_one(point, settings, "sgt:coupling=async:guided_share=0", seed=0)
    assert all(unguided["policies"][k]["stats"]["peer_guided"] == 0 for k in ("a", "b"))
    with pytest.raises(InvalidArgument, match="speed 0"):
        replace(Point(), speed=0)


@pytest.mark.parametrize("args, message", [
    (["--seeds", "0"], "--seeds 0"),
    (["--first-seed", "-1"], "--first-seed -1"),
    (["--workers", "0"], "--workers 0"),
    (["--gap", "2"], "gap 2.0"),
    (["--overlap", "-0.1"], "overlap -0.1"),
    (["--staleness", "-1"], "staleness -1"),
    (["--group-size", "1"], "group_size 1"),
    (["--interference", "-1"], "interference -1.0"),
    (["--speed", "0"], "speed 0"),
    (["--tokenizers", "gpt2"], "tokenizers 'gpt2'"),
    (["--steps", "0"], "steps 0"),
    (["--contexts", "0"], "contexts 0"),
    (["--p-strong", "1.5"], "p_strong 1.5"),
    (["--lr", "0"], "lr 0.0"),
    (["--tune-lr", "0,0.15"], "lr 0.0"),
    (["--tune-lr", "0.15", "--lr", "0.3"], "--lr and --tune-lr"),
    (["--tune-lr", "0.15", "--tune-first-seed", "20"], "overlap the reported seeds 0–29"),
    (["--tune-lr", "0.15", "--tune-first-seed", "-1"], "--tune-first-seed -1"),
])
def test_a_bad_point_or_setting_is_a_clear_error_before_any_run(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["lab", "bandit", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "mrl lab bandit: error:" in err and message in err, err


def _json_of(args: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["lab", "bandit", "--quick", "--gap", "1", "--workers", "1", *args])
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_tune_lr_compares_every_mode_with_solo_at_its_best_rate_found_on_other_seeds(tmp_path):
    result = _json_of(["--modes", "none,sgt", "--tune-lr", "2.4,0.15", "--out", str(tmp_path)])
    point = result["points"][0]
    tuning = point["lr_tuning"]
    assert result["tune_lr"] == [0.15, 2.4] and tuning["seeds"] == [1000, 1002]
    for lr, final in tuning["solo_final"].items():      # solo alone on the tuning seeds, at each rate
        alone = _json_of(["--modes", "none", "--lr", lr, "--first-seed", "1000"])["points"][0]["modes"]["none"]
        assert final == alone["final_mean"], lr
    best = max(tuning["solo_final"], key=tuning["solo_final"].get)
    assert tuning["solo_final"]["2.4"] != tuning["solo_final"]["0.15"] and point["lr"] == float(best)
    at_best = _json_of(["--modes", "none,sgt", "--lr", best])["points"][0]["modes"]    # the reported seeds 0–2
    for mode in ("none", "sgt"):
        assert point["modes"][mode]["finals"] == at_best[mode]["finals"], mode
    assert f"lr {best}, solo's best on seeds 1000–1002" in (tmp_path / "report.md").read_text()


def test_tune_lr_takes_the_smallest_of_rates_where_solo_ends_level():
    point = _json_of(["--modes", "none", "--tune-lr", "2e-6,1e-6"])["points"][0]     # too small to move: level
    assert point["lr_tuning"]["solo_final"] == {"1e-06": 0.5, "2e-06": 0.5} and point["lr"] == 1e-6
