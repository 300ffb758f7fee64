"""Run the numerics worker for one spec's outputs and summarize per variant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class VariantResult:
    variant: str
    device: str
    ok: bool
    lines: tuple[str, ...]  # human-readable report lines


CUDA_PROBE = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"


def cuda_available() -> bool:
    """Ask a subprocess, so this process never imports torch (keeps the CLI fast)."""
    return subprocess.run([sys.executable, "-c", CUDA_PROBE], capture_output=True).returncode == 0


def run_numerics(spec_path: str, modules: dict[str, Path], device: str, timeout: float = 3600) -> list[VariantResult]:
    """Validate each variant's module file on `device` ("cpu" = Triton interpreter, or "cuda")."""
    args = [sys.executable, "-m", "kgen.verify.worker", spec_path, device]
    args += [f"{name}={path}" for name, path in modules.items()]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    if device != "cpu":
        env.pop("TRITON_INTERPRET", None)
    try:
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [VariantResult(n, device, False, (f"timed out after {timeout:.0f} s",)) for n in modules]
    records = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            records[rec["variant"]] = rec
    results = []
    for name in modules:
        rec = records.get(name)
        if rec is None:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            results.append(VariantResult(name, device, False, (f"worker died (exit {proc.returncode}): {tail}",)))
            continue
        if "error" in rec:
            results.append(VariantResult(name, device, False, tuple(rec["error"].rstrip().splitlines())))
            continue
        lines = []
        for c in rec["cases"]:
            if "max_abs" in c:
                lines.append(
                    f"{'ok  ' if c['ok'] else 'FAIL'} {c['case']}: max abs {c['max_abs']:.3g}, max rel {c['max_rel']:.3g}"
                    + (f", worst at {c['worst']}" if not c["ok"] else "")
                    + (f" ({c['detail']})" if c.get("detail") else "")
                )
            else:  # a pass/fail check without an error size (a missing gradient, gradcheck)
                lines.append(f"{'ok  ' if c['ok'] else 'FAIL'} {c['case']}: {c['detail']}")
        results.append(VariantResult(name, device, rec["ok"], tuple(lines)))
    return results
