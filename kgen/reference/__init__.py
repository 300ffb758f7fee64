"""PyTorch reference implementations, one module per operator (readable, slow is fine)."""
