"""Keras layers over the Sinkhorn and relaxed-permutation operators."""
