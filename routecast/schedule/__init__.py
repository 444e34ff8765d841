"""Token scheduling: ExpertFlow re-batching by predicted routing paths (rebatch.py); s-MoE token-expert
co-clustering (cocluster.py, its CEO solver ceo.py and baselines.py), expert pre-grouping (permute.py), and
their commands (cocluster_cli.py; `schedule rebatch` is parsed in routecast/cli.py)."""
