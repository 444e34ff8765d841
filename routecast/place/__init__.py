"""Expert placement and replication planners (MoE-GPS Algorithm 1; PROBE and EPLB-style balancers), the slot
plans they produce, their comparison on a trace (compare*.py) and the export to serving engines (engines.py)."""
