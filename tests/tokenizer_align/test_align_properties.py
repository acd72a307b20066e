"""Properties of THL's `align()` (docs/architecture.md) over arbitrary Unicode text, for every ordered pair of the
catalog's real byte-exact tokenizers (gpt2, qwen, mistral-v1, smollm2, gemma3: every catalogued one but WordPiece,
so a tokenizer added to the catalog is covered) and for the WordPiece one (minilm).

A tokenizer whose vocabulary lacks a byte cannot be byte-exact on a text holding it: SmolLM2 (as
converted from its GGUF) has no symbol for the bytes 0x04 0x06 0x13 0x14 0x16 0x1D 0xF1 0xF2 (and the
never-valid 0xC0 0xC1 0xF5-0xFF), so its encoder silently drops U+0004, U+0006, U+0013, U+0014, U+0016,
U+001D and the lead byte of U+40000..U+BFFFF. For such a text the properties are: no error, and the
result says lossless False, normalizer_mismatch True. Likewise SentencePiece reads the character '▁'
(U+2581) in a text as its whitespace meta symbol: Mistral spells it as a space.

Source ids are the source's canonical encoding, a sampled non-canonical tokenization (tokens split into
two tokens of the vocabulary), or ids cut inside a multi-byte character. For byte-exact pairs and valid
UTF-8: the target's bytes are the source's (bar Mistral's invented leading space), the target ids read
back as the same text (a leading space survives a dummy-prefix target), the SUM trace is conserved,
every chunk boundary is a token boundary on both sides and every shared token boundary is a chunk
boundary (chunks are minimal), chunk indices never decrease, and the result is lossless.
"""
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, note, settings, strategies as st

from mrl_tokenizer_align.align import Trace, align
from mrl_tokenizer_align.catalog import CATALOG

WORDPIECE = ("minilm",)
EXACT = tuple(t for t in CATALOG if t not in WORDPIECE)
PAIRS = list(itertools.product(EXACT, EXACT))
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FRAGMENTS = ["😀", "👨‍👩‍👧", "🇫🇷", "日本語", "中文", "한국어", "e\u0301", "a\u0308\u0323", "Ω", "ß", "İ", "ﬁ", "½",
             " ", "  ", "   ", "\n", "\n\n", "\r\n", "\t", " \n ", "\u00a0", "\u200b", "\x00", "12345", "3.14",
             "12+34=46", "'s", "don't", " the", "Hello", "<|endoftext|>", "<|im_end|>", "</s>", "[SEP]", "▁",
             "<0x41>", "ĠĊ", "\U0010fffd", "\ufeff"]
texts = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(FRAGMENTS)), max_size=10).map("".join)


class Tables(dict):
    """tokenizer id -> {bytes: id}, with a short repr for hypothesis' reports."""
    def __repr__(self):
        return f"Tables({sorted(self)})"


@pytest.fixture(scope="module")
def piece_ids(vocabs):
    """tokenizer id -> {bytes: id} over the non-special tokens (the vocabulary's own pieces)."""
    out = Tables()
    for tid in EXACT:
        v = vocabs[tid]
        buf = v.buf.tobytes()
        table = {}
        for i in np.flatnonzero((v.lens > 0) & ~v.is_special)[::-1]:   # the lowest id wins a tie, bar one:
            piece = buf[v.starts[i]:v.starts[i] + v.lens[i]]             # SentencePiece's byte <0x20> is not
            if i != v.space_byte_id or piece not in table:               # '▁' (first, it is text, not invented)
                table[piece] = int(i)
        out[tid] = table
    return out


def _covers(vocab, table: dict[bytes, int], data: bytes) -> bool:
    """Whether the tokenizer can spell `data`: every byte is a token of its vocabulary, and no '▁' for
    SentencePiece."""
    return all(bytes([b]) in table for b in set(data)) and not (
        vocab.family == "sentencepiece" and "▁".encode() in data)


def _bytes(vocab, ids) -> bytes:
    return vocab.token_bytes(np.asarray(ids, dtype=np.int64))


def _values(n: int, seed: int) -> np.ndarray:
    """Dyadic log-probs (k/64, k ≤ 640): every float sum of them is exact, whatever the order."""
    return -np.random.default_rng(seed).integers(0, 641, n) / 64


def _target_ends(dst, tids, S: bytes) -> np.ndarray:
    """Byte ends of the target tokens in S's coordinates (Mistral's invented leading space removed)."""
    T = _bytes(dst, tids)
    ends = np.cumsum(dst.lens[tids])
    if T != S and dst.dummy_prefix and T[:1] == b" " and T[1:] == S:
        ends = ends - 1
    return ends


def check_lossless(src, ids, dst, dst_table):
    ids = np.asarray(ids, dtype=np.int64)
    lp = _values(len(ids), len(ids))
    mask = (np.arange(len(ids)) % 4 != 1).astype(np.float64)
    out = align(src, ids, dst, [Trace("lp", lp, "sum"), Trace("mask", mask, "all"), Trace("adv", lp, "mean")])
    r = out.residual
    S = _bytes(src, ids)
    invented = int(src.dummy_prefix and S[:1] == b" ")                  # the source encoder's invented space
    S = S[invented:]
    tids = out.target_ids[out.response_start:]
    note(f"text={out.text!r} source={[_bytes(src, [i]) for i in ids]} target={[_bytes(dst, [i]) for i in tids]}")
    for t in out.traces:
        assert len(t.values) == len(tids)
    if not _covers(dst, dst_table, S):                                    # the target cannot spell these bytes
        assert r.lossless is False and r.normalizer_mismatch is True, r
        assert (np.diff(out.source_chunk) >= 0).all() and (np.diff(out.target_chunk) >= 0).all()
        return out
    assert r.lossless, r
    assert not r.normalizer_mismatch and r.invalid_utf8_bytes == 0 and r.dropped_bytes == 0
    assert out.text.encode() == S

    # target bytes == source bytes (a dummy-prefix target may add its one invented leading space), and the
    # target ids read back as the text: a leading space of the text is never taken for the invented one
    T = _bytes(dst, tids)
    assert T == S or (dst.dummy_prefix and T == b" " + S), (T, S)
    assert not dst.is_special[tids].any()
    assert align(dst, tids, src).text == out.text

    # traces: SUM conserved exactly (dyadic values); a chunk is masked on every target token iff any of its
    # source tokens is masked
    if len(tids):
        assert out.traces[0].values.sum() == lp.sum()
        masked = np.bincount(out.source_chunk, weights=mask == 0, minlength=r.chunks) > 0
        np.testing.assert_array_equal(out.traces[1].values, (~masked[out.target_chunk]).astype(np.float64))

    # chunks: indices non-decreasing, from 0, boundaries = the token boundaries both sides share
    ends_a = np.maximum(np.cumsum(src.lens[ids]) - invented, 0)
    ends_b = _target_ends(dst, tids, S)
    for chunk, ends in ((out.source_chunk, ends_a), (out.target_chunk, ends_b)):
        assert len(chunk) == len(ends)
        assert (np.diff(chunk) >= 0).all() and (chunk >= 0).all()
    shared = np.intersect1d(ends_a[ends_a > 0], ends_b[ends_b > 0])
    assert r.chunks == len(shared)
    if len(S):
        assert shared[-1] == len(S)
    bounds = np.concatenate([[0], shared])
    for chunk, ends in ((out.source_chunk, ends_a), (out.target_chunk, ends_b)):
        pos = ends > 0
        c = chunk[pos]
        # a token of chunk c ends inside (bounds[c], bounds[c+1]]: no token straddles a chunk boundary
        assert ((bounds[c] < ends[pos]) & (ends[pos] <= bounds[c + 1])).all()
        # every chunk's last token ends exactly on the chunk boundary (both sides cover the chunk exactly)
        assert set(ends[pos][np.flatnonzero(np.diff(c, append=len(shared)))]) == set(shared)
    # MEAN of a chunk's source values on each of its target tokens
    means = np.bincount(out.source_chunk, weights=lp, minlength=len(shared)) / np.maximum(
        np.bincount(out.source_chunk, minlength=len(shared)), 1)
    if len(shared):
        np.testing.assert_allclose(out.traces[2].values, means[out.target_chunk], rtol=1e-12)
    return out


# -- canonical source ids ------------------------------------------------------------------------
@pytest.mark.parametrize("pair", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
@SETTINGS
@given(text=texts)
def test_canonical_ids_align_losslessly(vocabs, piece_ids, pair, text):
    src, dst = vocabs[pair[0]], vocabs[pair[1]]
    assume(_covers(src, piece_ids[pair[0]], text.encode()))               # else the source's own encoder drops bytes
    ids = src.encode(text)
    out = check_lossless(src, ids, dst, piece_ids[pair[1]])
    assert out.residual.source_noncanonical is False
    # the text is the source's text: a dummy-prefix source's (SentencePiece) invented space is not part of it
    assert out.text == text


# -- sampled, non-canonical ids -----------------------------------------------------------------
def _split(ids: list[int], table: dict[bytes, int], vocab, data) -> list[int] | None:
    """Split one token into two tokens of the vocabulary whose bytes concatenate to it."""
    order = data.draw(st.permutations(range(len(ids))), label="tokens tried")
    for k in order[:20]:
        piece = _bytes(vocab, [ids[k]])
        cuts = [c for c in range(1, len(piece)) if piece[:c] in table and piece[c:] in table]
        if cuts:
            c = data.draw(st.sampled_from(cuts), label=f"cut of token {k} {piece!r}")
            return ids[:k] + [table[piece[:c]], table[piece[c:]]] + ids[k + 1:]
    return None


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
@SETTINGS
@given(text=texts.filter(lambda t: len(t.encode()) >= 2), data=st.data())
def test_sampled_noncanonical_ids_align_losslessly(vocabs, piece_ids, pair, text, data):
    src, dst = vocabs[pair[0]], vocabs[pair[1]]
    assume(_covers(src, piece_ids[pair[0]], text.encode()))
    canonical = src.encode(text)
    ids = canonical.tolist()
    for _ in range(data.draw(st.integers(1, 3), label="splits")):
        split = _split(ids, piece_ids[pair[0]], src, data)
        if split is None:
            break
        ids = split
    assume(len(ids) > len(canonical))
    assert _bytes(src, ids) == _bytes(src, canonical)
    out = check_lossless(src, ids, dst, piece_ids[pair[1]])
    assert out.residual.source_noncanonical is True
    np.testing.assert_array_equal(out.target_ids, align(src, canonical, dst).target_ids)


# -- a generation cut inside a multi-byte character ----------------------------------------------
multibyte = st.characters(min_codepoint=0x80, exclude_categories=["Cs"])


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
@SETTINGS
@given(prefix=texts, char=multibyte, data=st.data())
def test_ids_cut_inside_a_character_leave_an_invalid_tail(vocabs, piece_ids, pair, prefix, char, data):
    src, dst = vocabs[pair[0]], vocabs[pair[1]]
    table = piece_ids[pair[0]]
    raw = char.encode()
    assume(_covers(src, table, raw) and _covers(src, table, prefix.encode()))
    k = data.draw(st.integers(1, len(raw) - 1), label="bytes of the character generated")
    # the model emits the prefix, then the character's first k bytes as single-byte tokens
    ids = np.concatenate([src.encode(prefix), [table[raw[i:i + 1]] for i in range(k)]]).astype(np.int64)
    lp = _values(len(ids), 7)
    out = align(src, ids, dst, [Trace("lp", lp, "sum"), Trace("mask", np.ones(len(ids)), "all")])
    r = out.residual
    S = _bytes(src, ids)
    S = S[int(src.dummy_prefix and S[:1] == b" "):]                      # the source encoder's invented space
    assert r.invalid_utf8_bytes == k and r.lossless is False and r.truncated is True
    assert "\ufffd" not in out.text or "\ufffd" in prefix
    assert out.text.encode() == S[:len(S) - k]
    tids = out.target_ids[out.response_start:]
    T = _bytes(dst, tids)
    V = S[:len(S) - k]
    assert r.normalizer_mismatch is not _covers(dst, piece_ids[pair[1]], V)
    assert r.normalizer_mismatch or T == V or (dst.dummy_prefix and T == b" " + V), (T, V)
    assert (np.diff(out.source_chunk) >= 0).all() and (np.diff(out.target_chunk) >= 0).all()
    if len(tids):
        assert out.traces[0].values.sum() == lp.sum()                  # the partial token's value is kept
        assert len(out.traces[1].values) == len(tids)


@pytest.mark.parametrize("src_id", EXACT)
@settings(max_examples=40, deadline=None)
@given(before=texts, after=texts, byte=st.integers(0x80, 0xFF))
def test_an_invalid_byte_inside_the_response_never_raises(vocabs, piece_ids, src_id, before, after, byte):
    """A stray byte token in the middle (not a cut at the end): residual, never replaced, never an error."""
    src = vocabs[src_id]
    stray = piece_ids[src_id].get(bytes([byte]))
    assume(stray is not None)
    ids = np.concatenate([src.encode(before), [stray], src.encode(after)]).astype(np.int64)
    S = _bytes(src, ids)
    try:
        S.decode()
        valid = True
    except UnicodeDecodeError:
        valid = False
    for dst_id in ("gpt2", "mistral-v1", "minilm"):
        out = align(src, ids, vocabs[dst_id], [Trace("lp", -np.ones(len(ids)), "sum")])
        assert "\ufffd" not in out.text or "\ufffd" in before + after
        exact = vocabs[dst_id].byte_exact and _covers(vocabs[dst_id], piece_ids.get(dst_id, {}), out.text.encode())
        assert out.residual.lossless is (valid and exact)


# -- WordPiece: not byte-exact, never an error ----------------------------------------------------
WORDPIECE_PAIRS = ([(a, w) for a in EXACT for w in WORDPIECE]
                   + [(w, b) for w in WORDPIECE for b in (*EXACT, *WORDPIECE)])


@pytest.mark.parametrize("pair", WORDPIECE_PAIRS, ids=[f"{a}->{b}" for a, b in WORDPIECE_PAIRS])
@SETTINGS
@given(text=texts)
def test_wordpiece_never_raises_and_is_never_lossless(vocabs, pair, text):
    src, dst = vocabs[pair[0]], vocabs[pair[1]]
    ids = src.encode(text)
    lp = _values(len(ids), 3)
    out = align(src, ids, dst, [Trace("lp", lp, "sum"), Trace("mask", np.ones(len(ids)), "all"),
                                Trace("adv", lp, "mean"), Trace("r", np.ones(len(ids)), "broadcast")])
    r = out.residual
    assert r.lossless is False
    assert "\ufffd" not in out.text or "\ufffd" in text
    tids = out.target_ids[out.response_start:]
    assert all(len(t.values) == len(tids) for t in out.traces)
    assert all(np.isfinite(t.values).all() for t in out.traces)
    assert (np.diff(out.source_chunk) >= 0).all() and (np.diff(out.target_chunk) >= 0).all()
    if len(tids):
        assert out.target_chunk.max() < max(r.chunks, 1)
        # no log-prob mass is lost (a source special, e.g. WordPiece's [UNK], leaves with its value)
        assert out.traces[0].values.sum() == lp[~src.is_special[ids]].sum()
