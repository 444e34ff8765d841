"""Token scheduling: ExpertFlow re-batching by predicted routing paths (rebatch.py, cli.py)."""
