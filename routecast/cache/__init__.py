"""Expert caching: the replay simulator (kernel.py, structs.py, stream.py), policies and metrics (replay.py,
policy.py, slots.py), eMoE's task-aware residency choice (emoe.py) and the CLI (cli.py). eMoE measured on a real
model is runtime/emoe/."""
