"""Verification tiers: drift, static checks, numerics (interpreter on CPU, or a CUDA GPU)."""
