"""Hand-checked cases of THL's `align()` (docs/architecture.md) on the real cached tokenizers (`make tokenizers`):
identity, GPT-2 → Mistral chunks and every trace reduction, Gemma 3's digits, EOS mapping, sampled non-canonical
ids, a generation cut inside a character, a WordPiece target, prompt joining, and the errors of bad input."""
import numpy as np
import pytest

from mrl.errors import InvalidArgument
from mrl_tokenizer_align.align import Trace, align

SENTENCE = "The quick brown fox jumps over 12345 lazy dogs."


@pytest.fixture(scope="module")
def gpt2(vocabs):
    return vocabs["gpt2"]


@pytest.fixture(scope="module")
def mistral(vocabs):
    return vocabs["mistral-v1"]


def _pieces(vocab, ids):
    return [vocab.token_bytes(np.asarray([i])) for i in ids]


def _id_of(vocab, piece: bytes) -> int:
    """The id whose bytes are `piece` (a non-special token), from the byte tables."""
    ids = vocab.encode(piece.decode())
    if len(ids) == 1 and vocab.token_bytes(ids) == piece:
        return int(ids[0])
    for i in np.flatnonzero(vocab.lens == len(piece)):
        if vocab.token_bytes(np.asarray([i])) == piece:
            return int(i)
    raise AssertionError(f"{piece!r} is not one token of {vocab.tokenizer_id}")


# -- identity ----------------------------------------------------------------------------------
@pytest.mark.parametrize("tid", ["gpt2", "qwen", "mistral-v1", "smollm2", "gemma3"])
def test_identical_tokenizer_maps_chunks_one_to_one_and_keeps_traces(vocabs, tid):
    vocab = vocabs[tid]
    ids = vocab.encode(SENTENCE + " Ünïcödé 😀 日本語\n\n  x")
    n = len(ids)
    lp = -np.arange(1, n + 1) / 8
    mask = (np.arange(n) % 3 != 0).astype(np.float64)
    adv = np.linspace(-1, 1, n)
    out = align(vocab, ids, vocab, [Trace("lp", lp, "sum"), Trace("mask", mask, "all"), Trace("adv", adv, "mean"),
                                    Trace("reward", np.full(n, 0.75), "broadcast")])
    np.testing.assert_array_equal(out.target_ids, ids)
    assert out.response_start == 0
    np.testing.assert_array_equal(out.source_chunk, np.arange(n))
    np.testing.assert_array_equal(out.target_chunk, np.arange(n))
    for trace, expected in zip(out.traces, (lp, mask, adv, np.full(n, 0.75))):
        np.testing.assert_array_equal(trace.values, expected, err_msg=trace.name)
    r = out.residual
    assert r.lossless and not r.source_noncanonical and not r.normalizer_mismatch
    assert (r.chunks, r.one_to_one_share, r.one_to_one_byte_share) == (n, 1.0, 1.0)
    assert r.max_source_tokens_per_chunk == r.max_target_tokens_per_chunk == 1
    assert r.invalid_utf8_bytes == r.dropped_bytes == 0


# -- GPT-2 → Mistral, by hand ------------------------------------------------------------------
def test_gpt2_to_mistral_known_sentence(gpt2, mistral):
    ids = gpt2.encode(SENTENCE)
    assert _pieces(gpt2, ids) == [b"The", b" quick", b" brown", b" fox", b" jumps", b" over", b" 123", b"45", b" lazy",
                                  b" dogs", b"."]
    out = align(gpt2, ids, mistral)
    np.testing.assert_array_equal(out.target_ids, mistral.encode(SENTENCE))
    assert _pieces(mistral, out.target_ids) == [b" The", b" quick", b" brown", b" f", b"ox", b" j", b"umps", b" over",
                                                b" ", b"1", b"2", b"3", b"4", b"5", b" lazy", b" dogs", b"."]
    # Mistral's invented leading space is not text: " The" ends where "The" ends.
    np.testing.assert_array_equal(out.source_chunk, np.arange(11))
    np.testing.assert_array_equal(out.target_chunk, [0, 1, 2, 3, 3, 4, 4, 5, 6, 6, 6, 6, 7, 7, 8, 9, 10])
    assert out.text == SENTENCE
    r = out.residual
    assert r.lossless and not r.normalizer_mismatch and not r.source_noncanonical
    assert r.chunks == 11 and r.max_source_tokens_per_chunk == 1 and r.max_target_tokens_per_chunk == 4
    assert r.one_to_one_share == pytest.approx(7 / 11)
    assert r.mean_target_tokens_per_chunk == pytest.approx(17 / 11)
    # bytes of 1:1 chunks: The, quick, brown, over, lazy, dogs, "." = 3+6+6+5+5+5+1 of 47
    assert r.one_to_one_byte_share == pytest.approx(31 / 47)


def test_gemma3_splits_digits_one_per_token_and_round_trips_through_gpt2(vocabs, gpt2):
    """Gemma 3's SentencePiece (262k pieces, converted from its GGUF) invents no leading space and spells every
    digit alone: GPT-2's " 12" is one chunk of Gemma's " ", "1", "2", and the way back gives Gemma's own ids."""
    gemma3 = vocabs["gemma3"]
    assert (gemma3.family, gemma3.byte_exact, gemma3.dummy_prefix, gemma3.vocab_size) == (
        "sentencepiece", True, False, 262144)
    text = "Hello, world! 12+34=46"
    ids = gemma3.encode(text)
    assert _pieces(gemma3, ids) == [b"Hello", b",", b" world", b"!", b" ", b"1", b"2", b"+", b"3", b"4", b"=",
                                    b"4", b"6"]
    lp = -np.arange(1, 14) / 8                                           # dyadic: float sums are exact
    out = align(gemma3, ids, gpt2, [Trace("lp", lp, "sum")])
    assert out.text == text and out.residual.lossless and out.residual.chunks == 9
    assert _pieces(gpt2, out.target_ids) == [b"Hello", b",", b" world", b"!", b" 12", b"+", b"34", b"=", b"46"]
    np.testing.assert_array_equal(out.source_chunk, [0, 1, 2, 3, 4, 4, 4, 5, 6, 6, 7, 8, 8])
    np.testing.assert_array_equal(out.traces[0].values, [lp[0], lp[1], lp[2], lp[3], lp[4:7].sum(), lp[7],
                                                         lp[8:10].sum(), lp[10], lp[11:].sum()])
    np.testing.assert_array_equal(align(gpt2, out.target_ids, gemma3).target_ids, ids)
    # Gemma's <eos> and its end-of-turn tag both end a sequence: each becomes GPT-2's <|endoftext|>, and back
    for end in (gemma3.eos_id, gemma3.specials["<end_of_turn>"]):
        assert align(gemma3, np.append(ids, end), gpt2).target_ids[-1] == gpt2.eos_id
    assert align(gpt2, np.append(gpt2.encode(text), gpt2.eos_id), gemma3).target_ids[-1] == gemma3.eos_id


def test_gpt2_to_mistral_sum_is_conserved_per_chunk_on_its_last_target_token(gpt2, mistral):
    ids = gpt2.encode(SENTENCE)
    lp = -np.arange(1, 12) / 8                                           # dyadic: float sums are exact
    out = align(gpt2, ids, mistral, [Trace("lp", lp, "sum")])
    expected = np.zeros(17)
    last_of_chunk = [0, 1, 2, 4, 6, 7, 11, 13, 14, 15, 16]                 # last Mistral token of chunks 0..10
    expected[last_of_chunk] = lp
    np.testing.assert_array_equal(out.traces[0].values, expected)
    assert out.traces[0].values.sum() == lp.sum()


def test_multi_source_token_chunk_sums_exactly(gpt2, mistral):
    # Mistral (source) splits " fox" into " f"+"ox" and "12345" into digits; GPT-2 (target) has " fox", " 123", "45".
    ids = mistral.encode(SENTENCE)
    lp = -np.arange(1, len(ids) + 1) / 4
    out = align(mistral, ids, gpt2, [Trace("lp", lp, "sum")])
    np.testing.assert_array_equal(out.target_ids, gpt2.encode(SENTENCE))  # SentencePiece's invented space dropped
    v = out.traces[0].values
    assert v.sum() == lp.sum()
    pieces = _pieces(gpt2, out.target_ids)
    assert v[pieces.index(b" fox")] == lp[3] + lp[4]
    assert v[pieces.index(b" 123")] == lp[8:12].sum()
    assert v[pieces.index(b"45")] == lp[12] + lp[13]


def test_masks_are_conservative_mean_and_broadcast(gpt2, mistral):
    ids = gpt2.encode(SENTENCE)
    n = len(ids)
    mask = np.ones(n)
    mask[6] = 0.0                                                           # " 123" → Mistral " ", "1", "2", "3"
    adv = np.arange(n, dtype=np.float64)
    out = align(mistral, mistral.encode(SENTENCE), gpt2, [Trace("mask", np.ones(17), "all")])
    assert (out.traces[0].values == 1).all()
    out = align(gpt2, ids, mistral, [Trace("mask", mask, "all"), Trace("adv", adv, "mean"),
                                     Trace("reward", np.full(n, 0.5), "broadcast")])
    m, a, b = (t.values for t in out.traces)
    np.testing.assert_array_equal(m, (out.target_chunk != 6).astype(np.float64))
    np.testing.assert_array_equal(a, out.target_chunk.astype(np.float64))  # one source token per chunk here
    assert (b == 0.5).all() and len(b) == 17

    # Mistral as source: chunk " 123" has four Mistral tokens; one masked masks GPT-2's " 123", and MEAN averages.
    mids = mistral.encode(SENTENCE)
    mmask = np.ones(len(mids))
    mmask[10] = 0.0                                                         # "2"
    madv = np.arange(len(mids), dtype=np.float64)
    out = align(mistral, mids, gpt2, [Trace("mask", mmask, "all"), Trace("adv", madv, "mean")])
    pieces = _pieces(gpt2, out.target_ids)
    m, a = out.traces[0].values, out.traces[1].values
    assert m[pieces.index(b" 123")] == 0.0 and m.sum() == len(pieces) - 1
    assert a[pieces.index(b" 123")] == madv[8:12].mean()
    assert a[pieces.index(b" fox")] == (3 + 4) / 2


# -- specials ----------------------------------------------------------------------------------
def test_eos_at_the_end_maps_to_the_target_eos(gpt2, mistral):
    ids = np.append(gpt2.encode(SENTENCE), gpt2.eos_id)
    lp = -np.arange(1, len(ids) + 1) / 8
    out = align(gpt2, ids, mistral, [Trace("lp", lp, "sum"), Trace("mask", np.ones(len(ids)), "all")])
    assert out.target_ids[-1] == mistral.eos_id == 2
    np.testing.assert_array_equal(out.target_ids[:-1], mistral.encode(SENTENCE))
    assert out.traces[0].values[-1] == lp[-1]                              # EOS's log-prob moves with it
    assert out.source_chunk[-1] == out.target_chunk[-1] == out.target_chunk[-2] + 1   # a chunk of its own
    assert out.traces[0].values.sum() == lp.sum()
    assert len(out.traces[1].values) == len(out.target_ids)
    r = out.residual
    assert (r.mapped_specials, r.dropped_specials, r.truncated, r.lossless) == (1, 0, False, True)

    out = align(gpt2, ids[:-1], mistral, [Trace("lp", lp[:-1], "sum")])
    assert out.target_ids[-1] != mistral.eos_id
    assert (out.residual.mapped_specials, out.residual.truncated) == (0, True)


def test_a_special_inside_the_response_is_dropped(gpt2, vocabs):
    qwen = vocabs["qwen"]
    ids = np.concatenate([gpt2.encode("a b"), [gpt2.eos_id], gpt2.encode(" c")])
    lp = np.array([-1.0, -2.0, -4.0, -8.0])
    out = align(gpt2, ids, qwen, [Trace("lp", lp, "sum")])
    assert out.text == "a b c"
    np.testing.assert_array_equal(out.target_ids, qwen.encode("a b c"))
    assert not qwen.is_special[out.target_ids].any()
    r = out.residual
    assert (r.mapped_specials, r.dropped_specials, r.truncated) == (0, 1, True)
    assert out.traces[0].values.sum() == -1.0 - 2.0 - 8.0                   # the dropped special's value goes too


def test_special_token_text_in_the_response_is_plain_text_for_the_target(gpt2, vocabs):
    """A response that *says* "<|im_end|>" (ordinary GPT-2 tokens) must not become SmolLM2's special id."""
    smollm2 = vocabs["smollm2"]
    text = "Use <|im_end|> and <|endoftext|> to end."
    ids = gpt2.encode(text)
    assert not gpt2.is_special[ids].any()
    out = align(gpt2, ids, smollm2, [Trace("lp", -np.ones(len(ids)), "sum")])
    assert not smollm2.is_special[out.target_ids].any()
    assert smollm2.token_bytes(out.target_ids) == text.encode()
    assert out.residual.lossless and not out.residual.normalizer_mismatch
    assert out.traces[0].values.sum() == -len(ids)


# -- sampled ids -------------------------------------------------------------------------------
def test_noncanonical_source_ids_are_flagged_and_still_lossless(gpt2, mistral):
    canonical = gpt2.encode("hello world")
    assert _pieces(gpt2, canonical) == [b"hello", b" world"]
    ids = np.array([_id_of(gpt2, b"h"), _id_of(gpt2, b"ello"), canonical[1]])
    out = align(gpt2, ids, mistral, [Trace("lp", np.array([-0.5, -0.25, -1.0]), "sum")])
    assert out.text == "hello world"
    np.testing.assert_array_equal(out.target_ids, mistral.encode("hello world"))
    np.testing.assert_array_equal(out.source_chunk, [0, 0, 1])             # "h"+"ello" is one chunk: "hello"
    r = out.residual
    assert r.source_noncanonical and r.lossless and r.max_source_tokens_per_chunk == 2
    assert out.traces[0].values.sum() == -1.75
    assert align(gpt2, canonical, mistral).residual.source_noncanonical is False


def test_generation_cut_inside_a_character_is_residual_never_replaced(gpt2, mistral):
    ids = gpt2.encode("I like 😀")
    assert _pieces(gpt2, ids) == [b"I", b" like", b" \xf0\x9f\x98", b"\x80"]
    cut = ids[:-1]                                                          # the emoji's last byte never came
    lp = np.array([-1.0, -2.0, -4.0])
    out = align(gpt2, cut, mistral, [Trace("lp", lp, "sum")])
    assert "\ufffd" not in out.text and out.text == "I like "
    r = out.residual
    assert r.invalid_utf8_bytes == 3 and r.dropped_bytes == 3 and r.lossless is False
    assert mistral.token_bytes(out.target_ids) == b" I like "            # Mistral's dummy prefix, then the text
    assert out.traces[0].values.sum() == lp.sum()                           # the partial token's value stays
    assert "\ufffd" not in align(gpt2, cut, gpt2).text


def test_a_response_of_one_space_is_lossless_into_a_dummy_prefix_target(gpt2, mistral):
    """Mistral encodes "" as no token at all, so the one space cannot be left to its dummy prefix."""
    ids = gpt2.encode(" ")
    out = align(gpt2, ids, mistral, [Trace("lp", np.array([-0.5]), "sum")])
    assert out.residual.lossless and not out.residual.normalizer_mismatch
    assert mistral.token_bytes(out.target_ids) == b"  "                    # the invented space, then the text's
    assert out.traces[0].values.sum() == -0.5


def test_dummy_prefix_target_falls_back_to_offsets_on_a_meta_symbol(gpt2, mistral):
    """SentencePiece reads the text '▁' as its whitespace symbol: Mistral spells "a▁b" as "a b", not byte-exact."""
    ids = gpt2.encode("a▁b c")
    lp = -np.arange(1, len(ids) + 1) / 8
    out = align(gpt2, ids, mistral, [Trace("lp", lp, "sum")])
    r = out.residual
    assert r.lossless is False and r.normalizer_mismatch is True
    np.testing.assert_array_equal(out.target_ids, mistral.encode("a▁b c"))
    assert out.traces[0].values.sum() == lp.sum()
    assert (np.diff(out.target_chunk) >= 0).all()


# -- a target that is not byte-exact --------------------------------------------------------------
def test_wordpiece_target_is_lossy_but_aligned(gpt2, vocabs):
    minilm = vocabs["minilm"]
    assert not minilm.byte_exact
    text = "Héllo World, 12+34=46 😀!"
    ids = gpt2.encode(text)
    lp = -np.arange(1, len(ids) + 1) / 8
    out = align(gpt2, ids, minilm, [Trace("lp", lp, "sum"), Trace("mask", np.ones(len(ids)), "all")])
    r = out.residual
    assert r.lossless is False and r.normalizer_mismatch is True
    expected = minilm.encode(text)
    np.testing.assert_array_equal(out.target_ids, expected)
    assert not np.isin(out.target_ids, [0, 101, 102]).any()                # no [PAD], [CLS], [SEP]
    assert (out.target_ids == 100).sum() == 1                              # the emoji is WordPiece's [UNK]
    assert len(out.traces[0].values) == len(expected)
    assert out.traces[0].values.sum() == lp.sum()
    assert (np.diff(out.target_chunk) >= 0).all() and out.target_chunk[-1] == r.chunks - 1


def test_wordpiece_target_loses_no_log_prob_mass_at_the_end(gpt2, vocabs):
    """WordPiece drops trailing whitespace: the last chunk's source values still land on the last target token."""
    minilm = vocabs["minilm"]
    ids = gpt2.encode("Hello world \n\n")
    lp = -np.arange(1, len(ids) + 1) / 8
    out = align(gpt2, ids, minilm, [Trace("lp", lp, "sum"), Trace("mask", np.ones(len(ids)), "all")])
    np.testing.assert_array_equal(out.target_ids, minilm.encode("Hello world"))
    assert out.traces[0].values.sum() == lp.sum()
    assert out.target_chunk[-1] == out.source_chunk[-1] == out.residual.chunks - 1


def test_wordpiece_target_keeps_a_long_response_whole(gpt2, vocabs):
    """No padding and no truncation from the tokenizer file's defaults: every word of a long text is there."""
    minilm = vocabs["minilm"]
    text = " ".join(f"word{i}" for i in range(400))
    ids = gpt2.encode(text)
    out = align(gpt2, ids, minilm, [Trace("lp", -np.ones(len(ids)), "sum")])
    assert len(out.target_ids) > 400 and not minilm.is_special[out.target_ids].any()
    assert out.traces[0].values.sum() == -len(ids)
    assert out.target_chunk[-1] == out.residual.chunks - 1


def test_wordpiece_source_does_not_crash(vocabs, gpt2):
    minilm = vocabs["minilm"]
    ids = minilm.encode("Hello world, 12+34=46")
    assert not minilm.is_special[ids].any()
    out = align(minilm, ids, gpt2, [Trace("lp", -np.ones(len(ids)), "sum")])
    assert out.residual.lossless is False
    assert out.traces[0].values.sum() == -len(ids)


# -- prompt ------------------------------------------------------------------------------------
def test_target_prompt_ids_are_joined_at_the_id_level(gpt2, mistral):
    prompt = np.concatenate([[1], mistral.encode("[INST] What is 12+34? [/INST]")])
    ids = np.append(gpt2.encode(" 46"), gpt2.eos_id)
    lp = np.array([-0.5, -0.25])
    out = align(gpt2, ids, mistral, [Trace("lp", lp, "sum")], target_prompt_ids=prompt)
    assert out.response_start == len(prompt)
    np.testing.assert_array_equal(out.target_ids[:len(prompt)], prompt)
    response = out.target_ids[out.response_start:]
    # " 46" is Mistral's encoding of " 46": its invented space, then the text's own, then </s>.
    np.testing.assert_array_equal(response, np.append(mistral.encode(" 46"), mistral.eos_id))
    assert mistral.token_bytes(response) == b"  46"
    assert len(out.traces[0].values) == len(response) == len(out.target_chunk)
    assert out.traces[0].values.sum() == lp.sum()


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 50257, 10**9])
def test_ids_outside_the_vocabulary_are_invalid(gpt2, mistral, bad):
    with pytest.raises(InvalidArgument, match=rf"source_ids: token id {bad} is outside the vocabulary of 'gpt2'"):
        align(gpt2, np.array([464, bad]), mistral)


def test_prompt_ids_outside_the_target_vocabulary_are_invalid(gpt2, mistral):
    with pytest.raises(InvalidArgument, match=r"target_prompt_ids: token id 32000 .*'mistral-v1' \(size 32000\)"):
        align(gpt2, gpt2.encode("hi"), mistral, target_prompt_ids=np.array([1, 32000]))


def test_trace_of_the_wrong_length_is_invalid(gpt2, mistral):
    with pytest.raises(InvalidArgument, match=r"trace 'lp' has 2 values for 3 source ids"):
        align(gpt2, gpt2.encode("a b c"), mistral, [Trace("lp", np.array([-1.0, -1.0]))])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_trace_is_invalid(gpt2, mistral, bad):
    with pytest.raises(InvalidArgument, match=r"trace 'lp'\[1\] is .*: traces must be finite"):
        align(gpt2, gpt2.encode("a b c"), mistral, [Trace("lp", np.array([-1.0, bad, -1.0]))])


def test_unknown_reduction_is_invalid(gpt2, mistral):
    with pytest.raises(InvalidArgument, match=r"trace 'lp': unknown reduction 'max'; valid: sum, all, mean, broadcast"):
        align(gpt2, gpt2.encode("a b c"), mistral, [Trace("lp", np.zeros(3), "max")])


@pytest.mark.slow
def test_a_gguf_file_loads_as_the_tokenizer_inside_it(vocabs):
    """load_vocab on the .gguf itself (transformers converts its tokenizer) equals the cached conversion."""
    from mrl_tokenizer_align import catalog
    from mrl_tokenizer_align.vocab import load_vocab
    gguf = next((catalog.cache_dir() / "smollm2").glob("*.gguf"))
    direct = load_vocab("smollm2-gguf", gguf)
    cached = vocabs["smollm2"]
    assert (direct.family, direct.byte_exact, direct.vocab_size) == (cached.family, cached.byte_exact, cached.vocab_size)
    assert np.array_equal(direct.lens, cached.lens) and direct.buf.tobytes() == cached.buf.tobytes()
    text = "Hello, world! 12+34=46 😀"
    assert np.array_equal(direct.encode(text), cached.encode(text))


# -- specials, normalizers and HF SentencePiece files (review findings) ---------------------------------
def test_end_of_sequence_maps_by_content_then_to_the_configured_eos(vocabs):
    smollm2, qwen, mistral, gpt2 = vocabs["smollm2"], vocabs["qwen"], vocabs["mistral-v1"], vocabs["gpt2"]
    im_end = smollm2.specials["<|im_end|>"]
    assert smollm2.eos_id == im_end  # from tokenizer_config.json, not the lowest end-of-text id
    ids = np.append(smollm2.encode("The answer is 4."), im_end)
    assert align(smollm2, ids, smollm2).target_ids[-1] == im_end
    assert align(smollm2, ids, qwen).target_ids[-1] == qwen.specials["<|im_end|>"]  # the same chat tag
    out = align(mistral, np.append(mistral.encode("Done."), mistral.eos_id), gpt2)  # </s>: no such tag in GPT-2
    assert out.target_ids[-1] == gpt2.eos_id == 50256 and out.residual.mapped_specials == 1


def test_a_chat_tag_inside_the_response_is_dropped_and_not_lossless(vocabs):
    smollm2, qwen = vocabs["smollm2"], vocabs["qwen"]
    ids = np.concatenate([smollm2.encode("Answer: 4"), [smollm2.specials["<|im_end|>"]], smollm2.encode("\nthanks")])
    r = align(smollm2, ids, qwen).residual
    assert (r.dropped_specials, r.lossless) == (1, False)


def test_a_byte_level_tokenizer_with_a_normalizer_is_compared_per_response(vocabs, tmp_path):
    import json
    from mrl_tokenizer_align import catalog
    from mrl_tokenizer_align.vocab import load_vocab
    spec = json.loads((catalog.cache_dir() / "smollm2-tokenizer" / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "NFC"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    nfc = load_vocab("smollm2-nfc", tmp_path / "tokenizer.json")
    gpt2 = vocabs["gpt2"]
    assert align(gpt2, gpt2.encode("The answer is 4."), nfc).residual.lossless  # NFC text: exact
    decomposed = "cafe\u0301"                                                       # NFC changes it
    r = align(gpt2, gpt2.encode(decomposed), nfc).residual
    assert (r.lossless, r.normalizer_mismatch) == (False, True)


@pytest.mark.slow
def test_hf_sentencepiece_file_invents_a_space_and_aligns_losslessly(vocabs, tmp_path):
    """Mistral's .model converted to a HF tokenizer.json (Metaspace, prepend_scheme "first"): dummy prefix found.
    This encoder spells " Hello" as "Hello" (its own decoder reads both back as "Hello"): not lossless."""
    from transformers import LlamaTokenizerFast

    from mrl_tokenizer_align import catalog
    from mrl_tokenizer_align.vocab import load_vocab
    import shutil
    slow = tmp_path / "slow"
    slow.mkdir()
    shutil.copy(catalog.cache_dir() / "mistral-v1.model", slow / "tokenizer.model")
    LlamaTokenizerFast.from_pretrained(slow).save_pretrained(tmp_path / "fast")
    hf = load_vocab("mistral-hf", tmp_path / "fast")
    assert (hf.family, hf.dummy_prefix) == ("sentencepiece", True)
    fast = LlamaTokenizerFast.from_pretrained(tmp_path / "fast")
    gpt2 = vocabs["gpt2"]
    for text in ["Hello world", "\nx", "a  b", " Hello", "  12"]:
        out = align(gpt2, gpt2.encode(text), hf)
        read_back = fast.decode(out.target_ids.tolist())
        assert out.text == text and out.residual.lossless is (read_back == text), (text, read_back, out.residual)
        assert out.residual.lossless is not text.startswith(" ")


def test_a_stray_invalid_byte_inside_the_response_drops_only_itself(vocabs):
    gpt2, mistral = vocabs["gpt2"], vocabs["mistral-v1"]
    stray = gpt2.encode("\u00ff")[:1]                                   # the token of byte 0xC3 alone
    assert gpt2.token_bytes(stray) == b"\xc3"
    ids = np.concatenate([gpt2.encode("abc"), stray, gpt2.encode(" def")])
    lp = -np.ones(len(ids))
    out = align(gpt2, ids, mistral, [Trace("lp", lp, "sum")])
    assert out.text == "abc def" and "\ufffd" not in out.text
    assert (out.residual.invalid_utf8_bytes, out.residual.lossless) == (1, False)
    assert out.traces[0].values.sum() == lp.sum()                     # the stray token's value stays in its chunk


# -- hostile text (review findings) ---------------------------------------------------------------------
@pytest.mark.parametrize("text", [" hi", "  hi", "   hi", " 46", " \nx", " ", "  ", "\n hi"])
def test_leading_spaces_survive_a_round_trip_through_a_dummy_prefix_target(gpt2, mistral, text):
    """Mistral reads the first space of its ids as its invented one (SentencePiece's own decoder too), so a
    text's own leading space must be spelled after it; reading the ids back gives the text."""
    import sentencepiece as spm
    from mrl_tokenizer_align import catalog
    ids = gpt2.encode(text)
    out = align(gpt2, ids, mistral)
    assert out.residual.lossless, out.residual
    assert mistral.token_bytes(out.target_ids) == b" " + text.encode()
    sp = spm.SentencePieceProcessor(model_file=str(catalog.cached_paths()["mistral-v1"]))
    assert sp.decode(out.target_ids.tolist()) == text
    back = align(mistral, out.target_ids, gpt2)
    assert back.text == text and back.residual.lossless
    np.testing.assert_array_equal(back.target_ids, ids)


def test_a_leading_space_and_none_are_different_target_ids(gpt2, mistral):
    spaced, bare = (align(gpt2, gpt2.encode(t), mistral).target_ids for t in (" hi", "hi"))
    assert not np.array_equal(spaced, bare)


@pytest.mark.parametrize("tid, special", [("gpt2", "<|endoftext|>"), ("mistral-v1", "<s>"),
                                          ("smollm2", "<|im_start|>")])
def test_a_special_before_the_text_is_dropped_and_not_lossless(vocabs, tid, special):
    src, qwen = vocabs[tid], vocabs["qwen"]
    ids = np.concatenate([[src.specials[special]], src.encode("Answer: 4")])
    out = align(src, ids, qwen, [Trace("lp", np.array([-0.5] + [-1.0] * (len(ids) - 1)), "sum")])
    r = out.residual
    assert out.text == "Answer: 4" and not qwen.is_special[out.target_ids].any()
    assert (r.dropped_specials, r.mapped_specials, r.lossless) == (1, 0, False)


def test_invalid_bytes_in_the_middle_and_at_the_end_are_left_out_and_every_valid_byte_kept(gpt2, mistral):
    """AlignResponse.text: the source's bytes less each invalid UTF-8 sequence, wherever it is (not a prefix)."""
    stray = gpt2.encode("\u00ff")[:1]                                   # byte 0xC3 alone, in the middle
    cut = gpt2.encode("😀")[:1]                                          # F0 9F 98: a character cut at the end
    assert (gpt2.token_bytes(stray), gpt2.token_bytes(cut)) == (b"\xc3", b"\xf0\x9f\x98")
    ids = np.concatenate([gpt2.encode("abc"), stray, gpt2.encode(" déf"), cut])
    lp = -np.arange(1, len(ids) + 1) / 8
    out = align(gpt2, ids, mistral, [Trace("lp", lp, "sum")])
    assert out.text == "abc déf"
    r = out.residual
    assert (r.invalid_utf8_bytes, r.dropped_bytes, r.lossless) == (4, 4, False)
    assert mistral.token_bytes(out.target_ids) == " abc déf".encode()
    assert out.traces[0].values.sum() == lp.sum()


@pytest.mark.parametrize("tid, parts, truncated", [
    ("gpt2", ["text"], True), ("gpt2", ["text", "eos"], False), ("gpt2", ["eos"], False), ("gpt2", [], True),
    ("gpt2", ["text", "eos", "text"], True), ("gpt2", ["text", "cut", "eos"], False),
    ("smollm2", ["text", "eos"], False), ("smollm2", ["text", "eos", "im_start"], True)])
def test_truncated_says_the_source_does_not_end_with_an_end_of_sequence(vocabs, mistral, tid, parts, truncated):
    """residual.truncated: the last source id is not an end of sequence (a length limit or a stream cut the
    response), so the target ids end without one too."""
    src = vocabs[tid]
    piece = {"text": src.encode("Done."), "eos": [src.eos_id], "cut": src.encode("😀")[:1],
             "im_start": [src.specials.get("<|im_start|>")]}
    ids = np.asarray([i for p in parts for i in piece[p]], dtype=np.int64)
    out = align(src, ids, mistral)
    assert out.residual.truncated is truncated
    ends_with_eos = bool(len(out.target_ids)) and int(out.target_ids[-1]) == mistral.eos_id
    assert ends_with_eos is not truncated


def test_a_byte_fallback_space_first_is_text_not_the_dummy_prefix(gpt2, mistral):
    """SentencePiece invents only a '▁': a sampled byte token <0x20> first is the text's space (its own
    decoder keeps it), so it reaches the target."""
    import sentencepiece as spm
    from mrl_tokenizer_align import catalog
    sp = spm.SentencePieceProcessor(model_file=str(catalog.cached_paths()["mistral-v1"]))
    for pieces in (["<0x20>", "hi"], ["▁", "hi"], ["<0x20>", "▁hi"], ["<s>", "<0x20>", "hi"]):
        ids = np.array([sp.piece_to_id(p) for p in pieces])
        out = align(mistral, ids, gpt2)
        assert out.text == sp.decode(ids.tolist()), pieces
        np.testing.assert_array_equal(out.target_ids, gpt2.encode(out.text))
