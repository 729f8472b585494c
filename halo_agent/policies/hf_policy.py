"""A local transformers chat model (optionally with LoRA adapters) as a policy, and the generator behind it.

``LocalChatModel`` loads a causal LM and its tokenizer from a folder (plus peft
adapter folders), applies the tokenizer's chat template and samples ``n``
completions, with the log-probability of every sampled token. ``HFPolicy`` wraps
it as a HALO policy; ``halo_agent.chat_server`` serves it over the OpenAI
protocol.

Log-probabilities are, by default, those of the distribution each token was drawn
from (``logprobs_mode="processed_logprobs"``, vLLM's ``--logprobs-mode
processed_logprobs``): the softmax at the temperature, top-p applied, for plain
sampling; the masked, renormalised distribution for a guided choice under vLLM's
string-prefix mask (a forced token 0.0); at temperature 0 (greedy) the same distributions
at temperature 1. ``logprobs_mode="raw_logprobs"`` gives the model's own log-softmax of the
raw logits instead, before temperature and top-p; under a guided choice's mask, which vLLM
applies to the logits before its sampler, the masked distribution at temperature 1. Each
``Generation`` names its mode and its draw (``masked_choice``, ``sequence_choice``,
``sample``, ``greedy``), and its ``token_ids`` are the tokens generated, EOS included where
generation stopped on it, one logprob each.

No sampling default of the model folder's generation_config.json reaches a draw: the model
generates from a blank generation config with every distribution-shaping parameter neutral
(``NEUTRAL_SAMPLING``), the temperature and a request's top_p aside. A text model's prompt is
``halo_data.prompts.text_messages``, the rendering the trainers score.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Generator, Mapping, Sequence

from halo_agent.actions import parse_for_observation
from halo_agent.models import ModelResolveError, resolve_model
from halo_agent.policies.guided_choice import (ChoiceMask, greedy_masked_choice, masked_choice_logprobs,  # noqa: F401
                                               masked_token_logprobs, sequence_token_logprobs)
from halo_agent.policies.linear_kernels import LINEAR_KERNELS, onednn_available, use_onednn_linear
from halo_agent.policies.prefix_cache import ChoiceWalk, Prefilled, PromptCache, advance_walks, score_choices
from halo_agent.types import Observation, PolicyOutput

log = logging.getLogger(__name__)

# Every parameter of transformers' sampler that shapes the distribution a token is drawn from, at its neutral
# value: passed to every ``generate``, so a model folder's generation_config.json (Qwen2.5-Instruct's
# repetition_penalty 1.05, top_k 20, top_p 0.8) never reaches the draw nor the logprobs stored with it. Only the
# temperature (and the top_p a request sends) shape it, as the step stores them and the trainer rebuilds them.
NEUTRAL_SAMPLING = dict(top_k=0, top_p=1.0, min_p=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0,
                        repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
                        min_length=0, min_new_tokens=None, bad_words_ids=None, suppress_tokens=None,
                        begin_suppress_tokens=None, forced_bos_token_id=None, forced_eos_token_id=None,
                        sequence_bias=None, exponential_decay_length_penalty=None, renormalize_logits=False,
                        guidance_scale=None, watermarking_config=None, num_beams=1, length_penalty=1.0,
                        top_h=None, penalty_alpha=None, dola_layers=None, force_words_ids=None, low_memory=None)

class ModelLoadError(RuntimeError):
    """The model or adapter folder cannot be loaded; the message says what to do."""


class AdapterNotFoundError(ModelLoadError):
    """No adapter folder (``adapter_config.json``) at the path given."""


LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
DRAWS = ("masked_choice", "sequence_choice", "sample", "greedy")


@dataclasses.dataclass
class Generation:
    text: str
    token_ids: list[int]  # the tokens generated, EOS included where generation stopped on it
    tokens: list[str]  # each token decoded alone
    logprobs: list[float]  # one per token, under the distribution ``logprobs_mode`` names
    finish_reason: str  # "stop" (end of sequence, stop string, a whole choice) | "length" (hit max_new_tokens)
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token: (token id, logprob), most likely first
    draw: str = "sample"  # one of DRAWS: how the tokens were drawn
    logprobs_mode: str = "processed_logprobs"  # one of LOGPROBS_MODES


@dataclasses.dataclass
class ChoiceRequest:
    """A guided-choice request as :meth:`LocalChatModel.choose` takes it (:meth:`LocalChatModel.choose_many` several)."""

    messages: Sequence[Mapping[str, Any]]
    choices: Sequence[str]
    n: int = 1
    temperature: float = 0.0
    seed: int | None = None
    adapter: str | None = None
    top_logprobs: int = 0


@dataclasses.dataclass
class GenerationBatch:
    generations: list[Generation]
    prompt_tokens: int
    prompt_token_ids: list[int] | None = None


class ChoiceJob:
    """A guided choice in progress (:meth:`LocalChatModel.start_choices`): ``need``, the (walk, prefix) whose
    log-probabilities its draw waits for; once ``done``, ``answer``, its ``GenerationBatch`` or the exception it
    raised. ``batched``: it shared a forward with another request."""

    def __init__(self, request: ChoiceRequest) -> None:
        self.request, self.adapter = request, request.adapter
        self.steps: Generator[tuple[ChoiceWalk, tuple[int, ...]], None, GenerationBatch] | None = None
        self.need: tuple[ChoiceWalk, tuple[int, ...]] | None = None
        self.answer: GenerationBatch | Exception | None = None
        self.done = self.batched = False

    def advance(self) -> None:
        """Run the draw on to its next forward, or to its answer."""
        try:
            self.need = next(self.steps)
        except StopIteration as finished:
            self.need, self.answer, self.done = None, finished.value, True
        except Exception as e:  # noqa: BLE001 (the request's own failure is its answer)
            self.fail(e)

    def fail(self, error: Exception) -> None:
        """Answer the request with ``error``."""
        self.need, self.answer, self.done = None, error, True


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> tuple[list[int], int]:
    """Token ids of ``messages`` under the tokenizer's chat template, assistant turn opened; and the image count.
    A text-only model's prompt is ``prompts.text_messages`` (image parts dropped), the trainers' rendering."""
    from halo_data.prompts import text_messages

    n_images = sum(1 for m in messages if isinstance(m.get("content"), list)
                   for part in m["content"] if isinstance(part, Mapping) and part.get("type") != "text")
    ids = tokenizer.apply_chat_template(text_messages(list(messages)), add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding regardless
        ids = ids["input_ids"]
    return list(ids), n_images


def resolve_device(device: str | None) -> str:
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} asked for, but torch sees no CUDA GPU: use --device cpu")
    return device


CHOICE_DRAWS = ("token", "sequence")
# How a guided choice is scored: cached (the prompt prefilled once, with a prefix cache across requests, and the
# masked draw walking the choices token by token from it) | full (every choice scored after the whole prompt).
SCORE_MODES = ("cached", "full")


class LocalChatModel:
    """A causal LM from a local folder, sampling chat completions; thread-safe (one generation at a time).

    ``adapters``: ``{name: adapter folder}`` loaded with peft. ``generate(..., adapter=name)``
    uses one; ``adapter=None`` uses the base model.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        adapters: Mapping[str, str | os.PathLike[str]] | None = None,
        device: str | None = "auto",
        dtype: str | None = None,
        choice_draw: str = "token",
        logprobs_mode: str = "processed_logprobs",
        score_mode: str = "cached",
        prompt_cache_size: int = 8,
        linear_kernel: str = "auto",
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from halo_agent.vlm import is_vlm, load_processor, load_vlm

        if choice_draw not in CHOICE_DRAWS:
            raise ValueError(f"choice_draw must be one of {', '.join(CHOICE_DRAWS)}, got {choice_draw!r}")
        self.choice_draw = choice_draw
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        if linear_kernel not in LINEAR_KERNELS:
            raise ValueError(f"linear_kernel must be one of {', '.join(LINEAR_KERNELS)}, got {linear_kernel!r}")
        if score_mode not in SCORE_MODES:
            raise ValueError(f"score_mode must be one of {', '.join(SCORE_MODES)}, got {score_mode!r}")
        self.score_mode = score_mode
        self.prompt_cache = PromptCache(prompt_cache_size)
        try:
            self.model_path = resolve_model(model_path)  # a known model's name → its converted folder
        except ModelResolveError as e:
            raise ModelLoadError(str(e)) from None
        self.device = resolve_device(device)
        if dtype in (None, "", "auto"):
            torch_dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        if self.model_path.startswith((os.sep, ".", "~")) and not os.path.isdir(os.path.expanduser(self.model_path)):
            raise ModelLoadError(f"no model folder at {self.model_path}: pass a folder with config.json and tokenizer files")
        # A vision-language model sees the images; a text model sees "<image>" where they stood.
        self.processor = None
        try:
            if is_vlm(self.model_path):
                self.processor = load_processor(self.model_path)
                self.tokenizer = self.processor.tokenizer
                model = load_vlm(self.model_path, dtype=torch_dtype)
            else:
                self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
                model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"cannot load a model from {self.model_path}: {_first_line(e)}") from e
        if self.tokenizer.chat_template is None:
            raise ModelLoadError(f"the tokenizer in {self.model_path} has no chat template: add one to tokenizer_config.json")
        self.adapter_names: list[str] = []
        self.adapter_paths: dict[str, str] = {}
        self.model = model.to(self.device).eval()
        self.linear_kernel = "torch"
        if self.device == "cpu" and linear_kernel != "torch" and (linear_kernel == "onednn" or onednn_available()):
            try:
                use_onednn_linear(self.model)
                self.linear_kernel = "onednn"
            except RuntimeError as e:
                if linear_kernel == "onednn":
                    raise ModelLoadError(f"--linear-kernel onednn: {e}") from None
                log.warning("linear layers stay on torch's kernel: %s", e)
        # The fewest choice walks advanced in one padded forward (fewer run one forward each). MKL's sgemm (torch's
        # CPU linear) of 2 or 3 rows costs about as many single-row products: a forward of 2 walks took 1.08x two
        # alone, of 4 0.55x (SmolLM2-135M, 2 threads, bench engine-batch). oneDNN's and a GPU's pay from 2.
        self.walk_batch_from = 3 if self.device == "cpu" and self.linear_kernel == "torch" else 2
        # The most draft tokens a choice walk's forward (and a prompt's prefill) feeds (ChoiceWalk; 0: none).
        self.choice_draft = 48
        self._lock = threading.RLock()  # choose_many holds it across start_choices and step_choices
        self.eos_token_ids = self._eos_ids()
        # The folder's generation config is kept for the record and never applied: generate() starts from a blank
        # one (its stop tokens only) and passes NEUTRAL_SAMPLING, so no default of the model shapes a draw.
        self.model_generation_config = model.generation_config
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig(eos_token_id=self.eos_token_ids or None, pad_token_id=self._pad_id(),
                                                   bos_token_id=self.model_generation_config.bos_token_id)
        for name, path in (adapters or {}).items():
            self.load_adapter(name, path)

    def load_adapter(self, name: str, path: str | os.PathLike[str]) -> None:
        """Add a LoRA adapter under ``name`` while serving (between generations).

        Raises ``AdapterNotFoundError`` when ``path`` holds no adapter and ``ModelLoadError`` when it cannot be
        loaded onto this model (another base model, another rank layout); the adapters already loaded stay as they were.
        """
        from peft import PeftModel

        path = str(path)
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise AdapterNotFoundError(f"Loading lora {name} failed: No adapter found for {path}")
        with self._lock:
            if name in self.adapter_names:
                raise ValueError(f"The lora adapter '{name}' has already been loaded.")
            try:
                if isinstance(self.model, PeftModel):
                    self.model.load_adapter(path, adapter_name=name)
                else:
                    self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name).to(self.device).eval()
            except (OSError, ValueError, KeyError, RuntimeError) as e:
                if isinstance(self.model, PeftModel) and name in self.model.peft_config:
                    self.model.delete_adapter(name)
                raise ModelLoadError(f"cannot load adapter {name!r} from {path}: {_first_line(e)}") from e
            self.model.eval()
            self.adapter_names.append(name)
            self.prompt_cache.clear()  # its caches were computed by other weights under some name
            self.adapter_paths[name] = path

    def unload_adapter(self, name: str) -> None:
        """Remove the adapter ``name``; requests for it fail from now on. ``KeyError`` if it is not loaded."""
        with self._lock:
            if name not in self.adapter_names:
                raise KeyError(name)
            self.adapter_names.remove(name)
            self.prompt_cache.clear()
            del self.adapter_paths[name]
            if self.adapter_names:
                # peft cannot delete the active adapter's weights while it is active: activate another first.
                self.model.set_adapter(self.adapter_names[0])
                self.model.delete_adapter(name)
            else:
                # The last adapter gone: serve the plain base model again, its weights untouched by LoRA.
                self.model = self.model.unload()

    def _eos_ids(self) -> list[int]:
        ids = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(i) for i in source)
        return sorted(ids)

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]]) -> tuple[list[int], int]:
        """Prompt token ids (image pads included for a VLM) and the number of images."""
        inputs = self.prompt_inputs(messages)
        return inputs["input_ids"][0].tolist(), int(inputs.get("n_images", 0))

    def prompt_inputs(self, messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """What ``generate`` feeds the model: token ids, and for a VLM the processor's vision inputs."""
        import torch

        if self.processor is None:
            ids, n_images = chat_prompt_ids(self.tokenizer, messages)
            return {"input_ids": torch.tensor([ids]), "n_images": n_images}
        from halo_agent.vlm import encode_request

        inputs = dict(encode_request(self.processor, messages))
        inputs["n_images"] = int(inputs["image_grid_thw"].shape[0]) if "image_grid_thw" in inputs else 0
        return inputs

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        n: int = 1,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        seed: int | None = None,
        adapter: str | None = None,
        top_logprobs: int = 0,
        stop: Sequence[str] | None = None,
    ) -> GenerationBatch:
        """Sample ``n`` completions (``temperature`` 0: greedy), each token's logprob under ``self.logprobs_mode``."""
        import torch

        inputs = self.prompt_inputs(messages)
        inputs.pop("n_images")
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        inputs.setdefault("attention_mask", torch.ones_like(inputs["input_ids"]))
        n_prompt = int(inputs["input_ids"].shape[1])
        do_sample = temperature > 0
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max(1, int(max_new_tokens)),
            num_return_sequences=max(1, int(n)),
            do_sample=do_sample,
            output_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=self._pad_id(),
            eos_token_id=self.eos_token_ids or None,
        )
        kwargs.update(NEUTRAL_SAMPLING)
        if do_sample:
            kwargs.update(temperature=float(temperature), top_p=float(top_p))
        else:  # greedy: the sampler's warpers do not run (and transformers warns where they are set)
            for key in ("top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h"):
                kwargs.pop(key)
            kwargs.update(temperature=None)
        with self._lock:
            self._check_adapter(adapter)
            if seed is not None:
                torch.manual_seed(int(seed))
            with torch.inference_mode(), self._adapter_context(adapter):
                out = self.model.generate(**inputs, **kwargs)
        sequences = out.sequences[:, n_prompt:]
        # One (n, vocab) tensor per generated position: ``logits`` as the model gave them, ``scores`` after the
        # temperature and top-p the sampler drew from (top-p's cut tokens at -inf).
        steps = out.logits if self.logprobs_mode == "raw_logprobs" else out.scores
        logprobs = torch.stack(steps, dim=1).float().log_softmax(dim=-1)
        generations = []
        for i in range(sequences.shape[0]):
            ids = sequences[i].tolist()
            length, finish = len(ids), "length"
            for j, t in enumerate(ids):
                if t in self.eos_token_ids:
                    length, finish = j + 1, "stop"  # the EOS was generated: it is one of the completion's tokens
                    break
            kept = ids[:length]
            text = self.tokenizer.decode(kept, skip_special_tokens=True)
            if stop and any(s and s in text for s in stop):
                kept, text = self._cut_at_stop(kept, stop)
                finish = "stop"
            generations.append(self._generation(
                text, kept, [float(logprobs[i, j, t]) for j, t in enumerate(kept)], finish,
                _top_logprobs(logprobs[i, :len(kept)], top_logprobs), "sample" if do_sample else "greedy",
            ))
        return GenerationBatch(generations=generations, prompt_tokens=n_prompt,
                               prompt_token_ids=inputs["input_ids"][0].tolist())

    def _cut_at_stop(self, ids: list[int], stop: Sequence[str]) -> tuple[list[int], str]:
        """As vLLM stops on a stop string: the tokens up to the one that completes it, the text before it."""
        for k in range(1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:k], skip_special_tokens=True)
            cut = min((text.find(s) for s in stop if s and s in text), default=-1)
            if cut >= 0:
                return ids[:k], text[:cut]
        return ids, self.tokenizer.decode(ids, skip_special_tokens=True)

    def _generation(self, text: str, token_ids: list[int], logprobs: list[float], finish_reason: str,
                    top_logprobs: list[list[tuple[int, float]]] | None, draw: str) -> Generation:
        return Generation(text=text, token_ids=token_ids, tokens=[self.tokenizer.decode([t]) for t in token_ids],
                          logprobs=logprobs, finish_reason=finish_reason, top_logprobs=top_logprobs, draw=draw,
                          logprobs_mode=self.logprobs_mode)

    def prompt_logprobs(self, prompt_ids: Sequence[int], top: int = 0, adapter: str | None = None) -> list[dict[int, tuple[float, int]] | None]:
        """vLLM's ``prompt_logprobs``: for each prompt token after the first, ``{token id: (logprob, rank)}`` for the
        prompt's own token and the ``top`` most likely ones, under the model's raw distribution (rank 1 = most
        likely); ``None`` for the first token, which nothing predicts."""
        import torch

        with self._lock:
            self._check_adapter(adapter)
            with torch.inference_mode(), self._adapter_context(adapter):
                logits = self.model(input_ids=torch.tensor([list(prompt_ids)], device=self.device)).logits[0, :-1]
        logprobs = logits.float().log_softmax(dim=-1)
        out: list[dict[int, tuple[float, int]] | None] = [None]
        for j, token in enumerate(list(prompt_ids)[1:]):
            row = logprobs[j]
            entry = {int(token): (float(row[token]), int((row > row[token]).sum()) + 1)}
            if top > 0:
                values, indices = row.topk(top)
                for rank, (value, index) in enumerate(zip(values.tolist(), indices.tolist()), start=1):
                    entry.setdefault(int(index), (float(value), rank))
            out.append(entry)
        return out

    def _check_adapter(self, adapter: str | None) -> None:
        """Checked under the lock: an adapter may be unloaded between a request's arrival and its turn."""
        if adapter is not None and adapter not in self.adapter_names:
            raise ValueError(f"unknown adapter {adapter!r}: loaded adapters are {self.adapter_names or 'none'}")

    def choose(
        self,
        messages: Sequence[Mapping[str, Any]],
        choices: Sequence[str],
        n: int = 1,
        temperature: float = 0.0,
        seed: int | None = None,
        adapter: str | None = None,
        top_logprobs: int = 0,
    ) -> GenerationBatch:
        """Sample ``n`` of ``choices`` as vLLM's guided choice does (``choice_draw="token"``, the default).

        vLLM's grammar backends (xgrammar, guidance, outlines) mask each decoding step to every token whose bytes
        keep the text generated so far a prefix of some choice, whichever way that splits the text into tokens,
        and EOS once the text is a whole choice (:class:`ChoiceMask`); the sampler draws from the renormalised
        distribution at the temperature (temperature 0: the most likely allowed token). A token that is the only
        one allowed is forced and weighs nothing. ``choice_draw="sequence"`` draws a choice in proportion to
        exp(log p / temperature) of its own tokenisation's whole sequence instead (temperature 0: the most likely).

        The generation's tokens are those drawn, EOS last; its text is the choice they spell. Each token carries
        the logprob vLLM reports for it: the mask is applied to the logits before the sampler, so under
        ``processed_logprobs`` the token's share of the allowed tokens at the temperature (at temperature 0, at
        temperature 1), under ``raw_logprobs`` its share at temperature 1; a forced token 0.0 in both.
        ``top_logprobs`` lists the tokens allowed at each position, most likely first. (The whole-sequence draw
        reports :func:`sequence_token_logprobs`, or the model's raw log-softmax under ``raw_logprobs``.)

        ``score_mode="cached"`` (the default) prefills the prompt once, reusing the longest prefix it shares with
        a recent prompt (:class:`PromptCache`), and the masked draw walks from that cache, running the model only
        where more than one token is allowed (:class:`ChoiceWalk`). ``score_mode="full"`` prefills the whole prompt
        afresh for each request (same draw).
        """
        answer = self.choose_many([ChoiceRequest(messages, choices, n, temperature, seed, adapter, top_logprobs)])[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def choose_many(self, requests: Sequence[ChoiceRequest]) -> list[GenerationBatch | Exception]:
        """Several guided choices, each answered as ``choose`` answers it alone (the same draw for the same seed,
        logprobs within float rounding), or the exception it raised: :meth:`start_choices`, then
        :meth:`step_choices` until every one is answered, the engine held throughout."""
        with self._lock:
            jobs = self.start_choices(requests)
            while active := [job for job in jobs if not job.done]:
                self.step_choices(active)
        return [job.answer for job in jobs]  # type: ignore[misc]

    def start_choices(self, requests: Sequence[ChoiceRequest]) -> list[ChoiceJob]:
        """A :class:`ChoiceJob` for each request, advanced to its first forward of a choice walk (or answered).
        Under ``score_mode="cached"`` the prompts not cached yet are prefilled as one batch per adapter
        (:meth:`PromptCache.prefill_many`)."""
        import torch

        jobs = [ChoiceJob(request) for request in requests]
        prompts: list[list[int]] = []
        for job in jobs:
            try:
                if not job.request.choices:
                    raise ValueError("choices must not be empty")
                prompts.append(self.chat_prompt(job.request.messages)[0])
            except Exception as e:  # noqa: BLE001 (a request's own failure is its answer)
                job.fail(e)
                prompts.append([])
        cached = self.score_mode == "cached" and self.processor is None
        with self._lock:
            roots: dict[int, Prefilled] = {}
            groups: dict[str | None, list[int]] = {}
            for i, job in enumerate(jobs):
                if cached and not job.done and (job.adapter is None or job.adapter in self.adapter_names):
                    groups.setdefault(job.adapter, []).append(i)
            for adapter, members in groups.items():
                if len(members) < 2:
                    continue
                before = self.prompt_cache.batched_prefills
                try:
                    drafts = [self._opening_draft(jobs[i].request) for i in members]
                    with torch.inference_mode(), self._adapter_context(adapter):
                        filled = self.prompt_cache.prefill_many(self.model, [prompts[i] for i in members], adapter, self.device,
                                                                drafts)
                except Exception:  # noqa: BLE001 (each request is then prefilled alone, and fails alone)
                    log.exception("a batched prefill failed; prefilling its prompts one by one")
                    continue
                roots.update(zip(members, filled))
                for i in members:  # in a forward with others, unless all but one prompt were cached
                    jobs[i].batched = self.prompt_cache.batched_prefills > before
            for i, job in enumerate(jobs):
                if not job.done:
                    job.steps = self._choice_steps(job.request, prompts[i], roots.get(i))
                    with torch.inference_mode(), self._adapter_context(job.adapter):
                        job.advance()
        return jobs

    def step_choices(self, jobs: Sequence[ChoiceJob]) -> list[int]:
        """Advance every unanswered job one forward: the walks of one adapter together (:func:`advance_walks`; alone
        where fewer than ``walk_batch_from``), each job then drawn on to its next forward or its answer. Returns how
        many jobs each forward advanced."""
        import torch

        groups: dict[str | None, list[ChoiceJob]] = {}
        for job in jobs:
            if not job.done:
                groups.setdefault(job.adapter, []).append(job)
        sizes = []
        with self._lock:
            for adapter, members in groups.items():
                with torch.inference_mode(), self._adapter_context(adapter):
                    try:
                        forwards = advance_walks(self.model, [job.need for job in members], self.device, self.walk_batch_from)
                    except Exception as e:  # noqa: BLE001 (every job of the forward fails with it)
                        for job in members:
                            job.fail(e)
                        continue
                    sizes += forwards
                    for job in members:
                        job.batched = job.batched or max(forwards) > 1
                        job.advance()
        return sizes

    def _opening_draft(self, request: ChoiceRequest, mask: ChoiceMask | None = None) -> list[tuple[int, ...]]:
        """``request``'s choices as a token tree (``ChoiceMask.draft``; its ``mask`` where it has one already), fed
        with its prompt's prefill."""
        if self.choice_draw != "token" or not self.choice_draft:
            return []
        return (mask or ChoiceMask(self.tokenizer, request.choices, self._choice_eos())).draft((), self.choice_draft)

    def _choice_eos(self) -> int:
        return self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.eos_token_ids[0]

    def _choice_steps(self, request: ChoiceRequest, prompt_ids: list[int], root: Prefilled | None) -> Generator[tuple[ChoiceWalk, tuple[int, ...]], None, GenerationBatch]:
        """One guided choice as a generator, continuing from ``root``, its prompt's cache, where given: it yields
        each (walk, prefix) whose log-probabilities the masked draw needs next, and returns the answer. Each resume
        runs with the engine's lock held, under inference mode and the request's adapter (no context spans a yield:
        other requests' forwards run between them)."""
        import torch

        choices, n, temperature, seed, adapter, top_logprobs = (request.choices, request.n, request.temperature, request.seed,
                                                                request.adapter, request.top_logprobs)
        eos = self._choice_eos()
        generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
        draw = "greedy" if temperature <= 0 else ("masked_choice" if self.choice_draw == "token" else "sequence_choice")
        reported_temperature = float(temperature) if temperature > 0 else 1.0
        cached = self.score_mode == "cached" and self.processor is None
        self._check_adapter(adapter)
        if self.choice_draw == "token":
            mask = ChoiceMask(self.tokenizer, choices, eos)
            if root is None:  # full: the whole prompt afresh, nothing kept; the mask's draft fed with it
                root = (self.prompt_cache if cached else PromptCache(1)).prefill(self.model, prompt_ids, adapter, self.device,
                                                                                 draft=self._opening_draft(request, mask))
            walk = ChoiceWalk(self.model, root, mask, draft=self.choice_draft)
            picks = []
            for _ in range(int(n) if temperature > 0 else 1):
                steps = walk.steps(float(temperature), generator)
                try:
                    while True:
                        yield walk, next(steps)
                except StopIteration as done:
                    picks.append(done.value)
            picks = picks * int(n) if temperature <= 0 else picks
            # vLLM applies the grammar's mask to the logits before its sampler: processed logprobs are the masked
            # distribution at the temperature, raw ones the masked distribution at temperature 1.
            scale = 1.0 if self.logprobs_mode == "raw_logprobs" else reported_temperature
            along = {path: walk.token_logprobs(path, scale) for path in set(picks)}
            generations = [self._generation(choices[mask.choice_index(path)], list(path), along[path][0], "stop",
                                            _top_of(along[path][1], top_logprobs), draw) for path in picks]
            return GenerationBatch(generations=generations, prompt_tokens=len(prompt_ids), prompt_token_ids=prompt_ids)
        # The whole-sequence draw: each choice's own tokenisation, then EOS, scored after the prompt.
        completions = [list(self.tokenizer(c, add_special_tokens=False)["input_ids"]) + [eos] for c in choices]
        if cached:
            if root is None:
                root = self.prompt_cache.prefill(self.model, prompt_ids, adapter, self.device)
            token_logprobs = score_choices(self.model, root, completions, self._pad_id())
        else:
            token_logprobs = self._score(prompt_ids, completions)
        if temperature > 0:
            scores = [sum(lps) / float(temperature) for lps in token_logprobs]
            probs = torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0)
            picks = torch.multinomial(probs, int(n), replacement=True, generator=generator).tolist()
        else:
            picks = [max(range(len(choices)), key=lambda i: sum(token_logprobs[i]))] * int(n)
        reported = self._choice_logprobs(completions, token_logprobs, reported_temperature)
        generations = [
            self._generation(choices[i], completions[i], reported[i], "stop",
                             _allowed_top_logprobs(completions, reported, i, top_logprobs), draw)
            for i in picks
        ]
        return GenerationBatch(generations=generations, prompt_tokens=len(prompt_ids), prompt_token_ids=prompt_ids)

    def _choice_logprobs(self, completions: list[list[int]], raw: list[list[float]], temperature: float) -> list[list[float]]:
        """Per choice token, the logprob reported under ``self.logprobs_mode`` for the whole-sequence draw."""
        if self.logprobs_mode == "raw_logprobs":
            return [list(map(float, row)) for row in raw]
        return sequence_token_logprobs(completions, raw, temperature)

    def _score(self, prompt_ids: list[int], completions: list[list[int]], batch: int = 16) -> list[list[float]]:
        """Log-probability of each completion token after ``prompt_ids``, a batch of right-padded sequences at a time."""
        import torch

        out: list[list[float]] = []
        pad = self._pad_id()
        for start in range(0, len(completions), batch):
            chunk = completions[start:start + batch]
            width = len(prompt_ids) + max(len(c) for c in chunk)
            rows = [prompt_ids + c + [pad] * (width - len(prompt_ids) - len(c)) for c in chunk]
            mask = [[1] * (len(prompt_ids) + len(c)) + [0] * (width - len(prompt_ids) - len(c)) for c in chunk]
            ids = torch.tensor(rows, device=self.device)
            logits = self.model(input_ids=ids, attention_mask=torch.tensor(mask, device=self.device)).logits.float()
            logps = logits[:, len(prompt_ids) - 1:-1].log_softmax(dim=-1)
            for i, c in enumerate(chunk):
                out.append([float(logps[i, j, t]) for j, t in enumerate(c)])
        return out

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_ids[0]

    def _adapter_context(self, adapter: str | None):
        import contextlib

        if not self.adapter_names:
            return contextlib.nullcontext()
        if adapter is None:
            return self.model.disable_adapter()
        self.model.set_adapter(adapter)
        return contextlib.nullcontext()


class HFPolicy:
    """A local transformers model as a text (AXTree) policy.

    ``model``: a model folder; ``adapter``: a LoRA adapter folder trained on it
    (``halo-train`` writes these). Sampling is reproducible: the generator is
    seeded from the episode seed and the step index.
    """

    name = "hf"
    uses_screenshot = False

    def __init__(
        self,
        model: str,
        adapter: str | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        n: int = 1,
        max_new_tokens: int = 128,
        device: str | None = "auto",
        policy_version: str | None = None,
        seed: int | None = None,
        **_ignored: Any,
    ) -> None:
        if not model:
            raise ModelLoadError("the hf policy needs --model: a local model folder or a known model name (halo-train models)")
        if n < 1:
            raise ValueError("n must be at least 1")
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_p < 1:  # the step stores its temperature, not a nucleus cut: no trainer could rebuild its logprobs
            raise ValueError(f"top_p {top_p} cuts the distribution the stored logprobs are of, and the step does not "
                             "store the cut, so no trainer could rebuild it: use top_p 1")
        self.model = str(model)
        self.adapter = str(adapter) if adapter else None
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.n = int(n)
        self.max_new_tokens = int(max_new_tokens)
        adapters = {"policy": self.adapter} if self.adapter else None
        self._engine = LocalChatModel(self.model, adapters=adapters, device=device)
        self.policy_version = policy_version or _version_of(self.model, self.adapter)
        self._seed = seed
        self.last_samples: list[PolicyOutput] = []

    def config(self) -> dict[str, Any]:
        """The policy's settings for the run record."""
        return {
            "policy": self.name,
            "model": self.model,
            "adapter": self.adapter,
            "policy_version": self.policy_version,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "n": self.n,
            "max_new_tokens": self.max_new_tokens,
            "device": self._engine.device,
        }

    def reset(self, seed: int) -> None:
        self._seed = int(seed)

    def act(self, obs: Observation) -> PolicyOutput:
        started = time.perf_counter()
        step_seed = None if self._seed is None else _step_seed(self._seed, obs.step_idx)
        batch = self._engine.generate(
            obs.messages,
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            seed=step_seed,
            adapter="policy" if self.adapter else None,
        )
        latency = (time.perf_counter() - started) * 1000.0
        samples = []
        for g in batch.generations:
            action, error = parse_for_observation(g.text, obs)
            samples.append(
                PolicyOutput(
                    model_output=g.text,
                    action=action,
                    action_source="model",
                    parse_error=error,
                    latency_ms=latency,
                    prompt_tokens=batch.prompt_tokens,
                    completion_tokens=len(g.token_ids),
                    logprobs=g.logprobs,
                    logprob_sum=float(sum(g.logprobs)),
                    completion_token_ids=list(g.token_ids),
                    logprobs_mode=g.logprobs_mode,
                    draw=g.draw,
                )
            )
        self.last_samples = samples
        return samples[0]

    def close(self) -> None:
        self._engine = None  # type: ignore[assignment]


def _top_logprobs(logprobs: Any, top: int) -> list[list[tuple[int, float]]] | None:
    """The ``top`` most likely tokens at each position of a (length, vocab) log-probability tensor."""
    if top <= 0 or logprobs.shape[0] == 0:
        return None
    values, indices = logprobs.topk(min(top, logprobs.shape[-1]), dim=-1)
    return [list(zip(map(int, ids), map(float, vals))) for vals, ids in zip(values.tolist(), indices.tolist())]


def _top_of(allowed: list[dict[int, float]], top: int) -> list[list[tuple[int, float]]] | None:
    """The ``top`` most likely of each position's allowed tokens."""
    if top <= 0:
        return None
    return [sorted(at.items(), key=lambda item: -item[1])[:top] for at in allowed]


def _allowed_top_logprobs(completions: list[list[int]], logprobs: list[list[float]], pick: int, top: int) -> list[list[tuple[int, float]]] | None:
    """For the choice ``pick``: at each of its positions, the ``top`` allowed tokens there with their logprobs."""
    if top <= 0:
        return None
    at: dict[tuple[int, ...], dict[int, float]] = {}
    for tokens, values in zip(completions, logprobs):
        for j, (token, value) in enumerate(zip(tokens, values)):
            at.setdefault(tuple(tokens[:j]), {})[token] = value
    chosen = completions[pick]
    return _top_of([at[tuple(chosen[:j])] for j in range(len(chosen))], top)


def _step_seed(seed: int, step_idx: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}\x1f{step_idx}".encode()).digest()[:4], "big") & 0x7FFFFFFF


def _version_of(model: str, adapter: str | None) -> str:
    label = f"hf:{Path(model).name}"
    if adapter:
        label += f"+{Path(adapter).name}"
    return label


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
