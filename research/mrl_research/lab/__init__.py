"""The lab: fast testbeds of the sharing modes (`mrl lab ...`).

    mrl lab bandit        a contextual bandit: two tiny token-level policies over real tokenizers, co-trained
                          by the trainer's own sharing-mode code (docs/results/bandit.md)

    point.py     the sweep axes and the fixed settings
    bandit.py    the environment (contexts, verifier, competence) and the tabular policy
    exchange.py  peer experience as the trainer receives it (step_experiences → inbox → to_peer_batch, THL core)
    run.py       the experiment loop (one run per point, mode, seed; the trainer's own mrl_trainer.update on
                 the tabular policy) and the process pool
    stats.py     means, 95% t-intervals, Δ vs solo, rollouts to solo
    figures.py   the trade-off figure, the success curves and the page
    cli.py       the command
"""
