"""Prefill a prompt once and answer a guided choice from its KV cache.

``PromptCache`` keeps the KV caches of recent prompts (a small LRU per adapter): a prompt that begins as one
seen before (the same system prompt and instructions; the first step of every attempt at one task seed) is
prefilled only from where the two part, as vLLM's automatic prefix caching does.

``ChoiceWalk`` draws a guided choice as vLLM's grammar masks it (every token that keeps the text a prefix of some
choice), token by token, continuing from the prompt's cache: where more than one token is allowed it needs the
model's distribution there, which one forward of the tokens since the last place computed gives; a forced
token needs nothing. So a draw costs the prompt's (cached) prefill and
a forward of the drawn path, not one of every choice. ``ChoiceWalk.steps`` is the same draw as a generator that
says which log-probabilities it needs: :func:`advance_walks` computes those of several walks (several requests)
in one forward, as a continuous-batching engine's decode step does. ``score_choices`` scores every choice's tokens as one
batch continuing from the cache (the whole-sequence draw needs them all).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Generator, Sequence

from halo_agent.policies.guided_choice import Prefix, log_normaliser


@dataclasses.dataclass
class Prefilled:
    """A prompt's KV cache, one (keys, values) pair a layer of shape (1, heads, tokens, dim), and the model's
    log-probabilities for the token after it."""

    ids: tuple[int, ...]
    layers: list[tuple[Any, Any]]
    next_logprobs: Any  # (vocab,) float32
    # Tokens fed past the prompt in the same forward (a guided choice's draft), where a prefill was asked for them:
    # (those tokens, the cache of the prompt and them, the log-probabilities after each of them).
    ahead: tuple[tuple[int, ...], Prefilled, Any] | None = None

    def cache(self, length: int | None = None, batch: int = 1) -> Any:
        """A new ``DynamicCache`` holding the first ``length`` tokens (default: all), repeated ``batch`` times.
        The model appends to it without touching these tensors (it concatenates)."""
        from transformers import DynamicCache

        length = len(self.ids) if length is None else length
        return DynamicCache([(k[:, :, :length].expand(batch, -1, -1, -1), v[:, :, :length].expand(batch, -1, -1, -1))
                             for k, v in self.layers])


def _layers(cache: Any) -> list[tuple[Any, Any]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def extend(model: Any, start: Prefilled, length: int, ids: Sequence[int], keep: int = 0) -> tuple[Prefilled, Any]:
    """Feed ``ids[length:]`` after the first ``length`` tokens of ``start``'s cache (``length`` < len(ids)).
    Returns the prefilled ``ids`` and the log-probabilities after each fed token, shape (fed, vocab), or after
    the last ``keep`` of them (a prompt's: its other positions nothing reads)."""
    import torch

    fed = list(ids[length:])
    out = model(input_ids=torch.tensor([fed], device=start.next_logprobs.device), cache=start.cache(length),
                use_cache=True, logits_to_keep=keep)
    logprobs = out.logits[0].float().log_softmax(dim=-1)
    return Prefilled(tuple(ids), _layers(out.cache), logprobs[-1]), logprobs


class PromptCache:
    """The KV caches of the last ``capacity`` prompts per adapter; ``prefill`` reuses the longest shared prefix."""

    def __init__(self, capacity: int = 8) -> None:
        self.capacity = capacity
        self._entries: collections.OrderedDict[tuple[str | None, tuple[int, ...]], Prefilled] = collections.OrderedDict()
        self.hits = self.tokens_reused = self.tokens_prefilled = 0
        self.batched_prefills = self.batched_prompts = 0  # forwards that prefilled several prompts, and those prompts

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every cache (the weights behind them changed: an adapter loaded or unloaded)."""
        self._entries.clear()

    def prefill(self, model: Any, prompt_ids: Sequence[int], adapter: str | None, device: str,
                draft: Sequence[int] = ()) -> Prefilled:
        """The prompt's cache, from the longest cached prefix on. ``draft``: tokens likely to follow, fed in the
        same forward where the prompt is not cached whole; what they gave is the answer's ``ahead``, kept with it
        (a later hit gets it too; the prompt's own cache and log-probabilities are those of the prompt alone)."""
        import torch

        ids = tuple(int(t) for t in prompt_ids)
        if (adapter, ids) in self._entries:
            self._entries.move_to_end((adapter, ids))
            self.hits += 1
            self.tokens_reused += len(ids)
            return self._entries[(adapter, ids)]
        best, shared = self._nearest(adapter, ids)
        draft = tuple(int(t) for t in draft)
        if best is None:
            out = model(input_ids=torch.tensor([list(ids + draft)], device=device), use_cache=True, logits_to_keep=len(draft) + 1)
            layers, rows = _layers(out.cache), out.logits[0].float().log_softmax(dim=-1)
        else:
            whole, rows = extend(model, best, shared, ids + draft, keep=len(draft) + 1)
            layers = whole.layers
        prefilled = Prefilled(ids, [(k[:, :, :len(ids)], v[:, :, :len(ids)]) for k, v in layers] if draft else layers, rows[0])
        if draft:  # kept with the prompt (the same tensors): a later hit on it gets the draft's positions too
            prefilled.ahead = (draft, Prefilled(ids + draft, layers, rows[-1]), rows[1:])
        self.tokens_reused += shared
        self.tokens_prefilled += len(ids) - shared
        self._entries[(adapter, ids)] = prefilled
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return prefilled

    def _nearest(self, adapter: str | None, ids: tuple[int, ...]) -> tuple[Prefilled | None, int]:
        """The cached prompt sharing the longest prefix with ``ids`` and that length (``None, 0`` where none does);
        at most ``len(ids) - 1``: at least one token is fed, whose logits are the next token's."""
        best, shared = None, 0
        for (key, _), entry in self._entries.items():
            if key == adapter:
                n = _common_length(entry.ids, ids)
                if n > shared:
                    best, shared = entry, n
        shared = min(shared, len(ids) - 1)
        return (best, shared) if shared else (None, 0)

    def prefill_many(self, model: Any, prompts: Sequence[Sequence[int]], adapter: str | None, device: str,
                     drafts: Sequence[Sequence[int]] | None = None) -> list[Prefilled]:
        """``prefill`` of several prompts under one adapter (each with its ``drafts`` entry, as ``prefill``'s
        ``draft``), what each needs fed as one batch (:func:`forward_padded`: each continues from its own longest
        cached prefix). Each prompt's cache and next-token log-probabilities are stored as ``prefill`` alone would
        store them (equal within float rounding)."""
        keys = [tuple(int(t) for t in p) for p in prompts]
        wanted = dict(zip(keys, (tuple(int(t) for t in d) for d in drafts))) if drafts is not None else {}
        fresh = [ids for ids in dict.fromkeys(keys) if (adapter, ids) not in self._entries]
        if len(fresh) < 2:
            return [self.prefill(model, ids, adapter, device, wanted.get(ids, ())) for ids in keys]
        # (ids and draft, the cache they continue from, its length)
        plans = [(ids + wanted.get(ids, ()), *self._nearest(adapter, ids)) for ids in fresh]
        keep = [len(wanted.get(ids, ())) + 1 for ids in fresh]
        done = {}
        for ids, (_, _, shared), (layers, rows) in zip(fresh, plans, forward_padded(model, plans, device, keep=keep)):
            draft, n = wanted.get(ids, ()), len(ids)
            # Stored for later prompts: copies, so the batch's own tensors are freed.
            layers = [(k.clone(), v.clone()) for k, v in layers]
            done[ids] = Prefilled(ids, [(k[:, :, :n], v[:, :, :n]) for k, v in layers] if draft else layers, rows[0])
            if draft:
                done[ids].ahead = (draft, Prefilled(ids + draft, layers, rows[-1]), rows[1:])
            self.tokens_reused += shared
            self.tokens_prefilled += n - shared
            self._entries[(adapter, ids)] = done[ids]
        self.batched_prefills += 1
        self.batched_prompts += len(plans)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return [done[ids] if ids in done else self.prefill(model, ids, adapter, device, wanted.get(ids, ())) for ids in keys]


Plan = tuple[tuple[int, ...], "Prefilled | None", int]  # token ids, the cache they continue from (or none), its length


def forward_padded(model: Any, plans: Sequence[Plan], device: str, keep: Sequence[int] | None = None) -> list[tuple[list[tuple[Any, Any]], Any]]:
    """One forward feeding each plan's ``ids[shared:]`` after the first ``shared`` tokens of its own cache: the caches
    left-padded to one length and masked there, each row's tokens at their own positions, the fed tokens
    right-padded and masked. Per plan: its ``ids``' cache, one (keys, values) pair a layer of shape
    (1, heads, len(ids), dim) (views of the batch's tensors), and the log-probabilities after each fed token,
    shape (fed, vocab), or after the last ``keep[i]`` of plan i's. Equal within float rounding to feeding each plan
    alone (:func:`extend`)."""
    import torch

    cached = max(shared for _, _, shared in plans)
    fed = max(len(ids) - shared for ids, _, shared in plans)
    pad = plans[0][0][0]  # any token: padded places are masked and cut away
    input_ids = torch.tensor([list(ids[shared:]) + [pad] * (fed - len(ids) + shared) for ids, _, shared in plans], device=device)
    mask = torch.tensor([[0] * (cached - shared) + [1] * len(ids) + [0] * (fed - len(ids) + shared)
                         for ids, _, shared in plans], device=device)
    positions = torch.stack([torch.arange(shared, shared + fed, device=device) for _, _, shared in plans])
    kwargs: dict[str, Any] = {}
    if cached:
        from transformers import DynamicCache

        template = next(start for _, start, _ in plans if start is not None).layers
        layers = []
        for layer, pair in enumerate(template):
            padded = []
            for which, like in enumerate(pair):
                block = like.new_zeros(len(plans), like.shape[1], cached, like.shape[3])
                for i, (_, start, shared) in enumerate(plans):
                    if start is not None and shared:
                        block[i, :, cached - shared:] = start.layers[layer][which][0, :, :shared]
                padded.append(block)
            layers.append(tuple(padded))
        kwargs["cache"] = DynamicCache(layers)
    if keep is None:
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=0, **kwargs)
        logits = [out.logits[i, :len(ids) - shared] for i, (ids, _, shared) in enumerate(plans)]
    else:
        # the positions any row keeps, computed for every row (lm_head over those only), each row then taking its own
        wanted = [range(len(ids) - shared - k, len(ids) - shared) for (ids, _, shared), k in zip(plans, keep)]
        kept = sorted({j for positions in wanted for j in positions})
        at = {j: n for n, j in enumerate(kept)}
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                    logits_to_keep=torch.tensor(kept, device=device), **kwargs)
        logits = [out.logits[i, [at[j] for j in positions]] for i, positions in enumerate(wanted)]
    rows = []
    for i, (ids, _, shared) in enumerate(plans):
        start = cached - shared
        rows.append(([(k[i:i + 1, :, start:start + len(ids)], v[i:i + 1, :, start:start + len(ids)]) for k, v in _layers(out.cache)],
                     logits[i].float().log_softmax(dim=-1)))
    return rows


class ChoiceWalk:
    """Draws a guided choice token by token under ``mask`` (a :class:`ChoiceMask`: vLLM's string-prefix mask),
    from ``root``, the prompt's cache; each path drawn ends in the mask's EOS."""

    def __init__(self, model: Any, root: Prefilled, mask: Any, kept_caches: int = 4, draft: int = 8) -> None:
        self.model, self.root, self.mask = model, root, mask
        # Each forward also feeds up to ``draft`` tokens the mask says are likely next (``ChoiceMask.draft``): on a
        # CPU or a GPU a decode forward of a few more tokens costs about as much as one, and a draw that follows
        # them needs no forward of its own. The draw and its log-probabilities are the same either way.
        self.draft = draft
        self.forwards = 0
        self._logprobs: dict[Prefix, Any] = {(): root.next_logprobs}  # the model's log-probs after each prefix
        # Where the last few forwards ended, to continue from (each holds the whole prompt's KV: a draw of many
        # samples keeps ``kept_caches`` of them and goes back to the prompt's cache for the rest).
        self._caches: collections.OrderedDict[Prefix, Prefilled] = collections.OrderedDict()
        self.kept_caches = kept_caches
        if root.ahead is not None:  # the prompt's prefill fed a draft: its positions are known already
            self._record(*_ahead(root), counted=False)

    def logprobs(self, prefix: Prefix) -> Any:
        """The model's log-probabilities for the token after ``prefix`` (one forward from the nearest cache)."""
        if prefix not in self._logprobs:
            start, shared = self._nearest(prefix)
            path = self.fed_path(prefix)
            self._record(path, shared, *extend(self.model, start, len(self.root.ids) + shared, self.root.ids + path))
        return self._logprobs[prefix]

    def fed_path(self, prefix: Prefix) -> Prefix:
        """What a forward for ``prefix`` computes: ``prefix`` and its draft."""
        return prefix + tuple(self.mask.draft(prefix, self.draft)) if self.draft else prefix

    def _nearest(self, prefix: Prefix) -> tuple[Prefilled, int]:
        """The kept cache sharing the longest part of ``prefix`` (the prompt's where none does), and that length."""
        return max(((cached, _common_length(p, prefix)) for p, cached in self._caches.items()),
                   key=lambda item: item[1], default=(self.root, 0))

    def _record(self, prefix: Prefix, shared: int, prefilled: Prefilled, rows: Any, counted: bool = True) -> None:
        """Keep the cache a forward ended at, and the log-probabilities after each token it fed (from ``shared`` on)."""
        self.forwards += counted
        self._caches[prefix] = prefilled
        while len(self._caches) > self.kept_caches:
            self._caches.popitem(last=False)
        for k in range(len(rows)):
            self._logprobs[prefix[:shared + k + 1]] = rows[k]

    def steps(self, temperature: float, generator: Any = None) -> Generator[Prefix, None, Prefix]:
        """``draw`` as a generator: it yields each prefix whose log-probabilities it needs and does not have, to be
        computed (``logprobs``, or :func:`advance_walks` with other walks' in one forward) before it is resumed,
        and returns the path. Its random draws are the same whichever computes them."""
        import torch

        prefix: Prefix = ()
        while not self.mask.finished(prefix):
            allowed = self.mask.allowed(prefix)
            if not allowed:
                raise ValueError("the guided choice's mask allows no token here: is a choice empty?")
            if len(allowed) == 1:
                prefix += (allowed[0],)
                continue
            if prefix not in self._logprobs:
                yield prefix
            values = self._logprobs[prefix][allowed].double()
            if temperature > 0:
                pick = int(torch.multinomial(torch.softmax(values / temperature, dim=0), 1, generator=generator))
            else:
                pick = max(range(len(allowed)), key=lambda k: float(values[k]))  # max keeps the first of equals
            prefix += (allowed[pick],)
        return prefix

    def draw(self, temperature: float, generator: Any = None) -> Prefix:
        """One path of token ids (EOS last): at each step a token from the allowed ones' renormalised distribution
        at ``temperature`` (0: the most likely, the lowest id of equals); a lone allowed token is forced."""
        steps = self.steps(temperature, generator)
        try:
            while True:
                self.logprobs(next(steps))
        except StopIteration as done:
            return done.value

    def token_logprobs(self, path: Sequence[int], temperature: float) -> tuple[list[float], list[dict[int, float]]]:
        """Along ``path``: each token's logprob under the mask at ``temperature`` (its share of the allowed tokens'
        renormalised distribution, a forced token 0.0), and every allowed token's there."""
        tokens = tuple(path)
        values, allowed_values = [], []
        for j, token in enumerate(tokens):
            prefix, allowed = tokens[:j], self.mask.allowed(tokens[:j])
            if len(allowed) <= 1:
                at = {token: 0.0}
            else:
                row = self.logprobs(prefix)
                raw_values = {t: float(row[t]) for t in allowed}
                norm = log_normaliser(list(raw_values.values()), temperature)
                at = {t: v / temperature - norm for t, v in raw_values.items()}
            values.append(at[token])
            allowed_values.append(at)
        return values, allowed_values


def _ahead(root: Prefilled) -> tuple[Prefix, int, Prefilled, Any]:
    tokens, cache, rows = root.ahead
    return tokens, 0, cache, rows


def advance_walks(model: Any, needs: Sequence[tuple[ChoiceWalk, Prefix]], device: str, together_from: int = 2) -> list[int]:
    """The log-probabilities each walk needs after its prefix, every walk's from its nearest cache, as one forward
    (:func:`forward_padded`): continuous batching's decode step. Fewer than ``together_from`` needs run one
    forward each (``ChoiceWalk.logprobs``). Returns the walks each forward advanced."""
    if len(needs) < max(together_from, 2):
        for walk, prefix in needs:
            walk.logprobs(prefix)
        return [1] * len(needs)
    plans, starts, paths = [], [], []
    for walk, prefix in needs:
        start, shared = walk._nearest(prefix)
        paths.append(walk.fed_path(prefix))
        plans.append((walk.root.ids + paths[-1], start, len(walk.root.ids) + shared))
        starts.append(shared)
    batch = forward_padded(model, plans, device)
    for (walk, _), path, shared, (layers, rows) in zip(needs, paths, starts, batch):
        walk._record(path, shared, Prefilled(walk.root.ids + path, layers, rows[-1]), rows)
    return [len(needs)]


def score_choices(model: Any, root: Prefilled, completions: Sequence[Sequence[int]], pad: int, batch: int = 16) -> list[list[float]]:
    """The model's log-probability of every completion token after the prompt, the completions right-padded and
    scored a batch at a time, continuing from the prompt's cache."""
    import torch

    out: list[list[float]] = []
    prompt = len(root.ids)
    for start in range(0, len(completions), batch):
        chunk = [list(c) for c in completions[start:start + batch]]
        width = max(len(c) for c in chunk)
        ids = torch.tensor([c + [pad] * (width - len(c)) for c in chunk], device=root.next_logprobs.device)
        mask = torch.tensor([[1] * (prompt + len(c)) + [0] * (width - len(c)) for c in chunk], device=ids.device)
        logits = model(input_ids=ids, attention_mask=mask, cache=root.cache(batch=len(chunk)), use_cache=True).logits
        # The first token's log-probs come from the prompt's last position; each later one's from the token before.
        logprobs = logits[:, :-1].float().log_softmax(dim=-1)
        for i, c in enumerate(chunk):
            out.append([float(root.next_logprobs[c[0]])] + [float(logprobs[i, j - 1, t]) for j, t in enumerate(c) if j > 0])
    return out
