"""The Sinkhorn solver and its implicit differentiation."""
