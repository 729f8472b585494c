"""Benchmark reports: bench/reports/NAME.py turns bench/results/NAME/ into Markdown (report(results_dir) -> str)."""
