"""An experiment's root as a pack: what ``experiment run`` needs to go on from where it stopped, on another machine
or in a later session, without what no stage reads again.

``pack`` mirrors ROOT into a folder (a file already there unchanged is not written again, a file gone from the root
or no longer needed goes from the folder), so that the folder can be kept in version control or object storage and
updated each time the run is paused; ``unpack`` makes a root of it again. Everything is copied byte for byte except:

- the screenshots table's data files: no stage reads them (the observations are text); ``unpack`` repairs the table
  (Delta's FSCK), so the restored lake reads consistently, without those screenshots;
- each table's Delta checkpoints before its last: each lists every file of its version, so together they grow with
  the square of the commits, and the last one (then the commits after it) is what a read starts from; the commits
  themselves are all kept, so every version stays readable;
- training checkpoints that a final adapter supersedes, and all but the last checkpoint of a job that is still
  running (``--resume-from`` takes the last);
- an online run's served versions before the last one its iterations record (``--resume`` and the evaluations read
  only that one and any newer), and half-written ones (``.policy-N.saving``);
- once a trained arm's training is final and all its evaluation cells are complete: its optimizer states
  (``learner_state.pt``), and its adapters' weights are kept in float16, as ``experiment export`` stores them.

``pack.json`` in the folder counts what was kept and what was left out, and why, and what this pack wrote and
removed in the folder (``change``; ``replaced``: the files written over, with their size before): the bytes a
commit or an upload of the folder carries, which a dry run tells before anything is written. A file whose content
the folder already holds is not written again. Unpack to the root's own path: the lake's records name adapters by
absolute path. Stop ``experiment run`` before packing: a root written to while it is packed is refused.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from halo_data.lake import DELTA_CHECKPOINT
from halo_train.experiment.export import half_bytes
from halo_train.experiment.record import LOCK, ExperimentError, code_identity, holding, now

MANIFEST = "pack.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")
POLICY = re.compile(r"policy-(\d+)")
FINAL_WEIGHTS = "adapter_model.safetensors"
LEARNER_STATE = "learner_state.pt"


class PackError(ExperimentError):
    """A pack or unpack that cannot be done as asked; the message says what to do."""


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: relative path -> (size, mtime in ns)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            st = path.stat()
            out[path.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def _number(pattern: re.Pattern[str], name: str) -> int | None:
    m = pattern.fullmatch(name)
    return int(m.group(1)) if m else None


class Plan:
    """What happens to each file of a root: ``copy``, ``half`` (float16 weights) or left out with a reason."""

    def __init__(self, runner):
        self.root = runner.root
        self.finished: set[str] = set()  # ARM-sSEED folders whose training is final and evaluation complete
        self.last_served: dict[str, int] = {}  # online ARM-sSEED folder -> the last recorded served version
        p = runner.p
        for arm in p.trained_arms():
            for seed in p.arm_seeds(arm):
                folder = runner.adapter_dir(arm, seed).name
                if runner.final_adapter(arm, seed) is not None and not runner.missing(p.eval_cells(arm, seed)):
                    self.finished.add(folder)
                if p.method(arm) == "online":
                    its = runner.state.online_iterations(p.online_run(seed, arm))
                    path = (its[-1].get("served_after") or {}).get("path") if its else None
                    self.last_served[folder] = (_number(POLICY, Path(path).name) or 0) if path else 0

    @staticmethod
    def _newest(folder: Path, pattern: re.Pattern[str]) -> int:
        """The highest number among ``folder``'s entries that ``pattern`` names (listed now: a plan may be reused)."""
        return max((_number(pattern, f.name) or 0 for f in folder.iterdir()), default=0)

    def action(self, rel: str) -> str:
        """``copy``, ``half``, or ``omit:REASON``."""
        parts = rel.split("/")
        if parts[0] == "lake":
            if len(parts) > 2 and parts[1] == "screenshots" and "_delta_log" not in parts:
                return "omit:screenshots (no stage reads them)"
            version = _number(DELTA_CHECKPOINT, parts[-1])
            if parts[-2:-1] == ["_delta_log"] and version is not None:
                if version < self._newest(self.root.joinpath(*parts[:-1]), DELTA_CHECKPOINT):
                    return "omit:Delta checkpoints before the last (the log's commits replay them)"
            return "copy"
        if parts[0] != "adapters":
            return "omit:process files" if len(parts) == 1 and (rel.endswith(".pid") or rel == LOCK) else "copy"
        arm_folder = parts[1] if len(parts) > 1 else ""
        for i, part in enumerate(parts[:-1]):
            if part.startswith(".") and part.endswith(".saving"):
                return "omit:half-written versions"
            step = _number(CHECKPOINT, part)
            if step is not None:
                job = self.root.joinpath(*parts[:i])
                if (job / "final" / "adapter_config.json").exists():
                    return "omit:checkpoints a final adapter supersedes"
                if step < self._newest(job, CHECKPOINT):
                    return "omit:earlier checkpoints of a running job"
            version = _number(POLICY, part)
            if version is not None and version < self.last_served.get(arm_folder, 0):
                return "omit:served versions before the last"
        if arm_folder in self.finished:
            if parts[-1] == LEARNER_STATE:
                return "omit:optimizer states of finished arms"
            if parts[-1] == FINAL_WEIGHTS:
                return "half"
        return "copy"


def pack(runner, dest: str | Path, plan: Plan | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Mirror the runner's root into ``dest`` as described above (``plan``: what becomes of each file, by default
    the runner's state now); the manifest it wrote to ``dest/pack.json``. ``dry_run``: write nothing, and return the
    manifest the pack would write (``change`` says what it would write and remove in ``dest``)."""
    root, dest = runner.root, Path(dest).resolve()
    if not (root / "experiment.json").exists():
        raise PackError(f"{root} holds no registered experiment: nothing to pack")
    if dest == root or root in dest.parents:
        raise PackError(f"pack into a folder outside the root {root}")
    if dest.exists() and any(dest.iterdir()) and not (dest / MANIFEST).exists():
        raise PackError(f"{dest} holds files that are not a pack: choose an empty folder or an earlier pack")
    with holding(root, "pack"):  # refused while `run` holds the root
        return _mirror(runner, dest, plan or Plan(runner), dry_run)


def _differs(src: Path, dst: Path, src_stat: tuple[int, int], dst_stat: tuple[int, int] | None) -> bool:
    """Whether copying ``src`` would change ``dst``: a file copied before and unchanged since keeps its size and
    time (``copy2``); a checkout gives a pack's files new times, so those are compared by content."""
    if dst_stat is None or dst_stat[0] != src_stat[0]:
        return True
    return dst_stat != src_stat and not filecmp.cmp(src, dst, shallow=False)


def _mirror(runner, dest: Path, plan: Plan, dry_run: bool) -> dict[str, Any]:
    root = runner.root
    before = _files(root)
    kept: dict[str, str] = {}
    omitted: dict[str, dict[str, int]] = {}
    for rel, (size, _) in sorted(before.items()):
        action = plan.action(rel)
        if action.startswith("omit:"):
            reason = omitted.setdefault(action[5:], {"files": 0, "bytes": 0})
            reason["files"] += 1
            reason["bytes"] += size
        else:
            kept[rel] = action
    present = _files(dest) if dest.exists() else {}
    previous = json.loads((dest / MANIFEST).read_text()) if MANIFEST in present else {}
    present.pop(MANIFEST, None)

    # What the folder gains and loses: the bytes a commit of it carries, or an upload of it sends.
    sizes: dict[str, int] = {}
    written: list[str] = []
    for rel, action in kept.items():
        src, dst = root / rel, dest / rel
        if action == "half":
            data = half_bytes(src)  # what `experiment export` stores
            sizes[rel] = len(data)
            if rel not in present or dst.read_bytes() != data:
                written.append(rel)
        else:
            sizes[rel] = before[rel][0]
            if _differs(src, dst, before[rel], present.get(rel)):
                written.append(rel)
    removed = {rel: size for rel, (size, _) in present.items() if rel not in kept}
    replaced = [rel for rel in written if rel in present]  # a diff of the folder shows their old content too
    change = {"since": previous.get("packed_at"),
              "written": {"files": len(written), "bytes": sum(sizes[rel] for rel in written)},
              "replaced": {"files": len(replaced), "bytes": sum(present[rel][0] for rel in replaced)},
              "removed": {"files": len(removed), "bytes": sum(removed.values())}}
    manifest = {
        "experiment": runner.p.name, "root": str(root), "packed_at": now(), "code": code_identity()["commit"],
        "files": len(kept), "bytes": sum(sizes.values()),
        "float16": sorted(rel for rel, a in kept.items() if a == "half"),
        "finished_arms": sorted(plan.finished), "omitted": omitted, "change": change,
        # arms still training: their optimizer states are kept, and the pack after their training ends removes them
        "optimizer_states_kept": {rel: sizes[rel] for rel in kept if Path(rel).name == LEARNER_STATE},
    }
    if dry_run:
        return manifest

    dest.mkdir(parents=True, exist_ok=True)
    for rel in removed:
        (dest / rel).unlink()
    for rel in written:
        dst = dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if kept[rel] == "half":
            dst.write_bytes(half_bytes(root / rel))  # converted again rather than held: adapters can be large
        else:
            shutil.copy2(root / rel, dst)  # keeps the time: unchanged, it is not copied again next time
    for dirpath, _, _ in sorted(os.walk(dest), reverse=True):  # folders left empty by removed files
        if Path(dirpath) != dest and not any(Path(dirpath).iterdir()):
            Path(dirpath).rmdir()
    after = _files(root)
    changed = sorted(rel for rel in set(before) | set(after) if before.get(rel) != after.get(rel)
                     and plan.action(rel) != "omit:process files")
    if changed:
        raise PackError(f"the root changed while it was packed ({changed[0]}, {len(changed)} files): stop "
                        f"`halo-train experiment run`, then pack again")
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def unpack(src: str | Path, root: str | Path) -> dict[str, Any]:
    """Make ``root`` of a pack: its files copied, the lake's tables repaired where the pack left data files out.
    What it did: files, bytes and the repaired files per table."""
    from halo_data.lake import Lake
    from halo_data.ops import repair

    src, root = Path(src).resolve(), Path(root).resolve()
    if not (src / MANIFEST).exists() or not (src / "experiment.json").exists():
        raise PackError(f"{src} is not a pack of an experiment (no {MANIFEST} and experiment.json)")
    if root.exists() and any(root.iterdir()):
        raise PackError(f"{root} is not empty: unpack into a new or empty folder (the root's own path)")
    files = {rel: size for rel, (size, _) in _files(src).items() if rel != MANIFEST}
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, root / rel)
    lake = root / "lake"
    repaired = repair(Lake.open(str(lake))) if (lake / "meta" / "info.json").exists() else {}
    return {"files": len(files), "bytes": sum(files.values()),
            "repaired": {table: len(gone) for table, gone in repaired.items()}}
