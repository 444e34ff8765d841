"""Expert placement and replication planners (MoE-GPS Algorithm 1; PROBE and EPLB-style balancers)."""
