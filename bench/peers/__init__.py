"""Peers the benchmarks run beside Studio, on the same machine, in the same invocation."""
