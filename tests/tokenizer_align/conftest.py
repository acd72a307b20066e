"""Fixtures of the THL tests: every catalogued tokenizer's vocabulary, loaded once per session."""
import pytest

class Vocabs(dict):
    """id -> Vocab; a short repr, since hypothesis prints fixtures of failing examples."""

    def __repr__(self):
        return f"Vocabs({sorted(self)})"


@pytest.fixture(scope="session")
def vocabs() -> Vocabs:
    """Every catalogued tokenizer, loaded once per session; a missing one fails (the Makefile fetches them)."""
    from mrl_tokenizer_align import catalog
    from mrl_tokenizer_align.vocab import load_vocab
    paths = catalog.cached_paths()
    missing = sorted(set(catalog.CATALOG) - set(paths))
    if missing:
        pytest.fail(f"tokenizers {missing} are not in {catalog.cache_dir()}: run `make tokenizers`")
    return Vocabs({tid: load_vocab(tid, path) for tid, path in paths.items()})
