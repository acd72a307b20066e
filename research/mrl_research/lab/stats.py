"""Seeds → one sweep point's summary: means with 95% t-intervals, improvement over solo, rollouts to solo.

    team success s_seed(t) = mean over the two policies of their greedy success at eval step t
    final                  = s_seed(T)  (also listed per seed: finals, seed_ids, for paired comparisons of two modes)
    CI                     = the 95% t-interval over the n seeds (intervals.mean_ci; success clipped to [0, 1])
    Δ solo                 = mean over seeds of final_mode − final_none (paired: a seed gives both modes the same
                             contexts, competence and initial policies), with its t-interval
    rollouts_to_solo       = the first eval point at which the mode's seed-mean success curve reaches solo's
                             final seed-mean, in own rollouts per policy (t·P·G); None if it never does
    grad_var, grad_rel_var = run.py's, mean over the two policies, then over seeds (t-interval)
    stats                  = each logged statistic, mean over the two policies (per policy: cumulative ones
                             summed over the run), then over seeds
    policies               = per policy: final (as above), and `end`: its greedy success when the run ended,
                             after end_steps own steps (the faster policy under async: speed·T, equal wall
                             time), mean and t-interval, and the per-seed values (ends) for paired comparisons
"""
from mrl_launcher.analysis import rollouts_to
from mrl_launcher.intervals import mean_ci
from mrl_research.lab.run import POLICIES, team_final
from mrl_trainer.update import TIMINGS

__all__ = ["summarize_point", "SHARING_KEYS"]

_SKIP = {"loss", "active", "extras", "skipped", "clip_low", "clip_high", "ratio_mean", "reward_mean",
         *TIMINGS}                 # seconds: the testbed's results are deterministic, its timings are not


def _sharing_keys() -> frozenset:
    from mrl_trainer.sharing import stat_labels
    return frozenset(stat_labels())


SHARING_KEYS = _sharing_keys()   # every statistic a sharing mode or the coordination with peers logs


def _team(run: dict, key: str) -> list[float]:
    curves = [run["policies"][p][key] for p in POLICIES]
    return [sum(vals) / len(vals) for vals in zip(*curves)]


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarize_point(runs: dict[str, list[dict]]) -> dict:
    """{mode: [runs sorted by seed]} → {mode: summary} (module docstring)."""
    solo = runs.get("none")
    solo_final = {r["seed"]: team_final(r) for r in solo} if solo else {}
    solo_mean = sum(solo_final.values()) / len(solo_final) if solo_final else None
    out = {}
    for mode, seeds in runs.items():
        rollouts = seeds[0]["rollouts"]
        curves = [_team(r, "curve") for r in seeds]
        finals = [c[-1] for c in curves]
        m, lo, hi = mean_ci(finals, 0.0, 1.0)
        band = [mean_ci(list(col), 0.0, 1.0) for col in zip(*curves)]
        entry = {"final_mean": m, "final_ci": [lo, hi], "initial_mean": band[0][0], "seeds": len(seeds),
                 "finals": finals, "seed_ids": [r["seed"] for r in seeds],
                 "curve": {"rollouts": rollouts, "mean": [b[0] for b in band], "lo": [b[1] for b in band],
                           "hi": [b[2] for b in band]}}
        if solo_final:
            d, dlo, dhi = mean_ci([c[-1] - solo_final[r["seed"]] for c, r in zip(curves, seeds)])
            entry.update(delta_solo=d, delta_solo_ci=[dlo, dhi])
            entry["rollouts_to_solo"] = rollouts_to(entry["curve"], solo_mean, tolerance=1e-12)
        for key in ("grad_var", "grad_rel_var"):
            values = [_mean([r["policies"][p][key] for p in POLICIES]) for r in seeds]
            if all(v is not None for v in values):
                g, glo, ghi = mean_ci(values, 0.0)
                entry.update({key: g, f"{key}_ci": [glo, ghi]})
        entry["reward_mean"] = _mean([_mean(_team(r, "reward")) for r in seeds])
        keys = sorted({k for r in seeds for p in POLICIES for k in r["policies"][p]["stats"]} - _SKIP)
        entry["stats"] = {k: _mean([_mean([r["policies"][p]["stats"].get(k) for p in POLICIES]) for r in seeds])
                          for k in keys}
        entry["policies"] = {}
        for p in POLICIES:
            pm, plo, phi = mean_ci([r["policies"][p]["curve"][-1] for r in seeds], 0.0, 1.0)
            ends = [r["policies"][p]["end"] for r in seeds]
            em, elo, ehi = mean_ci(ends, 0.0, 1.0)
            entry["policies"][p] = {"tokenizer": seeds[0]["policies"][p]["tokenizer"], "final_mean": pm,
                                    "final_ci": [plo, phi],
                                    "initial_mean": _mean([r["policies"][p]["curve"][0] for r in seeds]),
                                    "end_steps": seeds[0]["policies"][p]["end_steps"], "end_mean": em,
                                    "end_ci": [elo, ehi], "ends": ends}
        out[mode] = entry
    return out
