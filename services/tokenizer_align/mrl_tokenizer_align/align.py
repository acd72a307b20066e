"""Lossless alignment of a response across tokenizers by byte offsets (docs/algorithms.md, THL steps 2–8).

Given the ids a policy A *generated* and per-token traces, produce B's ids for the same text
and move the traces onto them:

    S       = concat(tok_bytes_A[ids_A])              (specials leave the byte stream)
    ends_A  = cumsum(tok_len_A[ids_A])                a token's end, as a byte offset in S
    text    = S less its invalid UTF-8 sequences      (wherever they are; residual, never replaced)
    ids_B   = encode_B(text);  ends_B from B's byte tables, or B's offsets when B is not byte-exact
    shared  = ends_A ∩ ends_B                          chunk boundaries: a chunk is the smallest span
                                                       both sides cover exactly
    chunk(t) = searchsorted(shared, end(t))            each token's chunk, both sides

Trace transfer, per reduction (chunk c, source tokens i ∈ c, target tokens j ∈ c):

    SUM        v_B[last j of c] = Σ_{i∈c} v_A[i], 0 on the other j   (log-probs: log P_A of c's bytes)
    ALL        v_B[j] = 1 if every v_A[i] ≠ 0 else 0                  (masks: conservative)
    MEAN       v_B[j] = mean_{i∈c} v_A[i]                             (advantages)
    BROADCAST  v_B[j] = v_A[0]                                        (sequence-level values)

A tokenizer with a dummy prefix (SentencePiece) invents a space before a sequence's text, so the first
space of its bytes is never text: it is taken off a source's bytes, and a target's ids must spell it
before the text (" hi" becomes "▁▁hi", not "▁hi", which reads back as "hi"), else the result is not lossless.

An end-of-sequence special of A at the end maps to B's EOS (its trace value moves with it); other
specials, a BOS before the text included, are dropped and the result is not lossless. Everything is
numpy over whole arrays: no per-token Python loop.
"""
from dataclasses import dataclass, field

import numpy as np

from mrl.errors import InvalidArgument
from mrl_tokenizer_align.vocab import Vocab, shown

__all__ = ["Trace", "Residual", "Alignment", "align", "Reduction", "REDUCTIONS"]

REDUCTIONS = ("sum", "all", "mean", "broadcast")
Reduction = str


@dataclass
class Trace:
    name: str
    values: np.ndarray               # float64, one per id
    reduction: Reduction = "sum"


@dataclass
class Residual:
    """The cost of one alignment (step 8)."""
    lossless: bool = True
    chunks: int = 0
    one_to_one_share: float = 1.0
    one_to_one_byte_share: float = 1.0
    mean_source_tokens_per_chunk: float = 0.0
    mean_target_tokens_per_chunk: float = 0.0
    max_source_tokens_per_chunk: int = 0
    max_target_tokens_per_chunk: int = 0
    dropped_bytes: int = 0
    invalid_utf8_bytes: int = 0
    normalizer_mismatch: bool = False
    mapped_specials: int = 0
    dropped_specials: int = 0
    truncated: bool = False
    source_noncanonical: bool = False


@dataclass
class Alignment:
    target_ids: np.ndarray           # target prompt ids (if any) then the response's target ids
    response_start: int              # index of the response's first id in target_ids
    source_chunk: np.ndarray         # chunk of each source token (specials: chunk of their neighbour)
    target_chunk: np.ndarray         # chunk of each response target token (a mapped EOS: a chunk of its own)
    traces: list[Trace] = field(default_factory=list)  # over the response's target tokens
    residual: Residual = field(default_factory=Residual)
    text: str = ""


def _decode_valid(data: bytes) -> tuple[str, np.ndarray]:
    """The text of the valid UTF-8 parts of `data`, and the sorted positions of the invalid bytes left out
    (never replaced by U+FFFD). One step per invalid sequence, not per byte or token."""
    parts, bad, pos = [], [], 0
    while True:
        try:
            parts.append(data[pos:].decode("utf-8"))
            return "".join(parts), np.asarray(bad, dtype=np.int64)
        except UnicodeDecodeError as exc:
            parts.append(data[pos:pos + exc.start].decode("utf-8"))
            bad.extend(range(pos + exc.start, pos + exc.end))
            pos += exc.end


def _check_traces(traces: list[Trace], n: int) -> None:
    for t in traces:
        if t.reduction not in REDUCTIONS:
            raise InvalidArgument(f"trace {shown(t.name)}: unknown reduction {t.reduction!r}; "
                                  f"valid: {', '.join(REDUCTIONS)}")
        if len(t.values) != n:
            raise InvalidArgument(f"trace {shown(t.name)} has {len(t.values)} values for {n} source ids; "
                                  f"send one per id")
        if not np.isfinite(t.values).all():
            bad = int(np.flatnonzero(~np.isfinite(t.values))[0])
            raise InvalidArgument(f"trace {shown(t.name)}[{bad}] is {t.values[bad]}: traces must be finite")


def align(src: Vocab, ids: np.ndarray, dst: Vocab, traces: list[Trace] = (),
          target_prompt_ids: np.ndarray | None = None) -> Alignment:
    ids = np.asarray(ids, dtype=np.int64)
    src.check_ids(ids, "source_ids")
    prompt = np.asarray(target_prompt_ids if target_prompt_ids is not None else [], dtype=np.int64)
    dst.check_ids(prompt, "target_prompt_ids")
    _check_traces(traces, len(ids))
    res = Residual()

    # 2. source bytes and token ends; specials leave the stream. An end of sequence at the end maps to the
    #    target's counterpart (same chat tag, else its EOS); specials after the text starts are dropped.
    special = src.is_special[ids]
    last_is_eos = bool(len(ids)) and bool(special[-1]) and int(ids[-1]) in src.eos_ids
    eos_target = dst.map_special(src, int(ids[-1])) if last_is_eos else None
    eos_at_end = eos_target is not None
    res.truncated = not last_is_eos
    res.mapped_specials = int(eos_at_end)
    res.dropped_specials = int(special.sum()) - res.mapped_specials
    invented = _invented_space(src, ids)
    S = src.token_bytes(ids)[invented:]
    ends_a = np.maximum(np.cumsum(src.lens[ids]) - invented, 0)            # (n,)

    # 3. invalid UTF-8 (a generation cut inside a character, a stray byte token) is residual: left out of the
    #    text, and the source ends move back by the invalid bytes before them
    text, bad = _decode_valid(S)
    res.invalid_utf8_bytes = len(bad)
    if len(bad):
        ends_a = ends_a - np.searchsorted(bad, ends_a)
        S = text.encode()
    valid = len(S)

    # 4–5. target ids and ends: from the byte tables when they reproduce S, else from character offsets
    tids, ends_b, exact = _target(dst, text, S)
    res.normalizer_mismatch = not exact
    ends_b = np.maximum.accumulate(np.minimum(ends_b, valid)) if len(ends_b) else ends_b
    if len(ends_b):
        # The last target token covers the end of the text (already so when byte-exact; a normalizer may drop a
        # trailing space), so the last chunk has a target token to carry its values.
        ends_b[-1] = valid
    res.source_noncanonical = not np.array_equal(src.encode(text), ids[~special])
    res.lossless = (src.byte_exact and exact and res.invalid_utf8_bytes == 0 and res.dropped_specials == 0)
    res.dropped_bytes = res.invalid_utf8_bytes

    # 6. chunks: boundaries both sides share (the end of the text is always one)
    shared = _shared_ends(ends_a[~special], ends_b)
    shared = shared[shared > 0]  # a chunk holds bytes: zero-length tokens (an invented space) join the first
    if valid and (not len(shared) or shared[-1] != valid):
        shared = np.append(shared, valid)
    chunk_a = np.minimum(np.searchsorted(shared, ends_a), max(len(shared) - 1, 0))
    chunk_b = np.minimum(np.searchsorted(shared, ends_b), max(len(shared) - 1, 0))
    n_chunks = len(shared)

    # 7. traces onto target tokens
    keep = ~special                                                          # source tokens with bytes
    kept_chunk = chunk_a[keep]
    na = np.bincount(kept_chunk, minlength=n_chunks)                         # source tokens per chunk
    last = np.flatnonzero(chunk_b[1:] != chunk_b[:-1])                       # last target token of each chunk
    last = np.append(last, len(chunk_b) - 1) if len(chunk_b) else last
    out_traces = [_transfer(t, kept_chunk, keep, na, chunk_b, last, n_chunks, eos_at_end) for t in traces]
    target = tids
    if eos_at_end:                                                           # the EOS is a chunk of its own
        target = np.append(tids, eos_target)
        chunk_a = chunk_a.copy()
        chunk_a[-1] = n_chunks
        chunk_b = np.append(chunk_b, n_chunks)

    # 8. residual statistics
    res.chunks = n_chunks + int(eos_at_end)  # a mapped EOS is a chunk of its own (the statistics are text's)
    if n_chunks:
        nb = np.bincount(chunk_b[:len(tids)], minlength=n_chunks)
        one = (na == 1) & (nb == 1)
        chunk_bytes = np.diff(shared, prepend=0)
        res.one_to_one_share = int(np.count_nonzero(one)) / n_chunks
        res.one_to_one_byte_share = int(chunk_bytes[one].sum()) / max(1, int(shared[-1]))
        res.mean_source_tokens_per_chunk = int(keep.sum()) / n_chunks
        res.mean_target_tokens_per_chunk = len(tids) / n_chunks
        res.max_source_tokens_per_chunk = int(na.max())
        res.max_target_tokens_per_chunk = int(nb.max())
    return Alignment(target_ids=np.concatenate([prompt, target]).astype(np.int64), response_start=len(prompt),
                     source_chunk=chunk_a, target_chunk=chunk_b, traces=out_traces, residual=res, text=text)


def _invented_space(vocab: Vocab, ids: np.ndarray) -> int:
    """1 if the first token with bytes of `ids` begins with the space `vocab`'s encoder invents (its dummy
    prefix: SentencePiece's '▁', never the byte-fallback <0x20>, which is text), else 0. The one rule for
    both sides, as the tokenizer's own decoder reads ids: a target's ids must say what a source's would."""
    if not vocab.dummy_prefix:
        return 0
    first = ids[vocab.lens[ids] > 0][:1]
    return int(len(first) == 1 and first[0] != vocab.space_byte_id and vocab.buf[vocab.starts[first[0]]] == 0x20)


def _target(dst: Vocab, text: str, Sv: bytes) -> tuple[np.ndarray, np.ndarray, bool]:
    """(target ids, their byte ends in `text`, whether the target's ids read back as exactly Sv).

    Read back as a source would be: a dummy-prefix target's first space is its invented one, taken off the
    ends; the text's own leading space must follow it (never stand in for it)."""
    if dst.byte_exact:
        tids = dst.encode(text)
        T = dst.token_bytes(tids)
        invented = _invented_space(dst, tids)
        if T[invented:] == Sv:
            return tids, np.maximum(np.cumsum(dst.lens[tids]) - invented, 0), True
        if dst.encode_offsets is None:  # tables reproduce bytes and no offsets: keep the ends we have
            return tids, np.cumsum(dst.lens[tids]), False
    tids, ends = dst.encode_offsets(text)
    return tids, ends, False


def _shared_ends(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The distinct values in both a and b, two non-decreasing arrays of token ends, in order: one searchsorted,
    no sort (np.intersect1d sorts and hashes both: several times slower at response sizes)."""
    if not len(a) or not len(b):
        return a[:0]
    both = b[a[np.minimum(np.searchsorted(a, b), len(a) - 1)] == b]
    return both[np.concatenate(([True], both[1:] != both[:-1]))] if len(both) > 1 else both


def _transfer(trace: Trace, kept_chunk, keep, na, chunk_b, last, n_chunks: int, eos_at_end: bool) -> Trace:
    """kept_chunk: chunk of each source token with bytes; na: their count per chunk; last: index of the last
    target token of each chunk."""
    v = np.asarray(trace.values, dtype=np.float64)
    nb = len(chunk_b)
    if trace.reduction == "broadcast":
        out = np.full(nb, v[0] if len(v) else 0.0)
    elif n_chunks == 0:
        out = np.zeros(nb)
    elif trace.reduction == "sum":
        sums = np.bincount(kept_chunk, weights=v[keep], minlength=n_chunks)
        out = np.zeros(nb)
        out[last] = sums[chunk_b[last]]
    elif trace.reduction == "mean":
        sums = np.bincount(kept_chunk, weights=v[keep], minlength=n_chunks)
        out = (sums / np.maximum(na, 1))[chunk_b]
    else:  # "all": masked if any source token of the chunk is masked
        zeros = np.bincount(kept_chunk, weights=(v[keep] == 0).astype(np.float64), minlength=n_chunks)
        out = (zeros == 0).astype(np.float64)[chunk_b]
    if eos_at_end:  # the EOS carries its own value (a mask: 1 if it was unmasked)
        eos_value = {"broadcast": v[0], "all": float(v[-1] != 0)}.get(trace.reduction, v[-1])
        out = np.append(out, eos_value)
    return Trace(trace.name, out, trace.reduction)
