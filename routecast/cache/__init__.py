"""Expert caching: the replay simulator (kernel.py), policies and metrics (replay.py), the CLI (cli.py)."""
