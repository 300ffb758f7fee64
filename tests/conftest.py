"""Shared test setup. Generated Triton kernels run under the interpreter on CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Must precede any import of triton (generated modules import it).
os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]


def run_kgen(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run the CLI as users do, in a subprocess (exit status, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "kgen", *args], cwd=cwd, env=env, capture_output=True, text=True)


def keep_tuning_entries(root: Path, *variants: str) -> None:
    """Keep only these variants' entries in root's specs/msda.tuning.json: a copy of the spec
    narrowed to fewer variants must not name the others (kgen refuses such entries)."""
    path = root / "specs" / "msda.tuning.json"
    tuning = json.loads(path.read_text())
    tuning["schedules"] = {name: entry for name, entry in tuning["schedules"].items() if name in variants}
    path.write_text(json.dumps(tuning, indent=2))


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"kgen_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the project's specs, templates and generated output to modify freely."""
    for folder in ("specs", "templates", "generated"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    return tmp_path


class CompiledStandIn:
    """Triton's compiled-kernel contract, run by the interpreter: compiled[grid of three
    dims](*every argument in parameter order, constexprs included), the launch options baked in
    at compile time."""

    def __init__(self, kernel, launch):
        self.kernel, self.options, self.launches = kernel, launch, 0

    def __getitem__(self, grid):
        assert len(grid) == 3, grid  # unlike kernel[grid], no missing dims filled in

        def run(*args):
            self.launches += 1
            named = dict(zip(self.kernel.arg_names, args))
            constexprs = {name: named.pop(name) for name in list(named) if name in self.options}
            assert constexprs == {k: v for k, v in self.options.items() if k in self.kernel.arg_names}
            self.kernel[grid](*named.values(), **self.options)

        return run


class JitStandIn:
    """A GPU JITFunction's launch (kernel[grid](...) returns the compiled kernel), counted."""

    def __init__(self, kernel):
        self.kernel, self.arg_names, self.compiled = kernel, kernel.arg_names, []

    def __getitem__(self, grid):
        def run(*args, **launch):
            self.kernel[grid](*args, **launch)
            self.compiled.append(CompiledStandIn(self.kernel, launch))
            return self.compiled[-1]

        return run
