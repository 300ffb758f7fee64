"""`kgen doctor`: what is installed, what works, and what each missing piece disables.

Versions are read from package metadata (nothing heavy is imported here); each capability is
probed in a subprocess, so a broken install shows up as a finding, never as a crash of kgen.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata

from kgen import __version__
from kgen.toolchain import GENERATOR_PINS, RUNTIME_PINS
from kgen.verify.numerics import CUDA_PROBE

PACKAGES = ("kgen", "triton", "flydsl", "torch", "sympy", "jinja2", "black", "pyyaml")

# A one-element Triton kernel run under the interpreter (TRITON_INTERPRET=1 set by the caller).
_INTERPRETER_PROBE = """
import torch, triton, triton.language as tl
@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)
x = torch.zeros(4)
add_one[(1,)](x, 4, BLOCK=8)
assert x.tolist() == [1.0] * 4, x
"""
_FLYDSL_PROBE = "import flydsl"


@dataclass(frozen=True)
class Package:
    name: str
    version: str | None  # None: not installed
    wanted: str  # the pin kgen declares ("" when none)
    ok: bool  # installed and within the pin


@dataclass(frozen=True)
class Capability:
    name: str
    ok: bool
    detail: str  # what was found, or why it failed
    disables: str  # what a missing capability turns off (shown only when not ok)
    required: bool  # `kgen verify` with its defaults cannot run without it


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _within(version: str, spec: str) -> bool:
    """Whether `version` satisfies a simple pin such as '==1.2.3' or '>=3.6,<3.10'."""

    def key(v: str) -> tuple[int, ...]:
        parts = []
        for piece in v.split("+")[0].split("."):
            digits = "".join(ch for ch in piece if ch.isdigit()) if piece else ""
            if not digits:
                break
            parts.append(int(digits))
            if not piece.isdigit():
                break
        return tuple(parts)

    have = key(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        op = next(o for o in ("==", ">=", "<=", "<", ">") if clause.startswith(o))
        want = key(clause[len(op):])
        pad = max(len(have), len(want))
        h, w = have + (0,) * (pad - len(have)), want + (0,) * (pad - len(want))
        if not {"==": h == w, ">=": h >= w, "<=": h <= w, "<": h < w, ">": h > w}[op]:
            return False
    return True


def packages() -> list[Package]:
    pins = {**RUNTIME_PINS, **GENERATOR_PINS}
    out = []
    for name in PACKAGES:
        version = __version__ if name == "kgen" else _version(name)
        wanted = pins.get(name, "")
        out.append(Package(name, version, wanted, version is not None and (not wanted or _within(version, wanted))))
    return out


def _probe(code: str, env: dict[str, str] | None = None, timeout: float = 120, drop: tuple[str, ...] = ()) -> tuple[bool, str]:
    full = {k: v for k, v in dict(os.environ, **(env or {})).items() if k not in drop}
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s"
    if proc.returncode == 0:
        return True, ""
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return False, (lines[-1] if lines else f"exit {proc.returncode}")


def capabilities() -> list[Capability]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:  # the probes are subprocesses: run them at once
        interp = pool.submit(_probe, _INTERPRETER_PROBE, {"TRITON_INTERPRET": "1"})
        gpu = pool.submit(_probe, CUDA_PROBE, drop=("TRITON_INTERPRET",))
        fly = pool.submit(_probe, _FLYDSL_PROBE)
    caps = []
    ok, why = interp.result()
    caps.append(Capability(
        "triton-interpreter", ok, "ran a Triton kernel on CPU" if ok else why,
        "numerical validation on CPU (`kgen build` validation and `kgen verify` numerics without a GPU); "
        "use --no-validate / --no-numerics", True,
    ))
    cuda, why = gpu.result()
    detail = "torch.cuda.is_available()" if cuda else ("no CUDA GPU visible to torch" if not why or "Error" not in why else why)
    caps.append(Capability(
        "cuda-gpu", cuda, detail,
        "numerics on the GPU (--device cuda) and GPU-only tests; the interpreter is used instead", False,
    ))
    fly_ok, fly_why = fly.result()
    from kgen.verify.flydsl import DEVICE_LIBS, find_lld  # light module: no flydsl/torch import

    lld = find_lld()

    missing = []
    if not fly_ok:
        missing.append(f"flydsl does not import ({fly_why})")
    if lld is None:
        missing.append("no ld.lld (Debian: apt-get install lld-19)")
    if not DEVICE_LIBS.is_dir():
        missing.append(f"no AMD device libraries at {DEVICE_LIBS} (Debian: apt-get install rocm-device-libs)")
    caps.append(Capability(
        "flydsl-compile-only", not missing,
        f"flydsl {_version('flydsl')}, linker {lld}, device libs {DEVICE_LIBS}" if not missing else "; ".join(missing),
        "the FlyDSL compile tier (ISA checks of tq_decode_gfx950_* variants); "
        "use --no-compile to trust the ISA counts recorded in generated/kgen.lock", False,
    ))
    return caps


def report() -> dict:
    pkgs, caps = packages(), capabilities()
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "packages": [asdict(p) for p in pkgs],
        "capabilities": [asdict(c) for c in caps],
        "ok": all(c.ok for c in caps if c.required) and all(p.ok for p in pkgs if p.name in GENERATOR_PINS),
    }


def print_report(data: dict, out=None) -> None:
    out = out or sys.stdout
    print(f"python {data['python']} ({data['executable']})", file=out)
    print("packages:", file=out)
    for p in data["packages"]:
        version = p["version"] or "not installed"
        pin = f" (kgen pins {p['wanted']})" if p["wanted"] else ""
        mark = "ok  " if p["ok"] else ("--  " if p["version"] is None else "WARN")
        print(f"  {mark} {p['name']:8s} {version}{pin}", file=out)
        if p["version"] is not None and not p["ok"]:
            why = "generated bytes may differ from the checked-in output" if p["name"] in GENERATOR_PINS else "outside the tested range"
            print(f"       {why}", file=out)
    print("capabilities:", file=out)
    for c in data["capabilities"]:
        print(f"  {'ok  ' if c['ok'] else 'MISS'} {c['name']}: {c['detail']}", file=out)
        if not c["ok"]:
            print(f"       disables: {c['disables']}", file=out)
    print("kgen doctor: " + ("ok" if data["ok"] else "problems found (see above)"), file=out)
