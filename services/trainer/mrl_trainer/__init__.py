"""mrl_trainer: one policy's GRPO-family RL trainer (DESIGN.md §2, §5)."""
