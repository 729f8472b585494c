"""``accelerate launch`` with HALO's shipped config: a bc job data-parallel over 2 CPU processes (gloo), one report."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from halo_data.lake import Lake

pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "halo_train" / "configs" / "accelerate_multi_gpu.yaml"


@pytest.mark.slow
def test_two_processes_split_the_rows_and_rank_0_alone_writes(tiny_lora_models, tmp_path):
    from halo_train.testing import write_fixture_episodes

    lake = Lake.init(tmp_path / "lake")
    write_fixture_episodes(lake)
    rows = lake.query_arrow("select count(*) as n from bc_rows").column(0)[0].as_py()
    base, _ = tiny_lora_models
    accelerate = Path(sys.executable).with_name("accelerate")
    # The shipped multi-GPU config, on CPU: accelerate's own CPU path needs MPI; this one runs
    # torch.distributed's launcher, and ACCELERATE_USE_CPU makes the processes use gloo on CPU.
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = [str(accelerate), "launch", "--config_file", str(CONFIG), "--num_processes", "2",
            "-m", "halo_train.cli", "bc", "--lake", str(tmp_path / "lake"), "--base-model", base, "--epochs", "1",
            "--batch-size", "2", "--lora-r", "2", "--output-dir", str(tmp_path / "out")]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [line for line in proc.stdout.splitlines() if line.startswith("run ")]
    # 2 processes x 2 rows per step: an epoch is rows / 4 steps (one process would take rows / 2)
    assert len(reports) == 1 and re.fullmatch(rf"run (\S+): {rows // 4} steps on {rows} rows of bc_rows", reports[0])
    run_id = reports[0].split()[1].rstrip(":")
    runs = lake.query_arrow("select run_id, status from runs").to_pylist()
    assert runs == [{"run_id": run_id, "status": "finished"}]
    # one loss row per step: rank 1 logged none
    losses = lake.query_arrow("select step from train_metrics where run_id = $r and metric = 'loss' order by step",
                              {"r": run_id}).column(0).to_pylist()
    assert losses == list(range(1, rows // 4 + 1))
    assert (tmp_path / "out" / "final" / "adapter_model.safetensors").exists()
