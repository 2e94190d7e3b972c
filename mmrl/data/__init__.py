"""Prompt datasets: loading (JSONL, CSV, Parquet, Hub layouts), validation, and the registered tasks (installed as `mmrl.data`)."""
