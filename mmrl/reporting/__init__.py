"""What a run writes for people: metrics.jsonl and trackers, completions tables, batch reports,
credit pictures."""
