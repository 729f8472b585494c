"""A guided choice's draw, as arithmetic on the choices' tokens: which tokens are allowed where, and the
log-probability of each token under the distribution a draw takes it from.

A guided choice's completions are the choices' token ids, each followed by EOS. Where every remaining choice
shares the next token it is forced; where they part the draw decides. These functions take the raw
log-probability (the model's log-softmax) of every completion token after its prefix and give:

- :func:`masked_token_logprobs`: vLLM's guided choice (each step masked to the allowed tokens and sampled from
  the renormalised distribution at the temperature); a forced token has log-probability 0.
- :func:`sequence_token_logprobs`: the whole-sequence draw (a choice in proportion to exp(log p / temperature)
  of its whole sequence), written token by token: the probability of each token given the tokens before it.

Each completion's per-token values sum to the log-probability of drawing that choice, so the values of all
choices describe one distribution over them (they sum to 1 in probability). These take one tokenisation per
choice: the whole-sequence draw (``--choice-draw sequence``) scores each choice's own tokens.

vLLM's grammar backends mask by text, not by one tokenisation: :class:`ChoiceMask` allows every token whose
bytes (:func:`token_bytes`) keep the text a prefix of some choice, and EOS once it is a whole choice. HALO's
chat server draws a guided choice under it and the trainer (``halo_train.behaviour``) rebuilds it.
"""

from __future__ import annotations

import math
from typing import Sequence

Prefix = tuple[int, ...]


def branches(completions: Sequence[Sequence[int]], token_logprobs: Sequence[Sequence[float]]) -> dict[Prefix, dict[int, float]]:
    """For every prefix the choices share: the tokens allowed next and each one's raw logprob there (the same for
    every choice with that prefix, since the model saw the same context), in the order the choices are listed."""
    nodes: dict[Prefix, dict[int, float]] = {}
    for tokens, lps in zip(completions, token_logprobs):
        for j, (token, lp) in enumerate(zip(tokens, lps)):
            nodes.setdefault(tuple(tokens[:j]), {})[token] = float(lp)
    return nodes


def allowed_tokens(completions: Sequence[Sequence[int]]) -> dict[Prefix, list[int]]:
    """For every prefix the choices share: the tokens that continue some choice, in the order the choices are listed."""
    nodes: dict[Prefix, dict[int, None]] = {}
    for tokens in completions:
        for j, token in enumerate(tokens):
            nodes.setdefault(tuple(tokens[:j]), {})[token] = None
    return {prefix: list(tokens) for prefix, tokens in nodes.items()}


def log_normaliser(logprobs: Sequence[float], temperature: float) -> float:
    """log sum exp(lp / temperature) over ``logprobs``: what renormalises them at the temperature."""
    top = max(logprobs) / temperature
    return top + math.log(sum(math.exp(lp / temperature - top) for lp in logprobs))


def masked_token_logprobs(completions: Sequence[Sequence[int]], token_logprobs: Sequence[Sequence[float]],
                          temperature: float = 1.0) -> list[list[float]]:
    """Per completion token: its log-probability when decoding is masked, step by step, to the tokens that continue
    an allowed choice and sampled at ``temperature`` (vLLM's guided choice). A token every remaining choice shares
    is forced (0.0); where the choices part, the token's share of the allowed ones at the temperature."""
    nodes = branches(completions, token_logprobs)
    # Each place where the choices part, normalised once.
    norms = {prefix: log_normaliser(list(allowed.values()), temperature) for prefix, allowed in nodes.items() if len(allowed) > 1}
    out = []
    for tokens in completions:
        row = []
        for j, token in enumerate(tokens):
            prefix = tuple(tokens[:j])
            row.append(nodes[prefix][token] / temperature - norms[prefix] if prefix in norms else 0.0)
        out.append(row)
    return out


def masked_choice_logprobs(completions: Sequence[Sequence[int]], token_logprobs: Sequence[Sequence[float]],
                           temperature: float = 1.0) -> list[float]:
    """Each choice's log-probability when decoding is masked, step by step, to the tokens that continue an allowed
    choice and sampled at ``temperature`` (vLLM's guided choice): the sum, over the places where the choices part,
    of the chosen token's share of the allowed ones. A token every remaining choice shares is forced (log 1).
    The results are the log-probabilities of one distribution over the choices (they sum to 1 in probability)."""
    out = []
    for row in masked_token_logprobs(completions, token_logprobs, temperature):
        total = 0.0
        for value in row:
            total += value
        out.append(total)
    return out


def greedy_masked_choice(completions: Sequence[Sequence[int]], token_logprobs: Sequence[Sequence[float]]) -> int:
    """The choice greedy decoding under the mask reaches (temperature 0 in vLLM's guided choice): the most likely
    allowed token at each place where the choices part (the first choice's on a tie)."""
    nodes = branches(completions, token_logprobs)  # each node's tokens in the order the choices are listed
    index = {tuple(tokens): i for i, tokens in enumerate(completions)}
    prefix: Prefix = ()
    while prefix not in index:
        allowed = nodes[prefix]
        prefix += (max(allowed, key=allowed.__getitem__),)  # max keeps the first of equals
    return index[prefix]


def sequence_token_logprobs(completions: Sequence[Sequence[int]], token_logprobs: Sequence[Sequence[float]],
                            temperature: float = 1.0) -> list[list[float]]:
    """Per completion token: its probability, given the tokens before it, under the whole-sequence draw (each choice
    weighs exp(sum of its raw logprobs / temperature)): log of the weight of the choices through prefix + token
    over the weight of those through prefix. Each row sums to the choice's log-softmax of the sequence scores."""
    scores = [sum(lps) / temperature for lps in token_logprobs]
    through: dict[Prefix, list[float]] = {}
    for tokens, score in zip(completions, scores):
        for j in range(len(tokens) + 1):
            through.setdefault(tuple(tokens[:j]), []).append(score)
    mass = {prefix: log_normaliser(values, 1.0) for prefix, values in through.items()}
    return [[mass[tuple(tokens[:j + 1])] - mass[tuple(tokens[:j])] for j in range(len(tokens))] for tokens in completions]


# ------------------------------------------------------------------------------------ vLLM's string-prefix mask

def token_bytes(tokenizer) -> list[bytes]:
    """Each token id's bytes, as a grammar backend reads the vocabulary (xgrammar's ``TokenizerInfo``): a byte-level
    BPE token's bytes through GPT-2's byte alphabet, a byte-fallback token ``<0x0A>`` its byte, a SentencePiece
    piece with ``▁`` as a space; special tokens (EOS among them) are ``b""``, never part of a choice's text.
    Computed once per tokenizer object."""
    cached = getattr(tokenizer, "_halo_token_bytes", None)
    if cached is not None:
        return cached
    size = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special |= {i for i, t in added.items() if getattr(t, "special", False)}
    decoder = _decoder_kind(tokenizer)
    alphabet = {c: b for b, c in _byte_alphabet().items()}
    out: list[bytes] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(b"")
        elif i in added:  # an added (non-special) token: its text as written
            out.append(str(piece).encode("utf-8"))
        elif decoder == "byte_level" and all(c in alphabet for c in piece):
            out.append(bytes(alphabet[c] for c in piece))
        elif decoder == "byte_fallback" and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out.append(bytes([int(piece[3:5], 16)]))
        elif decoder in ("byte_fallback", "metaspace"):
            out.append(piece.replace("\u2581", " ").encode("utf-8"))
        else:
            out.append(tokenizer.decode([i]).encode("utf-8"))
    try:
        tokenizer._halo_token_bytes = out
    except AttributeError:  # a tokenizer that takes no new attributes: computed again next time
        pass
    return out


def _decoder_kind(tokenizer) -> str:
    """How the tokenizer's pieces map to text: byte_level (GPT-2, Qwen, Llama 3), byte_fallback (Llama 2,
    Mistral), metaspace (SentencePiece without byte fallback), or other."""
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "other"
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = [d.get("type") for d in decoder.get("decoders", [decoder])]
    if "ByteLevel" in kinds:
        return "byte_level"
    if "ByteFallback" in kinds:
        return "byte_fallback"
    return "metaspace" if "Metaspace" in kinds or "Replace" in kinds else "other"


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's map of each byte to the printable character byte-level BPE writes it as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


class ChoiceMask:
    """vLLM's guided choice as its grammar backends mask decoding: at each step every token whose bytes keep the
    text generated so far a prefix of some choice is allowed (not only each choice's own tokenisation), and
    ``eos`` once the text is a whole choice; generation ends on ``eos``. ``allowed`` lists token ids ascending
    (greedy takes the first of equals, as an argmax over the masked logits does)."""

    def __init__(self, tokenizer, choices: Sequence[str], eos: int) -> None:
        self.choices = list(choices)
        self.eos = int(eos)
        self.bytes = token_bytes(tokenizer)
        self._texts = {c.encode("utf-8"): i for i, c in enumerate(self.choices)}
        by_bytes = getattr(tokenizer, "_halo_ids_by_bytes", None)
        if by_bytes is None:
            by_bytes = {}
            for i, b in enumerate(self.bytes):
                if b:
                    by_bytes.setdefault(b, []).append(i)
            try:
                tokenizer._halo_ids_by_bytes = by_bytes
            except AttributeError:
                pass
        self._by_bytes = by_bytes
        self._longest = max(map(len, by_bytes), default=1)
        self._memo: dict[bytes, list[int]] = {}
        self._drafts: dict[tuple[tuple[int, ...], int], list[tuple[int, ...]]] = {}
        self._splits: dict[bytes, list[int]] = {}
        self._tokenizer = tokenizer

    def text(self, prefix: Sequence[int]) -> bytes:
        return b"".join(self.bytes[t] for t in prefix if t != self.eos)

    def allowed_after_text(self, text: bytes) -> list[int]:
        if text not in self._memo:
            ids: set[int] = set()
            for choice in self._texts:
                if choice.startswith(text):
                    rest = choice[len(text):]
                    for k in range(1, min(len(rest), self._longest) + 1):
                        ids.update(self._by_bytes.get(rest[:k], ()))
            if text in self._texts:
                ids.add(self.eos)
            self._memo[text] = sorted(ids)
        return self._memo[text]

    def draft(self, prefix: Sequence[int], limit: int = 48) -> list[tuple[int, ...]]:
        """Token paths likely to follow ``prefix``, to feed with it so one forward gives the model's distribution
        after each of them too (a draw that takes them needs no forward there; one that parts from them loses
        nothing): every open choice's rest, as the tokenizer splits the whole choice where ``prefix`` follows that
        split (else in longest-match tokens), each path after its parent, shared beginnings once, at most ``limit``
        paths. Only paths after which the mask allows more than one token, and their ancestors: elsewhere the next
        token is forced and needs no distribution. None after ``eos``."""
        if prefix and prefix[-1] == self.eos:
            return []
        key = (tuple(prefix), limit)
        if key not in self._drafts:
            text = self.text(prefix)
            paths: dict[tuple[int, ...], None] = {}
            for choice in self._texts:
                if not choice.startswith(text) or len(paths) >= limit:
                    continue
                split = self._split(choice)
                if tuple(split[:len(prefix)]) == tuple(prefix):
                    rest = split[len(prefix):]
                else:
                    rest = self._longest_match(choice[len(text):])
                for k in range(1, len(rest or ()) + 1):
                    if len(paths) >= limit:
                        break
                    paths.setdefault(tuple(rest[:k]))
            # keep a path where the draw needs a distribution after it, and every parent of one kept
            kept: set[tuple[int, ...]] = set()
            for path in reversed(list(paths)):
                if path in kept or len(self.allowed(tuple(prefix) + path)) > 1:
                    kept.update(path[:k] for k in range(1, len(path) + 1))
            self._drafts[key] = [path for path in paths if path in kept]
        return self._drafts[key]

    def _split(self, choice: bytes) -> list[int]:
        """The tokenizer's own split of a whole choice."""
        if choice not in self._splits:
            self._splits[choice] = list(self._tokenizer(choice.decode("utf-8"), add_special_tokens=False)["input_ids"])
        return self._splits[choice]

    def _longest_match(self, rest: bytes) -> list[int] | None:
        """``rest`` in longest-match tokens; None where no token spells the next bytes alone."""
        ids, at = [], 0
        while at < len(rest):
            for k in range(min(len(rest) - at, self._longest), 0, -1):
                if rest[at:at + k] in self._by_bytes:
                    ids.append(self._by_bytes[rest[at:at + k]][0])
                    at += k
                    break
            else:
                return None
        return ids

    def allowed(self, prefix: Sequence[int]) -> list[int]:
        """The tokens allowed after ``prefix`` (token ids generated so far); none after ``eos``."""
        if prefix and prefix[-1] == self.eos:
            return []
        return self.allowed_after_text(self.text(prefix))

    def finished(self, prefix: Sequence[int]) -> bool:
        return bool(prefix) and prefix[-1] == self.eos

    def choice_index(self, prefix: Sequence[int]) -> int | None:
        """The choice a finished ``prefix`` spells, or None."""
        return self._texts.get(self.text(prefix)) if self.finished(prefix) else None

    def allowed_along(self, completion: Sequence[int]) -> list[list[int]]:
        """For each position of ``completion``: the tokens allowed there, the completion's own first."""
        out = []
        for j, token in enumerate(completion):
            allowed = self.allowed(completion[:j])
            out.append([int(token)] + [t for t in allowed if t != token])
        return out
