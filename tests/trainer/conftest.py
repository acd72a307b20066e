"""Fixtures of the trainer tests: none of their own; they start no service (the registry test reads the
launcher's CLI to check every sharing mode is offered)."""
