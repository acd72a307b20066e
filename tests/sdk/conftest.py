"""Fixtures of the SDK tests: none of their own (the shared ones are in tests/conftest.py); the SDK modules
they test import no service, though tests/sdk/test_cli.py builds the `mrl` command of every installed package."""
