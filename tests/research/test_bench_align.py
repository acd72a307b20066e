"""Smoke test of `mrl bench align --quick` (mrl_research.bench.align.main): it runs end to end over the real
cached tokenizers (`make tokenizers`) and ends with one JSON line of positive figures. No speed threshold."""
import json

from mrl_research.bench import align as bench
from mrl_tokenizer_align import catalog


def test_bench_align_quick_ends_with_one_json_line(capsys):
    missing = sorted({t for pair in bench.PAIRS for t in pair} - set(catalog.cached_paths()))
    assert not missing, f"tokenizers {missing} are not in {catalog.cache_dir()}: run `make tokenizers`"
    bench.main(quick=True)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("mrl bench align: ")
    result = json.loads(lines[-1])
    assert result["bench"] == "align" and result["quick"] is True and result["machine"]
    assert result["target"] == 0.67 and isinstance(result["pass"], bool)
    assert result["pass"] == (result["ratio"] >= result["target"])
    assert result["anchor"]
    for key in ("ratio", "align_tokens_per_s", "anchor_tokens_per_s", "source_tokens"):
        assert result[key] > 0, key
    assert set(result["pairs"]) == {f"{s}->{d}" for s, d in bench.PAIRS}
    for name, row in result["pairs"].items():
        for key in ("align_tokens_per_s", "anchor_tokens_per_s", "ratio", "responses", "source_tokens", "mean_chunks",
                    "one_to_one_share", "mean_source_tokens_per_chunk", "mean_target_tokens_per_chunk"):
            assert row[key] > 0, (name, key)
        assert 0 <= row["one_to_one_byte_share"] <= 1 and 0 <= row["lossless_share"] <= 1
        assert row["source_tokens"] >= row["responses"] * bench.MIN_TOKENS * 0.9
        # byte-exact pairs are lossless on this text; WordPiece (lowercasing, [UNK]) never is
        assert row["lossless_share"] == (0.0 if name.endswith("minilm") else 1.0), name


def test_bench_texts_are_deterministic():
    import random
    a, b = bench.make_text(random.Random(3), 200), bench.make_text(random.Random(3), 200)
    assert a == b and len(a.split()) >= 150
