"""Integrations of other RL frameworks' trainers with a mutual run; each is an optional extra.

    mrl.integrations.trl    TRL's GRPOTrainer joins a run (pip install ./sdk[trl]): docs/trl.md

Nothing here is imported by `import mrl`: each module imports its framework (torch, trl) itself.
"""
