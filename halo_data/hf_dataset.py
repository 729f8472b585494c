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


def _dataset_table(lake: Lake, view: str, table: pa.Table, as_of: Any) -> tuple[pa.Table, set[str]]:
    """The view's rows as the dataset's Arrow table, and the columns that hold images (single or lists)."""
    from halo_data.ops import TRL_COLUMNS

    image_columns: set[str] = set()
    columns: dict[str, pa.Array] = {}
    trl = TRL_COLUMNS.get(view, ())
    prompt_images: list[list[str]] | None = None
    for name in table.column_names:
        col = table.column(name)
        if name == "prompt" and trl:
            messages = [prompts.loads(p) if p else [] for p in col.to_pylist()]
            prompt_images = [prompts.image_hashes(m) for m in messages]
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
    if prompt_images and any(prompt_images):
        wanted |= {h for hs in prompt_images for h in hs}
    shots = _screenshot_bytes(lake, wanted, as_of) if wanted else {}
    for n in hash_columns:
        image_name = n[: -len("_hash")]
        if image_name not in columns:
            columns[image_name] = _images(table.column(n).to_pylist(), shots)
            image_columns.add(image_name)
    if prompt_images and any(prompt_images) and "images" not in columns:
        columns["images"] = pa.array([[{"bytes": shots.get(h), "path": None} for h in hs if h in shots] for hs in prompt_images],
                                     pa.list_(_IMAGE))
        image_columns.add("images")
    return pa.table(columns), image_columns


def _features(table: pa.Table, image_columns: set[str]) -> Any:
    from datasets import Features, Image, List

    features = Features.from_arrow_schema(table.schema)
    for name in image_columns:
        features[name] = List(Image()) if pa.types.is_list(table.schema.field(name).type) else Image()
    return features


def _runs(lake: Lake, table: pa.Table, as_of: Any) -> list[dict[str, Any]]:
    if "run_id" not in table.column_names:
        return []
    run_ids = sorted({r for r in table.column("run_id").to_pylist() if r})
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


def export_hf(lake: Lake, view: str, output: str | Path, where: str | None = None, params: Any = None, as_of: Any = None,
              split_by: str | None = None, max_shard_rows: int = MAX_SHARD_ROWS) -> HFExport:
    """Write ``view`` (or a table: ``steps``) rows matching ``where`` as a dataset folder at ``output``; nothing is
    written for no rows."""
    try:
        import datasets  # noqa: F401  (its features describe the dataset)
    except ImportError:
        raise LakeError("--format hf needs the datasets package: pip install 'halo[train]'") from None
    from halo_data.ops import view_rows
    from halo_data.query import run_query
    from halo_data.views import get_view

    if view in S.TABLES:  # a table whole (steps: token ids, logprobs and screenshots of every step)
        description = S.TABLES[view].doc
        table = run_query(lake, f'select * from "{view}"' + (f" where {where}" if where else ""), as_of=as_of, params=params)
    else:
        description = get_view(view).description
        table = view_rows(lake, view, where=where, params=params, as_of=as_of)
    if table.num_rows == 0:
        raise LakeError(f"view {view} has no rows" + (f" where {where}" if where else "") + ": nothing to export")
    if split_by is not None and split_by not in table.column_names:
        raise LakeError(f"--split-by {split_by}: view {view} has no such column (columns: {', '.join(table.column_names)})")
    output = Path(output)
    data, image_columns = _dataset_table(lake, view, table, as_of)
    features = _features(data, image_columns)
    schema = data.schema.with_metadata({"huggingface": json.dumps({"info": {"features": features.to_dict()}})})
    data = data.cast(schema)
    if split_by is None:
        splits = {"train": data}
    else:
        names = [split_name(v) for v in table.column(split_by).to_pylist()]
        splits = {}
        for name in sorted(set(names)):
            splits[name] = data.filter(pc.equal(pa.array(names), name))
    tmp = _prepare_output(output)
    rows, sizes, shards, data_files = {}, {}, [], []
    for name, part in splits.items():
        n_shards = max(1, -(-part.num_rows // max_shard_rows))
        for i in range(n_shards):
            rel = f"data/{name}-{i:05d}-of-{n_shards:05d}.parquet"
            pq.write_table(part.slice(i * max_shard_rows, max_shard_rows), tmp / rel)
            shards.append(rel)
        rows[name] = part.num_rows
        sizes[name] = part.nbytes
        data_files.append({"split": name, "path": f"data/{name}-*.parquet"})
    context = {
        "lake": lake.root, "where": where, "split_by": split_by, "load_path": str(output),
        "params": ", ".join(f"{k}={v}" for k, v in sorted((params or {}).items())) if isinstance(params, dict) else params,
        "snapshot": (f"as of {as_of}" if as_of is not None else
                     "versions " + ", ".join(f"{t} {v}" for t, v in lake.versions().items())),
        "runs": _runs(lake, table, as_of),
    }
    (tmp / "README.md").write_text(_card(view, description, features, rows, sizes, data_files, context), encoding="utf-8")
    if output.exists():
        shutil.rmtree(output)
    tmp.rename(output)
    return HFExport(output, rows, features.to_dict(), shards)


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
