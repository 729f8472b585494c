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
choices describe one distribution over them (they sum to 1 in probability).
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
