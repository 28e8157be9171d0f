"""Functional operators: Sinkhorn operators, relaxed permutations, sampling, hard statistics."""
