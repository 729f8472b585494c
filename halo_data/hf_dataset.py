"""A view as a Hugging Face dataset folder: Parquet shards and a README.md card, ready for ``datasets.load_dataset``.

    halo-data export bc_rows out/bc --format hf                       # out/bc/data/train-00000-of-00001.parquet
    halo-data export dpo_pairs out/dpo --format hf --split-by task_id
    halo-data export bc_rows out/bc --format hf --push-to-hub me/halo-bc   # then uploaded (needs a token)

    from datasets import load_dataset
    ds = load_dataset("out/bc")                                      # DatasetDict {"train": ...}

The training views (``bc_rows``, ``dpo_pairs``, ``grpo_groups``) are written in TRL's conversational columns, as
the JSONL export writes them: ``prompt`` a list of ``{role, content}`` messages (text; a screenshot a prompt refers
to goes to ``images``), ``completion`` / ``chosen`` / ``rejected`` one assistant message. Every other column keeps
its lake type: token ids become int sequences, logprobs float sequences. Screenshots become ``Image`` features:
the ``image`` bytes of the ``screenshots`` view, the screenshot a ``*screenshot*_hash`` column names (as
the column without ``_hash``), and the ``images`` of a prompt. The features are written both into each shard's Arrow metadata
and into the card's YAML, which also names the configs and splits. ``split_by`` makes one split per value of a
column (a value that is no split name is spelled as one: ``v2.gomail-1`` -> ``v2_gomail_1``; NULL -> ``none``).

The rows stream: they are read, converted and written to their split's shards a batch at a time, from one snapshot
of the lake, so memory holds a batch and its screenshots, not the view. A training view is written without an
``images`` column until a prompt shows a screenshot; then it is written again, from the same snapshot, with one.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from halo_data import prompts
from halo_data import schema as S
from halo_data.lake import Lake, LakeError

MAX_SHARD_ROWS = 20_000
CARD_MARK = "<!-- written by halo-data export --format hf -->"
_SPLIT_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")
_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


@dataclasses.dataclass
class HFExport:
    output: Path
    rows: dict[str, int]  # split -> rows
    features: dict[str, Any]
    shards: list[str]

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def split_name(value: Any) -> str:
    """A column value as a split name (``\\w+``): other characters become ``_``; NULL is ``none``."""
    if value is None:
        return "none"
    name = _SPLIT_UNSAFE.sub("_", str(value)).strip("_")
    return name or "empty"


def _screenshot_bytes(lake: Lake, hashes: set[str], as_of: Any) -> dict[str, bytes]:
    from halo_data.atif import _screenshots

    return {h: data for h, (data, _) in _screenshots(lake, hashes, as_of).items()}


def _images(hashes: list[str | None], shots: dict[str, bytes]) -> pa.Array:
    return pa.array([{"bytes": shots.get(h), "path": None} if h and h in shots else None for h in hashes], _IMAGE)


def _dataset_table(lake: Lake, view: str, table: pa.Table, as_of: Any, prompt_images: bool) -> tuple[pa.Table, set[str]]:
    """The view's rows as the dataset's Arrow table, and the columns that hold images (single or lists).
    ``prompt_images``: the dataset has an ``images`` column (some prompt of the view, not only of these rows, shows
    a screenshot)."""
    from halo_data.ops import TRL_COLUMNS

    image_columns: set[str] = set()
    columns: dict[str, pa.Array] = {}
    trl = TRL_COLUMNS.get(view, ())
    shown: list[list[str]] = []  # the screenshots each row's prompt shows
    for name in table.column_names:
        col = table.column(name)
        if name == "prompt" and trl:
            messages = [prompts.loads(p) if p else [] for p in col.to_pylist()]
            shown = [prompts.image_hashes(m) for m in messages]
            columns[name] = pa.array([prompts.text_only(m) for m in messages], pa.list_(_MESSAGE))
        elif name in trl:
            columns[name] = pa.array([[{"role": "assistant", "content": v}] if v is not None else None
                                      for v in col.to_pylist()], pa.list_(_MESSAGE))
        elif name == "image" and (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
            columns[name] = pa.array([{"bytes": v, "path": None} if v is not None else None for v in col.to_pylist()], _IMAGE)
            image_columns.add(name)
        else:
            columns[name] = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    hash_columns = [n for n in table.column_names if "screenshot" in n and n.endswith("_hash")]
    wanted = {h for n in hash_columns for h in table.column(n).to_pylist() if h}
    wanted |= {h for hs in shown for h in hs}
    shots = _screenshot_bytes(lake, wanted, as_of) if wanted else {}
    for n in hash_columns:
        image_name = n[: -len("_hash")]
        if image_name not in columns:
            columns[image_name] = _images(table.column(n).to_pylist(), shots)
            image_columns.add(image_name)
    if prompt_images and "images" not in columns:
        rows = shown or [[] for _ in range(table.num_rows)]
        columns["images"] = pa.array([[{"bytes": shots.get(h), "path": None} for h in hs if h in shots] for hs in rows],
                                     pa.list_(_IMAGE))
        image_columns.add("images")
    return pa.table(columns), image_columns


def _features(table: pa.Table, image_columns: set[str]) -> Any:
    from datasets import Features, Image, List

    features = Features.from_arrow_schema(table.schema)
    for name in image_columns:
        features[name] = List(Image()) if pa.types.is_list(table.schema.field(name).type) else Image()
    return features


def _runs(lake: Lake, run_ids: list[str], as_of: Any) -> list[dict[str, Any]]:
    if not run_ids:
        return []
    con = lake.connect(as_of=as_of, views=False, tables=("runs",))
    try:
        con.register("wanted", pa.table({"run_id": run_ids}))
        known = {r[0]: r for r in con.execute(
            "select run_id, kind, mode, policy, model, policy_version from runs where run_id in (select run_id from wanted)").fetchall()}
    finally:
        con.close()
    keys = ("run_id", "kind", "mode", "policy", "model", "policy_version")
    return [dict(zip(keys, known[r])) if r in known else {"run_id": r} for r in run_ids]


def _column_docs(view: str) -> dict[str, str]:
    docs: dict[str, str] = {}
    for spec in (S.STEPS, S.CANDIDATES, S.SCREENSHOTS, S.RUNS):
        for c in spec.columns:
            docs.setdefault(c.name, c.doc)
    docs.update({
        "images": "Screenshots the prompt refers to (its image parts, in order).",
        "screenshot": "The screenshot screenshot_hash names.",
        "screenshot_after": "The screenshot screenshot_after_hash names.",
    })
    from halo_data.ops import TRL_COLUMNS

    if view in TRL_COLUMNS:
        docs["prompt"] = "Chat messages the policy saw ({role, content}, text; images in `images`)."
        for c in TRL_COLUMNS[view][1:]:
            docs[c] = f"The {c} as one assistant message."
    return docs


def _card(view: str, description: str, features: Any, rows: dict[str, int], sizes: dict[str, int], data_files: list[dict[str, str]], context: dict[str, Any]) -> str:
    import yaml

    meta = {
        "pretty_name": f"HALO {view}",
        "tags": ["halo", "trajectories", "web-agents"],
        "configs": [{"config_name": "default", "data_files": data_files}],
        "dataset_info": {
            "features": features._to_yaml_list(),
            "splits": [{"name": s, "num_bytes": sizes[s], "num_examples": n} for s, n in rows.items()],
        },
    }
    lines = ["---", yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip(), "---", CARD_MARK, "",
             f"# {view} from a HALO lake", "", description[:1].upper() + description[1:], "",
             "| | |", "|---|---|",
             f"| lake | `{context['lake']}` |",
             f"| view | `{view}` |",
             f"| view parameters | {context['params'] or 'defaults'} |",
             f"| filter | {('`' + _cell(context['where']) + '`') if context['where'] else 'none'} |",
             f"| snapshot | {context['snapshot']} |",
             f"| split by | {('`' + context['split_by'] + '`') if context['split_by'] else 'one split, train'} |",
             f"| rows | {sum(rows.values())} ({', '.join(f'{s}: {n}' for s, n in rows.items())}) |",
             "", "## Runs", ""]
    runs = context["runs"]
    if runs:
        lines += ["| run | kind | mode | policy | model | policy version |", "|---|---|---|---|---|---|"]
        for r in runs:
            lines.append("| " + " | ".join(_cell(r.get(k)) for k in ("run_id", "kind", "mode", "policy", "model", "policy_version"))
                         + " |")
    else:
        lines.append("The view has no run_id column.")
    docs = _column_docs(view)
    lines += ["", "## Schema", "", "| column | feature | description |", "|---|---|---|"]
    for name, feature in features.items():
        lines.append(f"| `{name}` | `{_feature_text(feature)}` | {_cell(docs.get(name))} |")
    lines += ["", "## Load", "", "```python", "from datasets import load_dataset", "",
              f'ds = load_dataset("{context["load_path"]}")', "```", ""]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    """A value as a Markdown table cell: its pipes escaped, on one line."""
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def _feature_text(feature: Any) -> str:
    from datasets import Image, List, Value

    if isinstance(feature, Value):
        return feature.dtype
    if isinstance(feature, Image):
        return "Image"
    if isinstance(feature, List):
        return f"list<{_feature_text(feature.feature)}>"
    if isinstance(feature, dict):
        return "{" + ", ".join(f"{k}: {_feature_text(v)}" for k, v in feature.items()) + "}"
    return type(feature).__name__


def _prepare_output(output: Path) -> Path:
    """A fresh sibling folder to write into; ``output`` must be new, empty, or an earlier export of this kind."""
    if output.is_file():
        raise LakeError(f"{output} is a file: a Hugging Face dataset is a folder")
    if output.exists() and any(output.iterdir()):
        card = output / "README.md"
        if not (card.is_file() and CARD_MARK in card.read_text(errors="replace")):
            raise LakeError(f"{output} exists and is not a dataset folder halo-data wrote: choose a new OUTPUT")
    tmp = output.with_name(output.name + ".tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "data").mkdir(parents=True)
    return tmp


class _SplitShards:
    """One split's Parquet shards, written as its rows come: up to ``max_rows`` rows a shard, named with their count
    (``train-00000-of-00002.parquet``) once the last row is in."""

    def __init__(self, folder: Path, name: str, schema: pa.Schema, max_rows: int):
        self.folder, self.name, self.schema, self.max_rows = folder, name, schema, max_rows
        self.rows = self.nbytes = 0
        self._files: list[Path] = []
        self._writer: pq.ParquetWriter | None = None
        self._in_shard = 0

    def write(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        self.nbytes += table.nbytes
        while table.num_rows:
            if self._writer is None or self._in_shard == self.max_rows:
                self._next_shard()
            take = min(table.num_rows, self.max_rows - self._in_shard)
            self._writer.write_table(table.slice(0, take))
            self._in_shard += take
            table = table.slice(take)

    def _next_shard(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._files.append(self.folder / f".{self.name}-{len(self._files):05d}.parquet")
        self._writer = pq.ParquetWriter(self._files[-1], self.schema)
        self._in_shard = 0

    def abort(self, remove: bool = False) -> None:
        """Close the open shard without naming it; ``remove``: delete the shards written (else the caller removes the
        folder)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if remove:
            for path in self._files:
                path.unlink(missing_ok=True)
            self._files = []

    def close(self) -> list[str]:
        """The shards' paths relative to the dataset folder, under their final names."""
        if self._writer is not None:
            self._writer.close()
        names = []
        for i, path in enumerate(self._files):
            names.append(f"data/{self.name}-{i:05d}-of-{len(self._files):05d}.parquet")
            path.rename(self.folder.parent / names[-1])
        return names


class _ShowsScreenshots(Exception):
    """A batch's prompt shows a screenshot while the dataset is being written without an ``images`` column."""


def _shows_screenshot(prompt_column: pa.ChunkedArray | pa.Array) -> bool:
    """Whether any prompt of a batch shows a screenshot. Text that merely mentions the part's type passes the
    substring test and is then parsed out."""
    return any(p and '"image_ref"' in p and prompts.has_image(prompts.loads(p)) for p in prompt_column.to_pylist())


class _DatasetWriter:
    """One pass of a view's rows into split shards under ``folder``; the first batch fixes the schema and features.
    ``prompt_images``: the dataset has an ``images`` column. Without one, ``watch`` makes a batch whose prompt shows a
    screenshot raise ``_ShowsScreenshots``."""

    def __init__(self, lake: Lake, view: str, snapshot: Any, folder: Path, split_by: str | None, max_shard_rows: int,
                 prompt_images: bool, watch: bool):
        self.lake, self.view, self.snapshot, self.folder = lake, view, snapshot, folder
        self.split_by, self.max_shard_rows = split_by, max_shard_rows
        self.prompt_images, self.watch = prompt_images, watch
        self.splits: dict[str, _SplitShards] = {}
        self.run_ids: set[str] = set()
        self.schema: pa.Schema | None = None
        self.features: Any = None

    def write(self, table: pa.Table) -> None:
        if self.watch and not self.prompt_images and _shows_screenshot(table.column("prompt")):
            raise _ShowsScreenshots
        data, image_columns = _dataset_table(self.lake, self.view, table, self.snapshot, self.prompt_images)
        if self.schema is None:
            self.features = _features(data, image_columns)
            info = {"huggingface": json.dumps({"info": {"features": self.features.to_dict()}})}
            self.schema = data.schema.with_metadata(info)
        data = data.cast(self.schema)
        if "run_id" in table.column_names:
            self.run_ids.update(r for r in table.column("run_id").to_pylist() if r)
        for name, part in self._parts(table, data).items():
            if name not in self.splits:
                self.splits[name] = _SplitShards(self.folder, name, self.schema, self.max_shard_rows)
            self.splits[name].write(part)

    def _parts(self, table: pa.Table, data: pa.Table) -> dict[str, pa.Table]:
        """``data`` by split: one ``train`` split, or one per value of ``split_by`` in the source rows."""
        if self.split_by is None:
            return {"train": data}
        names = pa.array([split_name(v) for v in table.column(self.split_by).to_pylist()])
        return {n: data.filter(pc.equal(names, n)) for n in set(names.to_pylist())}

    def abort(self, remove: bool = False) -> None:
        for shards in self.splits.values():
            shards.abort(remove=remove)


def _write_pass(writer: _DatasetWriter, lake: Lake, sql: str, snapshot: Any, params: Any, batch_rows: int) -> bool:
    """Every row of ``sql`` through ``writer``, a batch at a time. False where a prompt showed a screenshot that the
    writer has no column for; its shards are removed then."""
    from halo_data.query import query_batches

    try:
        with query_batches(lake, sql, as_of=snapshot, params=params, batch_rows=batch_rows) as reader:
            for batch in reader:
                if batch.num_rows:
                    writer.write(pa.Table.from_batches([batch]))
    except _ShowsScreenshots:
        writer.abort(remove=True)
        return False
    return True


def export_hf(lake: Lake, view: str, output: str | Path, where: str | None = None, params: Any = None, as_of: Any = None,
              split_by: str | None = None, max_shard_rows: int = MAX_SHARD_ROWS, batch_rows: int = 8192) -> HFExport:
    """Write ``view`` (or a table: ``steps``) rows matching ``where`` as a dataset folder at ``output``, ``batch_rows``
    rows at a time; nothing is written for no rows, and a failure midway leaves ``output`` as it was."""
    try:
        import datasets  # noqa: F401  (its features describe the dataset)
    except ImportError:
        raise LakeError("--format hf needs the datasets package: pip install 'halo[train]'") from None
    from halo_data.ops import TRL_COLUMNS, view_sql
    from halo_data.query import query_columns
    from halo_data.views import get_view

    if view in S.TABLES:  # a table whole (steps: token ids, logprobs and screenshots of every step)
        description = S.TABLES[view].doc
        sql = f'select * from "{view}"' + (f" where {where}" if where else "")
    else:
        description = get_view(view).description
        sql = view_sql(view, where)
    snapshot = as_of if as_of is not None else lake.versions()  # every pass sees the same rows
    columns = query_columns(lake, sql, as_of=snapshot, params=params)
    if split_by is not None and split_by not in columns:
        raise LakeError(f"--split-by {split_by}: view {view} has no such column (columns: {', '.join(columns)})")
    # A dataset whose prompts show screenshots has an ``images`` column on every row. The rows are written without
    # the column until a prompt shows one, and then written again with it (a text-only view, the usual case, is read
    # once).
    watch = bool(TRL_COLUMNS.get(view)) and "prompt" in columns
    output = Path(output)
    tmp = _prepare_output(output)
    writer: _DatasetWriter | None = None
    try:
        for prompt_images in (False, True) if watch else (False,):
            writer = _DatasetWriter(lake, view, snapshot, tmp / "data", split_by, max_shard_rows, prompt_images, watch)
            if _write_pass(writer, lake, sql, snapshot, params, batch_rows):
                break
        splits = writer.splits
        if not splits:
            raise LakeError(f"view {view} has no rows" + (f" where {where}" if where else "") + ": nothing to export")
        order = sorted(splits)
        shards = [rel for name in order for rel in splits[name].close()]
        rows = {name: splits[name].rows for name in order}
        sizes = {name: splits[name].nbytes for name in order}
        data_files = [{"split": name, "path": f"data/{name}-*.parquet"} for name in order]
        context = {
            "lake": lake.root, "where": where, "split_by": split_by, "load_path": str(output),
            "params": ", ".join(f"{k}={v}" for k, v in sorted((params or {}).items())) if isinstance(params, dict) else params,
            "snapshot": (f"as of {as_of}" if as_of is not None else
                         "versions " + ", ".join(f"{t} {v}" for t, v in snapshot.items())),
            "runs": _runs(lake, sorted(writer.run_ids), snapshot),
        }
        card = _card(view, description, writer.features, rows, sizes, data_files, context)
        (tmp / "README.md").write_text(card, encoding="utf-8")
    except BaseException:
        if writer is not None:
            writer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if output.exists():
        shutil.rmtree(output)
    tmp.rename(output)
    return HFExport(output, rows, writer.features.to_dict(), shards)


def push_to_hub(output: str | Path, repo: str, private: bool = False) -> str:
    """Upload a dataset folder to the Hub as dataset ``repo`` (created if missing); returns its URL.

    Needs a token (``HF_TOKEN`` or ``hf auth login``) and network access; either missing is one LakeError."""
    from huggingface_hub import HfApi, get_token

    token = get_token()
    if not token:
        raise LakeError(f"--push-to-hub {repo} needs a Hugging Face token (set HF_TOKEN or run `hf auth login`); "
                        f"the dataset is written at {output}")
    api = HfApi(token=token)
    try:
        api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
        api.upload_folder(repo_id=repo, repo_type="dataset", folder_path=str(output),
                          commit_message="HALO dataset export (halo-data export --format hf)")
    except Exception as e:  # noqa: BLE001  (the network, the Hub's answer, the token: one line for the user)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise LakeError(f"pushing {output} to {repo} failed: {first}") from None
    return f"https://huggingface.co/datasets/{repo}"
