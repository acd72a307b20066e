"""mrl_trainer: one policy's GRPO-family RL trainer (docs/architecture.md, docs/algorithms.md)."""
