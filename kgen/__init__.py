"""kgen: declarative specs in, verified GPU kernels out (Triton and FlyDSL)."""

__version__ = "0.1.0"
