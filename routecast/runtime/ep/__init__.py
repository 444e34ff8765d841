"""Expert parallelism on torch.distributed: routecast's slot plans executed by ranks routecast starts as one process group (ranks.py; see run.py, forward.py)."""
