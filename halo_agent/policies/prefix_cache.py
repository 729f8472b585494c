"""Prefill a prompt once and answer a guided choice from its KV cache.

``PromptCache`` keeps the KV caches of recent prompts (a small LRU per adapter): a prompt that begins as one
seen before (the same system prompt and instructions; the first step of every attempt at one task seed) is
prefilled only from where the two part, as vLLM's automatic prefix caching does.

``ChoiceWalk`` draws a guided choice as vLLM's grammar masks it (every token that keeps the text a prefix of some
choice), token by token, continuing from the prompt's cache: where more than one token is allowed it needs the
model's distribution there, which one forward of the tokens since the last place computed gives; a forced
token needs nothing. So a draw costs the prompt's (cached) prefill and
a forward of the drawn path, not one of every choice. Each forward (and the prompt's prefill) also feeds a tree
of every open choice's rest (:func:`forward_padded`, ``ChoiceMask.draft``), so a draw that follows the tokenizer's
split needs no forward after the prefill. ``ChoiceWalk.steps`` is the same draw as a generator that says which
log-probabilities it needs: :func:`advance_walks` computes those of several walks (several requests) in one
forward, as a continuous-batching engine's decode step does. ``score_choices`` scores every choice's tokens as one
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
    # A draft fed past the prompt in the same forward (a guided choice's token tree, where a prefill was asked for
    # one): its paths and the log-probabilities after each (its KV is not kept: the cache is the prompt's).
    ahead: tuple[tuple[Prefix, ...], Any] | None = None

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
                draft: Sequence[Prefix] = ()) -> Prefilled:
        """The prompt's cache, from the longest cached prefix on. ``draft``: token paths likely to follow (a tree,
        each path after its parent, :func:`forward_padded`), fed in the same forward where the prompt is not
        cached whole; the log-probabilities after each are the answer's ``ahead``, kept with it (a later hit gets
        them too; the prompt's own cache and log-probabilities are those of the prompt alone)."""
        ids = tuple(int(t) for t in prompt_ids)
        if (adapter, ids) in self._entries:
            self._entries.move_to_end((adapter, ids))
            self.hits += 1
            self.tokens_reused += len(ids)
            return self._entries[(adapter, ids)]
        best, shared = self._nearest(adapter, ids)
        draft = tuple(tuple(int(t) for t in path) for path in draft)
        (layers, rows, tree_rows), = forward_padded(model, [(ids, best, shared, draft)], device, keep=[1])
        prefilled = Prefilled(ids, layers, rows[-1], ahead=(draft, tree_rows) if draft else None)
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
                     drafts: Sequence[Sequence[Prefix]] | None = None) -> list[Prefilled]:
        """``prefill`` of several prompts under one adapter (each with its ``drafts`` entry, as ``prefill``'s
        ``draft``), what each needs fed as one batch (:func:`forward_padded`: each continues from its own longest
        cached prefix). Each prompt's cache and next-token log-probabilities are stored as ``prefill`` alone would
        store them (equal within float rounding)."""
        keys = [tuple(int(t) for t in p) for p in prompts]
        wanted = {}
        for ids, draft in zip(keys, drafts or ()):
            wanted[ids] = tuple(tuple(int(t) for t in path) for path in draft)
        fresh = [ids for ids in dict.fromkeys(keys) if (adapter, ids) not in self._entries]
        if len(fresh) < 2:
            return [self.prefill(model, ids, adapter, device, wanted.get(ids, ())) for ids in keys]
        # (ids, the cache they continue from, its length, the draft)
        plans = [(ids, *self._nearest(adapter, ids), wanted.get(ids, ())) for ids in fresh]
        done = {}
        for (ids, _, shared, draft), (layers, rows, tree_rows) in zip(plans, forward_padded(model, plans, device, keep=[1] * len(plans))):
            # Stored for later prompts: copies, so the batch's own tensors are freed.
            done[ids] = Prefilled(ids, [(k.clone(), v.clone()) for k, v in layers], rows[-1],
                                  ahead=(draft, tree_rows) if draft else None)
            self.tokens_reused += shared
            self.tokens_prefilled += len(ids) - shared
            self._entries[(adapter, ids)] = done[ids]
        self.batched_prefills += 1
        self.batched_prompts += len(plans)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return [done[ids] if ids in done else self.prefill(model, ids, adapter, device, wanted.get(ids, ())) for ids in keys]


# token ids, the cache they continue from (or none), its length, and a draft: token paths branching from ids' end
Plan = tuple[tuple[int, ...], "Prefilled | None", int, tuple[Prefix, ...]]


def forward_padded(model: Any, plans: Sequence[Plan], device: str,
                   keep: Sequence[int] | None = None) -> list[tuple[list[tuple[Any, Any]], Any, Any]]:
    """One forward of several rows, each feeding its plan's ``ids[shared:]`` after the first ``shared`` tokens of
    its own cache, then its draft: a tree of token paths branching from the end of ``ids`` (each path after its
    parent, ``path[:-1]``), every node attending to the cache, the fed ids and its own ancestors only, at the
    position it would have in a sequence. The caches are left-padded to one length and masked there, the fed
    tokens right-padded and masked (one 4-D attention mask). Per plan: the cache of its ``ids``, one (keys, values)
    pair a layer of shape (1, heads, len(ids), dim) (views of the batch's tensors; a draft's keys are not kept),
    the log-probabilities after each fed id, shape (fed, vocab) (or after the last ``keep[i]``), and after each
    draft node, shape (nodes, vocab). Equal within float rounding to feeding each row, and each of its draft's
    paths, alone."""
    import torch

    cached = max(shared for _, _, shared, _ in plans)
    chains = [len(ids) - shared for ids, _, shared, _ in plans]
    width = max(n + len(tree) for n, (_, _, _, tree) in zip(chains, plans))
    pad = plans[0][0][0]  # any token: padded places are masked and cut away
    # one row without a tree is plain causal attention, as a forward of that row alone: no mask to build
    masked = len(plans) > 1 or bool(plans[0][3])
    input_ids = torch.full((len(plans), width), pad, dtype=torch.long)
    positions = torch.zeros((len(plans), width), dtype=torch.long)
    mask = torch.zeros((len(plans), 1, width, cached + width) if masked else (0,), dtype=torch.bool)
    for i, ((ids, _, shared, tree), n) in enumerate(zip(plans, chains)):
        input_ids[i, :n] = torch.tensor(ids[shared:])
        positions[i, :n] = torch.arange(shared, shared + n)
        node = {path: n + j for j, path in enumerate(tree)}
        for path, q in node.items():
            input_ids[i, q] = path[-1]
            positions[i, q] = shared + n - 1 + len(path)
        if not masked:
            continue
        mask[i, 0, :n + len(tree), cached - shared:cached] = True  # its own cache
        mask[i, 0, :n, cached:cached + n] = torch.ones(n, n, dtype=torch.bool).tril()  # the fed ids, causally
        mask[i, 0, n:n + len(tree), cached:cached + n] = True  # a node sees every fed id
        for path, q in node.items():
            for k in range(1, len(path) + 1):  # itself and its ancestors in the tree
                mask[i, 0, q, cached + node[path[:k]]] = True
        for q in range(n + len(tree), width):  # a padded place sees itself only (no row of the mask is empty)
            mask[i, 0, q, cached + q] = True
    kwargs: dict[str, Any] = {"attention_mask": mask.to(device)} if masked else {}
    if len(plans) == 1 and cached:
        kwargs["cache"] = plans[0][1].cache(cached)  # its own cache as it is: no padded copy
    elif cached:
        from transformers import DynamicCache

        template = next(start for _, start, _, _ in plans if start is not None).layers
        layers = []
        for layer, pair in enumerate(template):
            padded = []
            for which, like in enumerate(pair):
                block = like.new_zeros(len(plans), like.shape[1], cached, like.shape[3])
                for i, (_, start, shared, _) in enumerate(plans):
                    if start is not None and shared:
                        block[i, :, cached - shared:] = start.layers[layer][which][0, :, :shared]
                padded.append(block)
            layers.append(tuple(padded))
        kwargs["cache"] = DynamicCache(layers)
    # the places any row reads, lm_head computed over those only; each row then takes its own
    wanted = [list(range(n - (n if keep is None else keep[i]), n + len(tree))) for i, ((_, _, _, tree), n) in enumerate(zip(plans, chains))]
    kept = sorted({q for places in wanted for q in places})
    at = {q: m for m, q in enumerate(kept)}
    out = model(input_ids=input_ids.to(device), position_ids=positions.to(device), use_cache=True,
                logits_to_keep=torch.tensor(kept, device=device), **kwargs)
    rows = []
    for i, ((ids, _, shared, tree), n, places) in enumerate(zip(plans, chains, wanted)):
        logprobs = out.logits[i, [at[q] for q in places]].float().log_softmax(dim=-1)
        start = cached - shared
        rows.append(([(k[i:i + 1, :, start:start + len(ids)], v[i:i + 1, :, start:start + len(ids)]) for k, v in _layers(out.cache)],
                     logprobs[:len(places) - len(tree)], logprobs[len(places) - len(tree):]))
    return rows


class ChoiceWalk:
    """Draws a guided choice token by token under ``mask`` (a :class:`ChoiceMask`: vLLM's string-prefix mask),
    from ``root``, the prompt's cache; each path drawn ends in the mask's EOS."""

    def __init__(self, model: Any, root: Prefilled, mask: Any, kept_caches: int = 4, draft: int = 48) -> None:
        self.model, self.root, self.mask = model, root, mask
        # Each forward also feeds a tree of up to ``draft`` tokens: every open choice's rest, as it is likely
        # tokenised (``ChoiceMask.draft``). A decode forward of a few dozen more tokens costs little more than one
        # (it is bound by reading the weights), and a draw that follows the tree needs no forward of its own. The
        # draw and its log-probabilities are the same either way.
        self.draft = draft
        self.forwards = 0
        self._logprobs: dict[Prefix, Any] = {(): root.next_logprobs}  # the model's log-probs after each prefix
        # Where the last few forwards ended, to continue from (each holds the whole prompt's KV: a draw of many
        # samples keeps ``kept_caches`` of them and goes back to the prompt's cache for the rest).
        self._caches: collections.OrderedDict[Prefix, Prefilled] = collections.OrderedDict()
        self.kept_caches = kept_caches
        if root.ahead is not None:  # the prompt's prefill fed a draft: its places are known already
            self._logprobs.update(zip(*root.ahead))

    def logprobs(self, prefix: Prefix) -> Any:
        """The model's log-probabilities for the token after ``prefix`` (one forward from the nearest cache)."""
        if prefix not in self._logprobs:
            advance_walks(self.model, [(self, prefix)], self.root.next_logprobs.device)
        return self._logprobs[prefix]

    def plan(self, prefix: Prefix) -> Plan:
        """What a forward for ``prefix`` feeds: from the nearest kept cache, ``prefix``'s ids, then its draft."""
        start, shared = self._nearest(prefix)
        tree = tuple(tuple(path) for path in self.mask.draft(prefix, self.draft)) if self.draft else ()
        return self.root.ids + prefix, start, len(self.root.ids) + shared, tree

    def record(self, prefix: Prefix, plan: Plan, layers: list[tuple[Any, Any]], rows: Any, tree_rows: Any) -> None:
        """Keep what a forward for ``prefix`` gave: its cache, the log-probabilities after each id it fed (from the
        cache it continued on) and after each draft node."""
        ids, _, shared, tree = plan
        self.forwards += 1
        self._caches[prefix] = Prefilled(ids, layers, rows[-1])
        while len(self._caches) > self.kept_caches:
            self._caches.popitem(last=False)
        fed = shared - len(self.root.ids)
        for k in range(len(rows)):
            self._logprobs[prefix[:fed + k + 1]] = rows[k]
        for path, row in zip(tree, tree_rows):
            self._logprobs[prefix + path] = row

    def _nearest(self, prefix: Prefix) -> tuple[Prefilled, int]:
        """The kept cache sharing the longest part of ``prefix`` (the prompt's where none does), and that length."""
        return max(((cached, _common_length(p, prefix)) for p, cached in self._caches.items()),
                   key=lambda item: item[1], default=(self.root, 0))

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


def advance_walks(model: Any, needs: Sequence[tuple[ChoiceWalk, Prefix]], device: str, together_from: int = 2) -> list[int]:
    """The log-probabilities each walk needs after its prefix, every walk's from its nearest cache with its draft,
    as one forward (:func:`forward_padded`): continuous batching's decode step. Fewer than ``together_from`` needs
    run one forward each. Returns the walks each forward advanced."""
    groups = [needs] if len(needs) >= max(together_from, 2) else [[need] for need in needs]
    for group in groups:
        plans = [walk.plan(prefix) for walk, prefix in group]
        for (walk, prefix), plan, answer in zip(group, plans, forward_padded(model, plans, device)):
            walk.record(prefix, plan, *answer)
    return [len(group) for group in groups]


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
