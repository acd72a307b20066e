"""`mrl lab bandit`: the contextual-bandit testbed of the sharing modes (entry point "lab.bandit"); `mrl lab signal`:
the GRPO signal of a policy's sampled groups (entry point "lab.signal"); `mrl lab pair`: what two policies can give
each other on a task (entry point "lab.pair"); `mrl lab step`: what one update does to the answers it rewards
(entry point "lab.step")."""
from mrl_launcher.arguments import floats, ints

__all__ = ["bandit", "signal", "pair", "step"]

QUICK = dict(contexts=6, prompts_per_step=3, steps=6, eval_every=2, probes=3, probe_at=(0.0,))


def bandit(parser):
    """contextual-bandit testbed: every sharing mode on tiny tabular policies over real tokenizers, seeds in parallel"""
    from mrl_research.lab.point import Point, default_workers
    d = Point()
    parser.add_argument("--sweep", action="store_true", help="the full sweep: the default point, then one axis at "
                                                             "a time (gap, overlap, staleness, tokenizers, G, interference)")
    parser.add_argument("--quick", action="store_true", help="a tiny run (3 seeds, 6 steps, 6 contexts): for tests")
    parser.add_argument("--seeds", type=int, help="seeds per mode and point (default 30; --quick 3)")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed, first-seed + 1, … (default "
                                                                   "0; tune on other seeds than you report)")
    parser.add_argument("--modes", help="comma-separated sharing modes or variants, mode:field=value[:…] (e.g. "
                                        "xgrpo:uniform_groups=zero; a suffix -unguarded: without the guard, "
                                        "-alone: without peers, the control for the rest of the mode's update; "
                                        "default: every registered mode)")
    parser.add_argument("--workers", type=int, default=default_workers(), help="processes (default: every core)")
    parser.add_argument("--out", help="write bandit.json, tradeoff.png, curves.png and report.md here")
    axes = parser.add_argument_group("the point (with --sweep: the point the sweep varies around)")
    axes.add_argument("--gap", type=float, default=d.gap, help="competence gap: share of contexts where exactly "
                                                               "one policy is strong (%(default)s)")
    axes.add_argument("--overlap", type=float, default=d.overlap, help="support overlap: share of b's answers in "
                                                                       "a's format (%(default)s)")
    axes.add_argument("--staleness", type=int, default=d.staleness, help="peer experience from k steps ago "
                                                                         "(%(default)s)")
    axes.add_argument("--tokenizers", default=d.tokenizers, help="a's/b's tokenizer ids (%(default)s; gpt2/gpt2: "
                                                                 "no mismatch)")
    axes.add_argument("--group-size", type=int, default=d.group_size, help="G (%(default)s)")
    axes.add_argument("--interference", type=float, default=d.interference,
                      help="β, weight of a logit table shared by all contexts (%(default)s: contexts independent)")
    axes.add_argument("--speed", type=int, default=d.speed,
                      help="a's steps per step of b under the async coupling (a mode spec with coupling=async, "
                           "e.g. sgt:coupling=async; %(default)s)")
    more = parser.add_argument_group("settings")
    more.add_argument("--steps", type=int)
    more.add_argument("--contexts", type=int)
    more.add_argument("--p-strong", type=float, help="initial success on a policy's strong contexts (0.5)")
    more.add_argument("--p-weak", type=float, help="initial success on its weak contexts (0.02)")
    more.add_argument("--lr", type=float, help="AdamW's learning rate of every policy (0.15)")
    more.add_argument("--tune-lr", type=floats, metavar="LR,LR,…",
                      help="solo's learning rate tuned per point: GRPO alone runs at each of these rates on the "
                           "tuning seeds, and every mode runs at the rate where solo ended highest (so sharing is "
                           "compared with solo at its best; e.g. 0.0375,0.075,0.15,0.3,0.6,1.2,2.4)")
    more.add_argument("--tune-first-seed", type=int, default=1000,
                      help="with --tune-lr: the tuning seeds are tune-first-seed, … (as many as --seeds; default "
                           "%(default)s; they may not overlap the reported seeds)")

    def run(args) -> None:
        import time
        start = time.perf_counter()
        import json
        import sys
        from dataclasses import asdict, replace

        from mrl_research.lab.figures import point_title, write_page
        from mrl_research.lab.point import Settings, sweep_points
        from mrl_research.lab.run import run_points, tuned_learning_rates
        from mrl_research.lab.stats import summarize_point
        from mrl_trainer.sharing import SHARING_MODES
        from mrl.errors import InvalidArgument
        for name, least in (("seeds", 1), ("workers", 1), ("first_seed", 0), ("tune_first_seed", 0)):
            if getattr(args, name) is not None and getattr(args, name) < least:
                raise InvalidArgument(f"--{name.replace('_', '-')} {getattr(args, name)}: expected at least {least}")
        settings = Settings(**QUICK) if args.quick else Settings()
        overrides = {k: getattr(args, k) for k in ("steps", "contexts", "p_strong", "p_weak", "lr")
                     if getattr(args, k) is not None}
        settings = replace(settings, **overrides)
        base = Point(gap=args.gap, overlap=args.overlap, staleness=args.staleness, tokenizers=args.tokenizers,
                     group_size=args.group_size, interference=args.interference, speed=args.speed)
        points = sweep_points(base) if args.sweep else [base]
        modes = args.modes.split(",") if args.modes else list(SHARING_MODES)
        seeds = list(range(args.first_seed, args.first_seed + (args.seeds or (3 if args.quick else 30))))
        tuning = None
        if args.tune_lr:
            if args.lr is not None:
                raise InvalidArgument("--lr and --tune-lr: give one rate or the rates to tune over, not both")
            rates = sorted(set(args.tune_lr))
            tuning = list(range(args.tune_first_seed, args.tune_first_seed + len(seeds)))
            if set(tuning) & set(seeds):
                raise InvalidArgument(f"--tune-first-seed {args.tune_first_seed}: the tuning seeds "
                                      f"{tuning[0]}–{tuning[-1]} overlap the reported seeds {seeds[0]}–{seeds[-1]}; "
                                      "tune on other seeds than you report")
            for lr in rates:
                replace(settings, lr=lr)      # InvalidArgument on a rate that is not one
        print(f"mrl lab bandit: {len(points)} point(s) × {len(modes)} modes × {len(seeds)} seeds, "
              f"{settings.steps} steps of {settings.prompts_per_step} contexts × G, {args.workers} worker(s)",
              flush=True)
        per_point = settings
        if not tuning:
            print(f"every policy at lr {settings.lr:g}, solo's too: not tuned, so a gain over solo may be a slow solo "
                  "(--tune-lr compares with solo at its best rate)", flush=True)
        else:
            print(f"solo's learning rate per point, from {', '.join(map(str, rates))} on seeds "
                  f"{tuning[0]}–{tuning[-1]}:", flush=True)
            tuned = tuned_learning_rates(points, settings, rates, tuning, args.workers)
            for point, t in zip(points, tuned):
                print(f"  {point_title(asdict(point))}: lr {t['lr']:g} (solo "
                      + ", ".join(f"{lr:g} → {v:.3f}" for lr, v in t["solo_final"].items()) + ")", flush=True)
            per_point = [replace(settings, lr=t["lr"]) for t in tuned]
        summaries: list[dict | None] = [None] * len(points)
        cpu = [0.0]

        def on_point(index: int, runs: dict) -> None:
            cpu[0] += sum(r["cpu_s"] for seeds_ in runs.values() for r in seeds_)
            summaries[index] = {"point": asdict(points[index]), "modes": summarize_point(runs)}
            if tuning:
                t = tuned[index]
                summaries[index]["lr"] = t["lr"]
                summaries[index]["lr_tuning"] = {"seeds": [tuning[0], tuning[-1]],
                                                 "solo_final": {f"{lr:g}": v for lr, v in t["solo_final"].items()}}
            print(f"point {index + 1}/{len(points)}: {point_title(summaries[index]['point'])} "
                  f"{'(lr ' + format(tuned[index]['lr'], 'g') + ') ' if tuning else ''}"
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
            for mode, e in summaries[index]["modes"].items():
                print("  " + _line(mode, e), flush=True)

        run_points(points, per_point, modes, seeds, args.workers, on_point)
        seconds = time.perf_counter() - start
        result = {"points": summaries, "settings": asdict(settings), "seeds": len(seeds), "seconds": seconds,
                  "run_cpu_seconds": cpu[0], "workers": args.workers}
        if tuning:      # each point's "lr" replaces settings.lr there
            result["tune_lr"] = rates
        if args.out:
            command = "mrl lab bandit " + " ".join(sys.argv[sys.argv.index("bandit") + 1:]) \
                if "bandit" in sys.argv else "mrl lab bandit"
            print(f"page: {write_page(result, args.out, command)}", flush=True)
        print(f"done in {seconds:.1f} s ({cpu[0]:.0f} CPU s in the runs, {args.workers} workers)", flush=True)
        print(json.dumps(result), flush=True)
    return run


def _line(mode: str, e: dict) -> str:
    def f(x, spec=".3f"):
        return "–" if x is None else format(x, spec)
    s = e["stats"]
    parts = [f"{mode:6s} success {f(e['final_mean'])} [{f(e['final_ci'][0])}, {f(e['final_ci'][1])}]"]
    if "delta_solo" in e:
        parts.append(f"Δsolo {f(e['delta_solo'], '+.3f')} [{f(e['delta_solo_ci'][0], '+.3f')}, "
                     f"{f(e['delta_solo_ci'][1], '+.3f')}]")
        parts.append(f"to-solo {f(e.get('rollouts_to_solo'), 'd')}")
    longer = {p: x for p, x in e["policies"].items() if x["end_steps"] != e["policies"]["b"]["end_steps"]}
    parts += [f"{p} at the end ({x['end_steps']} steps) {f(x['end_mean'])} [{f(x['end_ci'][0])}, {f(x['end_ci'][1])}]"
              for p, x in longer.items()]
    if e.get("grad_var") is not None:
        parts.append(f"grad-var {e['grad_var']:.2e} (rel {e['grad_rel_var']:.2f})")
    shown = {"prp_log_rho_var": "var log ρ", "prp_truncated": "ρ>c", "sgt_rescued": "rescues",
             "xgrpo_baseline_shift_abs": "|Δbaseline|", "hacpo_omega_mean": "ω", "hacpo_clipped": "clipped",
             "thl_one_to_one": "THL 1:1", "guard_agreement": "guard cos", "guard_projected": "projected", "guard_hindsight": "hindsight",
             "guard_trust": "τ", "guard_own_trust": "τ_own"}
    parts += [f"{label} {s[k]:.3g}" for k, label in shown.items() if s.get(k) is not None]
    return "  ".join(parts)


def signal(parser):
    """how much GRPO signal a policy's sampled groups carry on its task, per temperature and response length"""
    from mrl_trainer.cli import add_overrides
    parser.add_argument("config", help="YAML trainer config, e.g. examples/policy-a.yaml")
    parser.add_argument("--temperatures", default="1.0,0.7,0.4", type=floats,
                        help="comma-separated sampling temperatures, each > 0 (default %(default)s; greedy is always "
                             "measured too)")
    parser.add_argument("--max-new-tokens", type=ints, help="comma-separated response lengths L (default: the "
                                                            "config's rollout.max_new_tokens)")
    parser.add_argument("--prompts", type=int, default=16, help="the first P training prompts (default %(default)s)")
    add_overrides(parser)

    def run(args) -> None:
        import json

        from mrl_research.lab.grpo_signal import measure
        from mrl_trainer.app import parse_overrides

        def show(row: dict) -> None:
            what = "greedy" if row["temperature"] == 0 else f"T {row['temperature']:g}"
            print(f"{what:>8s}  L {row['max_new_tokens']:4d}  G {row['group_size']:2d}  success {row['success']:.3f}  "
                  f"informative {row['informative']:.3f} (expected {row['expected']:.3f})  truncated "
                  f"{row['truncated']:.3f}  tokens {row['tokens']:.1f}  {row['seconds']:.1f} s", flush=True)

        result = measure(args.config, args.temperatures, args.max_new_tokens, prompts=args.prompts,
                         overrides=parse_overrides(args.overrides), on_row=show)
        if result["resumed_from"]:
            print(f"(the policy of checkpoint {result['resumed_from']}, on the prompts of step {result['step']})",
                  flush=True)
        print(json.dumps(result), flush=True)
    return run


def pair(parser):
    """what two policies can give each other on a task: their solve sets, overlap against chance, rescue shares"""
    from mrl_trainer.cli import add_overrides
    parser.add_argument("config_a", help="YAML trainer config of one policy")
    parser.add_argument("config_b", help="YAML trainer config of the other (the same task)")
    parser.add_argument("--prompts", type=int, default=64, help="the first P prompts of the split (default %(default)s)")
    parser.add_argument("--split", choices=["train", "eval"], default="train",
                        help="train: the prompts the runs train on (what SGT can rescue); eval: held-out ones (what "
                             "each policy can do, not only answers it fitted) (default %(default)s)")
    add_overrides(parser, "a config field of both policies")
    parser.add_argument("--set-a", dest="overrides_a", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field of the first policy only (after --set)")
    parser.add_argument("--set-b", dest="overrides_b", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field of the second policy only (after --set)")
    parser.add_argument("--out", help="also write the result (with the per-prompt sets) to this JSON file")

    def run(args) -> None:
        import json
        import pathlib

        from mrl_research.lab.pair import measure_pair
        from mrl_trainer.app import parse_overrides
        result = measure_pair(args.config_a, args.config_b, prompts=args.prompts, split=args.split,
                              overrides=parse_overrides(args.overrides),
                              overrides_a=parse_overrides(args.overrides_a),
                              overrides_b=parse_overrides(args.overrides_b))
        def show(figures: dict, indent: str) -> None:
            for side, other in (("a", "b"), ("b", "a")):
                x, share = figures[side], figures[side]["rescue_share"]
                print(f"{indent}{x['policy']}: greedy {x['greedy']:.3f}, sampled {x['sampled']:.3f}, all-fail "
                      f"groups {x['all_fail']}, of which {figures[other]['policy']} solves {x['rescuable']} (rescue "
                      f"share {'–' if share is None else format(share, '.3f')})", flush=True)
            for name in ("greedy_overlap", "solved_overlap"):
                o = figures[name]
                print(f"{indent}{name.replace('_', ' ')}: both {o['both']} (chance {o['chance']:.1f}), only "
                      f"{figures['a']['policy']} {o['only_a']}, only {figures['b']['policy']} {o['only_b']}",
                      flush=True)
        print(f"{result['task']}, the first {result['prompts']} {args.split} prompts", flush=True)
        show(result, "  ")
        for part, figures in result.get("per_part", {}).items():
            print(f"  {part} ({figures['prompts']} prompts)", flush=True)
            show(figures, "    ")
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "per_prompt"}), flush=True)
    return run


def step(parser):
    """what one update does to the answers it rewards, at several step sizes; --curve N: what N solo steps do"""
    from mrl_trainer.cli import add_overrides
    parser.add_argument("config", help="YAML trainer config, e.g. examples/pair-gemma3.yaml")
    parser.add_argument("--rules", default="adamw:2e-6,adamw:2e-5,sgd:0.01,sgd:0.03,sgd:0.1",
                        help="comma-separated update rules adamw:LR or sgd:LR, each one update from the same "
                             "weights on the same batch (default %(default)s)")
    parser.add_argument("--curve", type=int, metavar="N", help="instead of the rules: N solo GRPO steps at the "
                                                               "config's settings, the tuning answers after each")
    parser.add_argument("--problems", type=int, default=64, help="tuning problems, training split, past every "
                                                                 "prompt a run takes (default %(default)s)")
    parser.add_argument("--search", type=int, default=16, help="look for a batch with a signal in the next N "
                                                               "training steps (default %(default)s)")
    add_overrides(parser, "a config field")
    parser.add_argument("--out", help="also write the result to this JSON file")

    def run(args) -> None:
        import json
        import pathlib

        from mrl_research.lab.step import measure_curve, measure_step
        from mrl_trainer.app import parse_overrides

        def parts(row: dict) -> str:
            return "".join(f", {part} {p:.4f}" for part, p in row["p_tuning_parts"].items())

        def show(row: dict) -> None:
            grad = "" if row["grad_norm"] is None else f", gradient norm {row['grad_norm']:.3f}"
            print(f"  {row['rule']:>12}: p(verified samples) {row['p_rewarded']:.4f} (log {row['logp_rewarded']:.3f}), "
                  f"p(tuning answers) {row['p_tuning']:.4f}{parts(row)}, moved {row['moved']:.4f}{grad}", flush=True)

        def show_step(row: dict) -> None:
            reward = "" if row["reward_mean"] is None else (f", reward {row['reward_mean']:.3f}"
                                                             f"{'' if row['updated'] else ' (no update)'}")
            print(f"  step {row['step']}{reward}: p(tuning answers) {row['p_tuning']:.4f}{parts(row)}", flush=True)
        overrides = parse_overrides(args.overrides)
        if args.curve is not None:
            result = measure_curve(args.config, args.curve, problems=args.problems, overrides=overrides,
                                   on_row=show_step)
        else:
            result = measure_step(args.config, [r for r in args.rules.split(",") if r], problems=args.problems,
                                  search=args.search, overrides=overrides, on_row=show)
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result), flush=True)
    return run
