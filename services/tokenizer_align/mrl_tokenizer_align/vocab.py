"""Per-tokenizer byte tables (docs/algorithms.md, THL step 1) and the loaders of five file formats.

A `Vocab` holds, for every token id, the bytes it stands for, as one flat buffer:

    buf[starts[i] : starts[i] + lens[i]]  = the bytes of token i      (empty for specials)

so the bytes of a whole id sequence are gathered in one numpy indexing, no per-token loop.
Byte tables by family:

    byte_level_bpe   GPT-2, Qwen, SmolLM2: invert GPT-2's byte↔unicode map (tiktoken ranks are bytes)
    sentencepiece    '▁' → space, '<0xXX>' → that byte (byte fallback); the encoder invents a
                     leading '▁' (dummy prefix), which alignment removes (never a first <0x20>)
    wordpiece        '##x' continues a word, any other piece starts one with a space; the normalizer
                     lowercases and strips accents: not byte-exact, aligned by character offsets

`encode(text)` is the canonical encoding without special tokens; `encode_offsets(text)` also
returns each token's end as a byte offset into `text.encode()` (for tokenizers whose bytes do
not reproduce the text: the fallback of step 5).
"""
import functools
import hashlib
import json
import pathlib
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np

from mrl.errors import InvalidArgument

__all__ = ["Vocab", "Family", "load_vocab", "content_sha256", "utf8_char_ends", "shown"]

Family = Literal["byte_level_bpe", "sentencepiece", "wordpiece"]


@dataclass(eq=False)
class Vocab:
    tokenizer_id: str
    family: Family
    byte_exact: bool                 # token bytes are the text's bytes (byte-level BPE, SentencePiece); a
                                     # normalizer may still change a text: alignment compares per response
    buf: np.ndarray                  # uint8, every token's bytes back to back
    starts: np.ndarray               # int64 [V]
    lens: np.ndarray                 # int64 [V]
    is_special: np.ndarray           # bool [V]: control/added special tokens (no bytes)
    specials: dict[str, int]         # content -> id of every special token (chat tags, EOS, ...)
    eos_id: int | None               # the tokenizer's configured end of sequence
    encode: Callable[[str], np.ndarray]
    encode_offsets: Callable[[str], tuple[np.ndarray, np.ndarray]] = field(repr=False, default=None)
    dummy_prefix: bool = False       # the encoder prepends a space the text does not have
    content_sha256: str = ""
    space_byte_id: int | None = None  # SentencePiece's byte-fallback <0x20>: a space of the text, never the
                                      # invented one (its decoder keeps it first in a sequence)

    @property
    def vocab_size(self) -> int:
        return len(self.lens)

    @functools.cached_property
    def eos_ids(self) -> frozenset[int]:
        """Specials that end a sequence: the configured EOS and the usual end-of-turn tags."""
        return frozenset({i for c, i in self.specials.items() if c in EOS_NAMES} | {self.eos_id} - {None})

    def map_special(self, other: "Vocab", special_id: int) -> int | None:
        """The id in this vocabulary of `other`'s special: the same content (a chat tag both know), else, for
        an end of sequence, this tokenizer's own EOS; None when it has no counterpart."""
        content = next((c for c, i in other.specials.items() if i == special_id), None)
        if content in self.specials:
            return self.specials[content]
        return self.eos_id if special_id in other.eos_ids else None

    def token_bytes(self, ids: np.ndarray) -> bytes:
        """concat(tok_bytes[ids]) by one gather: idx = starts[ids] repeated + offset within token."""
        lens = self.lens[ids]
        total = int(lens.sum())
        if total == 0:
            return b""
        first = np.repeat(self.starts[ids] - (np.cumsum(lens) - lens), lens)  # (total,)
        return self.buf[first + np.arange(total)].tobytes()

    def check_ids(self, ids: np.ndarray, what: str) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = int(ids[(ids < 0) | (ids >= self.vocab_size)][0])
            raise InvalidArgument(f"{what}: token id {bad} is outside the vocabulary of {self.tokenizer_id!r} "
                                  f"(size {self.vocab_size})")


def shown(value, limit: int = 200) -> str:
    """A caller's value (a path, an id, a trace name) as an error message quotes it: its repr (a NUL shows as
    \\x00), cut to `limit` characters, so that a hostile value can neither hide in nor overflow the status
    (gRPC refuses a status over 16 KiB of metadata)."""
    text = repr(str(value))
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(value))} characters)"


def utf8_char_ends(text: str) -> np.ndarray:
    """Byte offset of the end of each character of `text` in its UTF-8 encoding (vectorised)."""
    cp = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return np.cumsum(1 + (cp >= 0x80) + (cp >= 0x800) + (cp >= 0x10000), dtype=np.int64)


def _tables(pieces: list[bytes], special: np.ndarray):
    lens = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    lens[special] = 0
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    buf = np.frombuffer(b"".join(p if not s else b"" for p, s in zip(pieces, special)), dtype=np.uint8)
    return buf, starts, lens


_HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def tokenizer_files(path: pathlib.Path) -> list[pathlib.Path]:
    """The files a tokenizer is read from: what registration confines and what its hash covers."""
    if path.is_dir():
        return [path / f for f in _HF_FILES if (path / f).exists()]
    extra = [path.with_name(path.name + ".json")] if path.name.endswith(".tiktoken") else []
    if path.name == "tokenizer.json":
        extra = [path.with_name(f) for f in _HF_FILES[1:]]
    return [path] + [f for f in extra if f.exists()]


def content_sha256(path: pathlib.Path) -> str:
    """sha256 over a tokenizer's files (tokenizer_files), streamed."""
    h = hashlib.sha256()
    for f in tokenizer_files(path):
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


# -- byte-level BPE: GPT-2's reversible byte <-> unicode map ------------------------------------
def _unicode_to_byte() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_U2B = _unicode_to_byte()
EOS_NAMES = {"<|endoftext|>", "</s>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "[SEP]", "<eos>",
             "<end_of_turn>"}


# -- loaders ---------------------------------------------------------------------------------
def _from_hf(tokenizer_id: str, path: pathlib.Path) -> Vocab:
    from tokenizers import Tokenizer
    file = path / "tokenizer.json" if path.is_dir() else path
    tok = Tokenizer.from_file(str(file))
    # A response is encoded as it is: no padding or truncation from the file's defaults (a BERT file pads and
    # truncates to 128), and a special token's *text* inside it is text, never the special id.
    tok.no_padding()
    tok.no_truncation()
    tok.encode_special_tokens = True
    # The pipeline's parts as the file has them, read from the loaded tokenizer (each part's JSON): parsing the
    # whole file again would cost ~0.7 s and ~200 MB at peak for a 262k vocabulary with its merges (Gemma 3).
    model = type(tok.model).__name__
    text_spec = json.dumps([json.loads(part.__getstate__()) if part is not None else None
                            for part in (tok.pre_tokenizer, tok.decoder, tok.normalizer)], ensure_ascii=False)
    size = tok.get_vocab_size(with_added_tokens=True)
    inverse = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    added = tok.get_added_tokens_decoder()
    special = np.zeros(size, dtype=bool)
    for i, t in added.items():
        special[i] = t.special
    if model == "WordPiece":
        family, exact = "wordpiece", False
        prefix = tok.model.continuing_subword_prefix or "##"
        pieces = [(t[len(prefix):] if t.startswith(prefix) else " " + t).encode() for t in
                  (inverse.get(i, "") for i in range(size))]
    elif "ByteLevel" in text_spec:
        family, exact = "byte_level_bpe", True
        pieces = [bytes(_U2B.get(c, 0) for c in inverse.get(i, "")) if not added.get(i) or added[i].special
                  else inverse[i].encode() for i in range(size)]
    elif "Metaspace" in text_spec or "▁" in text_spec:
        family, exact = "sentencepiece", True
        pieces = [_spm_piece(inverse.get(i, "")) for i in range(size)]
    else:
        raise InvalidArgument(f"{file}: tokenizer model {model!r} with this pre-tokenizer is not supported; "
                              f"supported: byte-level BPE, SentencePiece (Metaspace), WordPiece")
    buf, starts, lens = _tables(pieces, special)
    space_byte_id = tok.token_to_id("<0x20>") if family == "sentencepiece" else None
    specials = {t.content: i for i, t in added.items() if t.special}
    config = file.with_name("tokenizer_config.json")
    eos_token = json.loads(config.read_text()).get("eos_token") if config.is_file() else None
    if isinstance(eos_token, dict):
        eos_token = eos_token.get("content")
    eos_id = specials.get(eos_token) if eos_token else next((i for c, i in specials.items() if c in EOS_NAMES), None)

    def encode(text: str) -> np.ndarray:
        return np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_offsets(text: str):
        enc = tok.encode(text, add_special_tokens=False)
        char_ends = utf8_char_ends(text)
        ends = np.asarray([e for _, e in enc.offsets], dtype=np.int64)
        byte_ends = np.where(ends > 0, char_ends[np.maximum(ends - 1, 0)] if len(char_ends) else 0, 0)
        return np.asarray(enc.ids, dtype=np.int64), byte_ends
    return Vocab(tokenizer_id, family, exact, buf, starts, lens, special, specials, eos_id, encode, encode_offsets,
                 space_byte_id=space_byte_id)


def _spm_piece(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("▁", " ").encode()


def _from_sentencepiece(tokenizer_id: str, path: pathlib.Path) -> Vocab:
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(path))
    size = sp.get_piece_size()
    # <unk> stands for no known bytes: a special, so alignment counts it as dropped
    special = np.array([sp.is_control(i) or sp.is_unknown(i) for i in range(size)], dtype=bool)
    pieces = [bytes([int(sp.id_to_piece(i)[3:5], 16)]) if sp.is_byte(i) else
              (b"" if sp.is_unknown(i) else sp.id_to_piece(i).replace("▁", " ").encode()) for i in range(size)]
    buf, starts, lens = _tables(pieces, special)

    def encode(text: str) -> np.ndarray:
        return np.asarray(sp.encode(text), dtype=np.int64)

    def encode_offsets(text: str):
        proto = sp.encode(text, return_type="proto")                    # sentencepiece >= 0.2.1; byte offsets
        return (np.asarray([p.id for p in proto.pieces], dtype=np.int64),
                np.asarray([p.end for p in proto.pieces], dtype=np.int64))
    specials = {sp.id_to_piece(i): i for i in range(size) if sp.is_control(i)}
    space_byte = sp.piece_to_id("<0x20>")
    return Vocab(tokenizer_id, "sentencepiece", True, buf, starts, lens, special, specials,
                 sp.eos_id() if sp.eos_id() >= 0 else None, encode, encode_offsets,
                 space_byte_id=space_byte if sp.is_byte(space_byte) else None)


# A .tiktoken file holds only ranks. Its pre-tokenizer regex and special tokens come from a sidecar
# `<file>.json` ({"pattern": ..., "special_tokens": {"<|endoftext|>": 50256, ...}, "eos": "<|endoftext|>"});
# without one, GPT-2's regex and <|endoftext|> right after the last rank.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _from_tiktoken(tokenizer_id: str, path: pathlib.Path) -> Vocab:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    ranks = load_tiktoken_bpe(str(path))
    sidecar = path.with_name(path.name + ".json")
    meta = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
    pattern = meta.get("pattern", GPT2_PATTERN)
    specials = {k: int(v) for k, v in meta.get("special_tokens", {"<|endoftext|>": len(ranks)}).items()}
    size = max([*ranks.values(), *specials.values()]) + 1
    pieces = [b""] * size
    for piece, rank in ranks.items():
        pieces[rank] = piece
    special = np.zeros(size, dtype=bool)
    special[list(specials.values())] = True
    enc = tiktoken.Encoding(tokenizer_id, pat_str=pattern, mergeable_ranks=ranks,
                            special_tokens=specials)
    buf, starts, lens = _tables(pieces, special)
    eos_id = specials.get(meta.get("eos", "<|endoftext|>"))

    def encode(text: str) -> np.ndarray:
        return np.asarray(enc.encode_ordinary(text), dtype=np.int64)
    return Vocab(tokenizer_id, "byte_level_bpe", True, buf, starts, lens, special, specials, eos_id, encode, None)


def _from_gguf(tokenizer_id: str, path: pathlib.Path) -> Vocab:
    """The tokenizer inside a GGUF, converted to a HF tokenizer by transformers."""
    import tempfile

    from transformers import AutoTokenizer
    with tempfile.TemporaryDirectory() as tmp:
        # Alone in a folder of its own (a link), so transformers reads no sibling file beside the GGUF.
        alone = pathlib.Path(tmp) / "in"
        alone.mkdir()
        (alone / path.name).symlink_to(path.resolve())
        tok = AutoTokenizer.from_pretrained(str(alone), gguf_file=path.name)
        tok.save_pretrained(pathlib.Path(tmp) / "out")
        return _from_hf(tokenizer_id, pathlib.Path(tmp) / "out")


_LOADERS = {"hf": _from_hf, "tiktoken": _from_tiktoken, "sentencepiece": _from_sentencepiece, "gguf": _from_gguf}


def _format(path: pathlib.Path) -> str:
    name = path.name
    if path.is_dir() or name.endswith(".json"):
        return "hf"
    if name.endswith(".tiktoken"):
        return "tiktoken"
    if ".model" in name:
        return "sentencepiece"
    if name.endswith(".gguf"):
        return "gguf"
    raise InvalidArgument(f"{path}: unknown tokenizer format; give a HF folder or tokenizer.json, a "
                          f"SentencePiece .model, a .tiktoken file or a .gguf")


def load_vocab(tokenizer_id: str, path: str | pathlib.Path) -> Vocab:
    """Load a HF folder or tokenizer.json, a SentencePiece .model, a .tiktoken file or a .gguf."""
    path = pathlib.Path(path)
    if not path.exists():
        raise InvalidArgument(f"tokenizer path {path} does not exist")
    loader = _LOADERS[_format(path)]
    try:
        vocab = loader(tokenizer_id, path)
    except InvalidArgument:
        raise
    except Exception as exc:  # the libraries raise anything on a malformed file: the caller's input
        raise InvalidArgument(f"{path} could not be loaded as a tokenizer: {type(exc).__name__}: {exc}") from exc
    # An encoder that invents a leading space (SentencePiece's dummy prefix, HF Metaspace "always"/"first"):
    # found by asking it, not by reading flags that differ across formats and versions.
    vocab.dummy_prefix = vocab.family != "wordpiece" and vocab.token_bytes(vocab.encode("a")) == b" a"
    vocab.content_sha256 = content_sha256(path)
    return vocab
