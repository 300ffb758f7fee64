"""Compile tier for FlyDSL output: compile-only for the target, in a subprocess, then read the ISA.

FlyDSL kernels cannot run here (no AMD GPU, no CPU interpreter), so what can be checked is that
each variant compiles for its target and that its assembly has the shape the design relies on:
the MFMA and transpose instructions, no scratch, no spills, LDS and VGPRs within the target's
budget. The counts are recorded in the lock so a regression shows up in review.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from kgen.errors import KgenError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEVICE_LIBS = Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")  # Debian's rocm-device-libs
METADATA_KEYS = ("vgpr_count", "agpr_count", "sgpr_count", "vgpr_spill_count", "sgpr_spill_count",
                 "group_segment_fixed_size", "private_segment_fixed_size")


@dataclass(frozen=True)
class IsaReport:
    kernel: str
    metadata: dict[str, int]
    instructions: int
    basic_blocks: int
    mnemonics: dict[str, int]

    def summary(self) -> dict[str, int]:
        """The numbers recorded in the lock (stable for pinned flydsl and LLVM)."""
        m = self.metadata
        return {
            "vgprs": m.get("vgpr_count", 0),
            "sgprs": m.get("sgpr_count", 0),
            "vgpr_spills": m.get("vgpr_spill_count", 0),
            "sgpr_spills": m.get("sgpr_spill_count", 0),
            "scratch_bytes": m.get("private_segment_fixed_size", 0),
            "lds_bytes": m.get("group_segment_fixed_size", 0),
            "instructions": self.instructions,
            "basic_blocks": self.basic_blocks,
        }


def find_lld() -> str | None:
    """An AMDGPU-capable ld.lld on PATH (Debian's lld-19 names it ld.lld-19)."""
    return shutil.which("ld.lld-19") or shutil.which("ld.lld")


def rocm_root() -> Path:
    """A minimal ROCM_PATH for the compile step: FlyDSL links with $ROCM_PATH/llvm/bin/ld.lld
    (PATH is not searched) and device-library calls need $ROCM_PATH/amdgcn/bitcode."""
    lld = find_lld()
    if lld is None:
        raise KgenError("FlyDSL compile tier: no ld.lld found (Debian: apt-get install lld-19)")
    root = Path(os.environ.get("KGEN_ROCM_PATH", Path.home() / ".cache" / "kgen" / "rocm"))
    (root / "llvm" / "bin").mkdir(parents=True, exist_ok=True)
    link = root / "llvm" / "bin" / "ld.lld"
    if not link.exists():
        link.symlink_to(lld)
    bitcode = root / "amdgcn" / "bitcode"
    if DEVICE_LIBS.is_dir() and not bitcode.exists():
        bitcode.parent.mkdir(parents=True, exist_ok=True)
        bitcode.symlink_to(DEVICE_LIBS)
    return root


def compile_variant(module_path: Path, arch: str, dump_dir: Path, timeout: float = 600) -> tuple[IsaReport | None, str]:
    """Compile one generated FlyDSL module for `arch` in a subprocess; (report, error text)."""
    env = dict(os.environ)
    env.update(
        COMPILE_ONLY="1",
        FLYDSL_GPU_ARCH=arch,
        ARCH=arch,
        FLYDSL_RUNTIME_ENABLE_CACHE="0",
        FLYDSL_DEBUG_DUMP_ASM="1",
        FLYDSL_DUMP_DIR=str(dump_dir),
        ROCM_PATH=str(rocm_root()),
        PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")])),
    )
    env.pop("FLYDSL_DUMP_IR", None)
    args = [sys.executable, "-m", "kgen.verify.flydsl_worker", str(module_path)]
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"compile timed out after {timeout:.0f} s"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        llvm = [line for line in lines if "LLVM ERROR" in line]
        reason = "aborted by LLVM" if proc.returncode < 0 or proc.returncode == 134 else f"exit {proc.returncode}"
        return None, f"{reason}: {(llvm or lines or ['no output'])[-1]}"
    try:
        kernel = json.loads(proc.stdout.strip().splitlines()[-1])["kernel"]
    except (ValueError, IndexError, KeyError):
        return None, f"worker printed no kernel name: {proc.stdout[-300:]}"
    isa_files = sorted(dump_dir.rglob("*final_isa.s"))
    if not isa_files:
        return None, f"no *_final_isa.s under {dump_dir}"
    return parse_isa(isa_files[-1].read_text(), kernel), ""


def parse_isa(text: str, kernel: str) -> IsaReport:
    """Metadata (registers, spills, LDS, scratch) and an instruction histogram of one kernel."""
    meta_text = text.split(".amdgpu_metadata", 1)[-1]
    entry = next((e for e in re.split(r"\n  - ", meta_text) if re.search(rf"\.name:\s+{re.escape(kernel)}\b", e)), meta_text)
    metadata = {k: int(m.group(1)) for k in METADATA_KEYS if (m := re.search(rf"\.{k}:\s+(\d+)", entry))}
    body = re.search(rf"^{re.escape(kernel)}:\n(.*?)^\.Lfunc_end", text, re.S | re.M)
    ops, blocks = Counter(), 1
    for line in (body.group(1).splitlines() if body else []):
        s = line.strip()
        if s.startswith(".LBB") and s.endswith(":"):
            blocks += 1
        elif s and not s.startswith((";", ".", "//")):
            ops[s.split()[0]] += 1
    return IsaReport(kernel, metadata, sum(ops.values()), blocks, dict(sorted(ops.items())))


def isa_problems(report: IsaReport, target, lds_expected: int) -> list[str]:
    """What the design relies on, checked on the assembly."""
    s = report.summary()
    problems = [f"missing {m}" for m in target.required_isa if report.mnemonics.get(m, 0) == 0]
    if s["scratch_bytes"]:
        problems.append(f"uses {s['scratch_bytes']} B of scratch (private segment)")
    if s["vgpr_spills"] or s["sgpr_spills"]:
        problems.append(f"spills {s['vgpr_spills']} VGPRs and {s['sgpr_spills']} SGPRs")
    if s["lds_bytes"] > target.lds_bytes or s["lds_bytes"] < lds_expected:
        problems.append(f"LDS {s['lds_bytes']} B (planned {lds_expected} B, limit {target.lds_bytes} B)")
    if s["vgprs"] + report.metadata.get("agpr_count", 0) > target.vgprs:
        problems.append(f"{s['vgprs']} VGPRs exceed {target.vgprs}")
    return problems


def compile_outputs(outputs, generated: Path, reuse: Mapping[str, Mapping] | None = None, log=print):
    """Compile every FlyDSL output (from generated/ when the file there is current, else from a
    temporary copy); returns (outputs with ISA counts attached, {variant: [problems]}).
    `reuse` (old lock entries) skips outputs whose counts are recorded for the same code (the same
    file, or one that differed only in its header's spec hash: validation_sha256)."""
    import tempfile

    from kgen.targets import AMD_TARGETS

    done, problems = [], {}
    with tempfile.TemporaryDirectory(prefix="kgen-flydsl-") as tmp:
        for out in outputs:
            if not out.compile_arch:
                done.append(out)
                continue
            old = (reuse or {}).get(out.relpath, {})
            same_code = old.get("sha256") == out.sha256 or old.get("validation_sha256") == out.validation_sha256
            if same_code and "isa" in old:
                done.append(out.with_isa({k: v for k, v in old["isa"].items() if k != "arch"}))
                continue
            path = generated / out.relpath
            if not path.exists() or path.read_text(encoding="utf-8") != out.text:
                path = Path(tmp) / out.relpath
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(out.text, encoding="utf-8")
            report, error = compile_variant(path, out.compile_arch, Path(tmp) / "dump" / out.variant)
            if report is None:
                problems[out.variant] = [f"does not compile for {out.compile_arch}: {error}"]
                log(f"  FAIL {out.variant} [{out.compile_arch}]: {error}")
                done.append(out)
                continue
            summary = report.summary()
            found = isa_problems(report, AMD_TARGETS[out.compile_arch], out.planned_lds)
            if found:
                problems[out.variant] = found
            counts = {m: report.mnemonics.get(m, 0) for m in AMD_TARGETS[out.compile_arch].required_isa}
            log(
                f"  {'FAIL' if found else 'ok  '} {out.variant} [{out.compile_arch}]: {summary['vgprs']} VGPRs, "
                f"{summary['sgprs']} SGPRs, {summary['lds_bytes']} B LDS, {summary['scratch_bytes']} B scratch, "
                f"{summary['instructions']} instructions, {summary['basic_blocks']} blocks; "
                + ", ".join(f"{m} x{n}" for m, n in counts.items())
                + ("" if not found else "; " + "; ".join(found))
            )
            done.append(out.with_isa({**summary, **counts}))
    return done, problems
