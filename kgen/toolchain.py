"""Version pins the generated code and the generator's output depend on.

These are the pins the project declares, not what happens to be installed: their hash goes into
every generated header, so the drift check answers the same on every machine. `pyproject.toml`
must carry the same generator pins (a test checks it).
"""

from __future__ import annotations

import hashlib
import json

# What generated code needs at run time (H200 runs triton 3.6 / torch 2.11; CI 3.9 / 2.13).
RUNTIME_PINS = {"torch": ">=2.11", "triton": ">=3.6,<3.10", "flydsl": "==0.4.2"}
# Which of them each backend's modules import (FlyDSL modules merge partitions with Triton).
BACKEND_PACKAGES = {"triton": ("torch", "triton"), "flydsl": ("torch", "triton", "flydsl")}

# What decides the bytes kgen writes: printing order, template semantics, formatting.
GENERATOR_PINS = {"sympy": "==1.14.0", "jinja2": "==3.1.6", "black": "==26.10.1", "pyyaml": "==6.0.3"}

# Formatting of generated Python (black's line length).
LINE_LENGTH = 100


def runtime_pins(backend: str) -> dict[str, str]:
    return {name: RUNTIME_PINS[name] for name in BACKEND_PACKAGES[backend]}


def pins_sha256(backend: str | None = None) -> str:
    """Content hash of the generator pins and the runtime pins of `backend` (all when None)."""
    runtime = RUNTIME_PINS if backend is None else runtime_pins(backend)
    text = json.dumps({"runtime": runtime, "generator": GENERATOR_PINS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
