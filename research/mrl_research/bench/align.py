"""`mrl bench align`: THL's `align()` throughput on realistic responses, against raw tokenization.

What is measured, single process, one thread, in one run, over the real cached tokenizers (`make tokenizers`):

  align    for each response: align(source, ids, target, [log-probs SUM, mask ALL]) — the source's
           byte tables, its canonical re-encode (the non-canonical check), the target's encode,
           the byte-exact check, chunking and both trace transfers.
  anchor   for each response: source.encode(text) + target.encode(text) with the same libraries called
           directly (tiktoken `encode_ordinary`, sentencepiece `encode`, tokenizers `encode(...).ids`),
           no numpy: the two encodes that any retokenization has to pay.

Responses are 100–2,000 source tokens (log-uniform), texts from a deterministic generator of
English-ish prose, numbers, arithmetic, a little markdown and some Unicode (accents, symbols,
CJK, emoji); three in four end with the source's EOS. Throughput = source tokens ÷ seconds.
Both phases run ROUNDS times, interleaved, and each pair keeps its fastest round of each (the
least disturbed by the machine). ratio = align throughput ÷ anchor throughput (target ≥ 0.67,
i.e. alignment costs at most half again what the two encodes cost); the overall ratio is total
tokens ÷ total time over all pairs. Residual cost is reported per pair. The last stdout line
is one JSON object.
"""
import json
import math
import random
import time

import numpy as np

from mrl.errors import FailedPrecondition
from mrl_research import benchmarking
from mrl_tokenizer_align import catalog
from mrl_tokenizer_align.align import Trace, align
from mrl_tokenizer_align.vocab import GPT2_PATTERN, load_vocab

__all__ = ["main", "PAIRS", "TARGET", "make_text"]

PAIRS = [("gpt2", "qwen"), ("qwen", "mistral-v1"), ("mistral-v1", "smollm2"), ("smollm2", "gpt2"),
         ("gpt2", "minilm"), ("smollm2", "gemma3"), ("gemma3", "smollm2")]
TARGET = 0.67
MIN_TOKENS, MAX_TOKENS = 100, 2000

_WORDS = ("the of and to in is that it for as with was on be by this are from at or an have not which but all "
          "they we can one more there so if will each about how up out them then she many some these would "
          "other into has two time look write like number way could people than first water been call who "
          "its now find long down day did get come made may part sum total answer step check result value "
          "equation solve because therefore first second next finally integer prime divide multiply add "
          "subtract remainder carry digit column hundred thousand million approximately exactly").split()
_UNICODE = ("café", "naïve", "résumé", "Zürich", "façade", "São Paulo", "Ελλάδα", "Москва", "日本語", "中文",
            "한국어", "→", "≈", "≤", "≥", "×", "÷", "π", "√2", "½", "°C", "€", "£", "—", "…", "“quoted”",
            "😀", "🎉", "👍", "✅", "🚀", "👨‍👩‍👧")


def make_text(rng: random.Random, n_words: int) -> str:
    """English-ish prose with numbers, arithmetic, markdown and some Unicode; deterministic given rng."""
    out, words = [], 0
    while words < n_words:
        kind = rng.random()
        if kind < 0.55:                                                   # a sentence
            k = rng.randint(5, 18)
            s = " ".join(rng.choice(_WORDS) for _ in range(k))
            if rng.random() < 0.3:
                s += " " + rng.choice(_UNICODE)
            if rng.random() < 0.3:
                s += f" {rng.randint(0, 10**rng.randint(1, 7))}"
            out.append(s[0].upper() + s[1:] + rng.choice([".", ".", ".", "!", "?", ":"]))
            words += k
        elif kind < 0.75:                                                 # arithmetic
            a, b = rng.randint(0, 10**rng.randint(1, 4)), rng.randint(1, 10**rng.randint(1, 4))
            op = rng.choice(["+", "-", "*", "/"])
            val = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / b, 3)}[op]
            out.append(rng.choice([f"{a} {op} {b} = {val}.", f"{a}{op}{b}={val}", f"We get {a} {op} {b} = {val},",
                                   f"$${a} {op} {b} = {val}$$", f"So the answer is **{val}**."]))
            words += 5
        elif kind < 0.85:                                                 # a paragraph break or a list item
            out.append(rng.choice(["\n\n", "\n- ", "\n1. ", "\n\n### Step " + str(rng.randint(1, 9)) + "\n"]))
            words += 1
        elif kind < 0.93:                                                 # Unicode run
            out.append(" ".join(rng.choice(_UNICODE) for _ in range(rng.randint(1, 4))))
            words += 3
        else:                                                             # code-ish
            out.append(rng.choice([f"`x = {rng.randint(0, 99)}`", "    return total\n", "(a + b) * c",
                                   f"f({rng.randint(0, 9)}, {rng.randint(0, 9)}) -> {rng.randint(0, 99)}"]))
            words += 4
    return " ".join(out).replace(" \n", "\n")


# -- the anchor: each library called directly on the same files ------------------------------
def _raw_encoder(tid: str, path):
    """text -> list of ids, with the same library and settings as vocab.load_vocab, without numpy."""
    name = path.name
    if name.endswith(".tiktoken"):
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
        ranks = load_tiktoken_bpe(str(path))
        sidecar = path.with_name(name + ".json")
        meta = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
        specials = {k: int(v) for k, v in meta.get("special_tokens", {"<|endoftext|>": len(ranks)}).items()}
        enc = tiktoken.Encoding(tid, pat_str=meta.get("pattern", GPT2_PATTERN), mergeable_ranks=ranks,
                                special_tokens=specials)
        return enc.encode_ordinary
    if name.endswith(".model"):
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=str(path))
        return sp.encode
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
    tok.no_padding()
    tok.no_truncation()
    tok.encode_special_tokens = True
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def _machine() -> str:
    import sentencepiece
    import tiktoken
    import tokenizers
    return benchmarking.machine(libraries=f"numpy {np.__version__}, tiktoken {tiktoken.__version__}, sentencepiece "
                                          f"{sentencepiece.__version__}, tokenizers {tokenizers.__version__}")


def _responses(src, n: int, seed: int):
    """n (text, ids, traces) of MIN_TOKENS..MAX_TOKENS source tokens (log-uniform), 3 in 4 ending in EOS."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        want = int(math.exp(rng.uniform(math.log(MIN_TOKENS), math.log(MAX_TOKENS))))
        words = max(8, int(want / 1.6))
        text = make_text(rng, words)
        ids = src.encode(text)
        while len(ids) < want * 0.9:                                      # grow to about the wanted length
            text += " " + make_text(rng, max(8, int((want - len(ids)) / 1.6)))
            ids = src.encode(text)
        if i % 4 != 3 and src.eos_id is not None:
            ids = np.append(ids, src.eos_id)
        nprng = np.random.default_rng(seed + i)
        lp = np.log(nprng.uniform(0.05, 1.0, len(ids)))
        mask = (nprng.random(len(ids)) > 0.02).astype(np.float64)
        out.append((text, ids, [Trace("logprobs", lp, "sum"), Trace("mask", mask, "all")]))
    return out


def _time_align(src, dst, responses) -> tuple[float, list]:
    t0 = time.perf_counter()
    results = [align(src, ids, dst, traces) for _, ids, traces in responses]
    return time.perf_counter() - t0, results


def _time_anchor(enc_src, enc_dst, responses) -> float:
    t0 = time.perf_counter()
    for text, _, _ in responses:
        enc_src(text)
        enc_dst(text)
    return time.perf_counter() - t0


def main(quick: bool = False) -> dict:
    n_responses, rounds = (6, 2) if quick else (64, 7)
    paths = catalog.cached_paths()
    needed = sorted({t for pair in PAIRS for t in pair})
    missing = [t for t in needed if t not in paths]
    if missing:
        raise FailedPrecondition(f"mrl bench align: tokenizers {missing} are not in {catalog.cache_dir()}: "
                         f"run `make tokenizers`")
    vocabs = {t: load_vocab(t, paths[t]) for t in needed}
    raw = {t: _raw_encoder(t, paths[t]) for t in needed}
    machine = _machine()
    print(f"mrl bench align: {machine}\n  {len(PAIRS)} pairs × {n_responses} responses of {MIN_TOKENS}–{MAX_TOKENS} "
          f"source tokens, best of {rounds} rounds; anchor = source.encode + target.encode (libraries direct)",
          flush=True)
    data = {pair: _responses(vocabs[pair[0]], n_responses, seed=1000 + k) for k, pair in enumerate(PAIRS)}
    for (s, d), responses in data.items():                               # warm-up: caches, lazy imports
        _time_align(vocabs[s], vocabs[d], responses[:2])
        _time_anchor(raw[s], raw[d], responses[:2])
    best_align = {pair: math.inf for pair in PAIRS}
    best_anchor = {pair: math.inf for pair in PAIRS}
    results = {}
    for _ in range(rounds):
        for pair in PAIRS:
            s, d = pair
            best_anchor[pair] = min(best_anchor[pair], _time_anchor(raw[s], raw[d], data[pair]))
            t, results[pair] = _time_align(vocabs[s], vocabs[d], data[pair])
            best_align[pair] = min(best_align[pair], t)

    pairs, total_tokens, total_align, total_anchor = {}, 0, 0.0, 0.0
    header = (f"  {'pair':<22}{'tokens':>8}{'align tok/s':>13}{'anchor tok/s':>14}{'ratio':>7}{'chunks':>8}"
              f"{'1:1':>7}{'1:1 B':>7}{'lossless':>9}{'src/ch':>8}{'tgt/ch':>8}")
    print(header)
    for pair in PAIRS:
        s, d = pair
        tokens = int(sum(len(ids) for _, ids, _ in data[pair]))
        res = [r.residual for r in results[pair]]
        row = {
            "responses": len(res), "source_tokens": tokens,
            "align_tokens_per_s": round(tokens / best_align[pair]),
            "anchor_tokens_per_s": round(tokens / best_anchor[pair]),
            "ratio": round(best_anchor[pair] / best_align[pair], 3),
            "mean_chunks": round(float(np.mean([r.chunks for r in res])), 1),
            "one_to_one_share": round(float(np.mean([r.one_to_one_share for r in res])), 3),
            "one_to_one_byte_share": round(float(np.mean([r.one_to_one_byte_share for r in res])), 3),
            "lossless_share": round(float(np.mean([r.lossless for r in res])), 3),
            "mean_source_tokens_per_chunk": round(float(np.mean([r.mean_source_tokens_per_chunk for r in res])), 3),
            "mean_target_tokens_per_chunk": round(float(np.mean([r.mean_target_tokens_per_chunk for r in res])), 3),
            "max_target_tokens_per_chunk": int(max(r.max_target_tokens_per_chunk for r in res)),
        }
        pairs[f"{s}->{d}"] = row
        total_tokens += tokens
        total_align += best_align[pair]
        total_anchor += best_anchor[pair]
        print(f"  {s + ' -> ' + d:<22}{tokens:>8}{row['align_tokens_per_s']:>13,}{row['anchor_tokens_per_s']:>14,}"
              f"{row['ratio']:>7.2f}{row['mean_chunks']:>8.0f}{row['one_to_one_share']:>7.2f}"
              f"{row['one_to_one_byte_share']:>7.2f}{row['lossless_share']:>9.2f}"
              f"{row['mean_source_tokens_per_chunk']:>8.2f}{row['mean_target_tokens_per_chunk']:>8.2f}")
    ratio = round(total_anchor / total_align, 3)
    result = {"bench": "align", "machine": machine, "quick": quick, "rounds": rounds, "pairs": pairs,
              "source_tokens": total_tokens,
              "align_tokens_per_s": round(total_tokens / total_align),
              "anchor_tokens_per_s": round(total_tokens / total_anchor),
              "ratio": ratio,
              "anchor": "source.encode + target.encode of the same texts, same libraries called directly",
              "target": TARGET, "pass": ratio >= TARGET}
    print(f"  overall: align {result['align_tokens_per_s']:,} tok/s, anchor {result['anchor_tokens_per_s']:,} tok/s, "
          f"ratio {ratio} (target ≥ {TARGET}): {'pass' if result['pass'] else 'FAIL'}")
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    import sys
    main(quick="--quick" in sys.argv[1:])
