"""HALO benchmarks: the lake against the older per-episode JSONL pipeline, measured side by side.

    .venv/bin/python -m bench --quick                  # 10k steps, under two minutes
    .venv/bin/python -m bench --sizes 10k,100k,300k,1M # the full table (bench/README.md says what each figure is)
    .venv/bin/python -m bench --check                  # sanity check of the harness itself
"""
