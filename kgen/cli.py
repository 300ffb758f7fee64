"""kgen command line: build · verify · list · show.

Exit status: 0 ok, 1 verification failed, 2 bad usage or bad spec.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import tempfile
from pathlib import Path

from kgen import __version__
from kgen.errors import KgenError, VerifyFailure


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except KgenError as err:
        print(f"kgen: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kgen", description="Generate verified GPU kernels from YAML specs.")
    p.add_argument("--version", action="version", version=f"kgen {__version__}")
    p.add_argument("--root", type=Path, default=Path("."), help="project root holding specs/ and generated/ (default: .)")
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    b = sub.add_parser("build", help="generate kernels for the specs (all of specs/*.yaml when none is named)")
    b.add_argument("specs", nargs="*", metavar="SPEC")
    b.add_argument("--no-validate", action="store_true", help="write without the numerical check (not recommended)")
    b.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where to validate (default: cuda if present)")
    b.add_argument("--no-compile", action="store_true", help="FlyDSL: keep the lock's recorded ISA counts instead of compiling")
    b.set_defaults(run=_build)

    v = sub.add_parser("verify", help="check generated/ against the specs: drift, static proofs, numerics")
    v.add_argument("specs", nargs="*", metavar="SPEC")
    v.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="numerics device (default: cuda if present)")
    v.add_argument("--no-numerics", action="store_true", help="skip the numerical tier")
    v.add_argument("--no-compile", action="store_true", help="skip the FlyDSL compile tier (trust the lock's ISA counts)")
    v.add_argument("--only", metavar="GLOB", help="numerics only for variants whose name matches (e.g. '*triton*')")
    v.set_defaults(run=_verify)

    ls = sub.add_parser("list", help="list the variants every spec produces, with their axes")
    ls.add_argument("specs", nargs="*", metavar="SPEC")
    ls.set_defaults(run=_list)

    sh = sub.add_parser("show", help="show a variant's derived plan: numbers, index expressions, proofs")
    sh.add_argument("variant")
    sh.set_defaults(run=_show)
    return p


def _device(choice: str) -> str:
    from kgen.verify.numerics import cuda_available

    if choice == "auto":
        return "cuda" if cuda_available() else "cpu"
    if choice == "cuda" and not cuda_available():
        raise KgenError("--device cuda: no CUDA GPU is available")
    return choice


def _print_numerics(results) -> bool:
    ok = True
    for r in results:
        print(f"  {'ok  ' if r.ok else 'FAIL'} {r.variant} [{r.device}]")
        for line in r.lines:
            print(f"       {line}")
        ok &= r.ok
    return ok


def _build(args) -> int:
    from kgen.emit import LOCK_NAME, lock_text, plan_lock, read_lock, write_atomic
    from kgen.generate import generate, load_all, project_path
    from kgen.verify.numerics import run_numerics

    root = args.root
    specs = load_all(args.specs, root)
    generated = root / "generated"
    outputs = {project_path(s, root): generate(s, root) for s in specs}  # everything in memory before anything is written

    changed = {
        path: [o for o in outs if _read(generated / o.relpath) != o.text] for path, outs in outputs.items()
    }
    if args.no_validate:
        if any(changed.values()):
            print("kgen: WARNING: --no-validate: writing kernels that were NOT checked against their reference", file=sys.stderr)
    else:
        device = _device(args.device)
        with tempfile.TemporaryDirectory(prefix="kgen-build-") as tmp:
            failed = []
            for path, outs in changed.items():
                if not outs:
                    continue
                modules = {}
                for o in outs:
                    target = Path(tmp) / o.relpath
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(o.text)
                    modules[o.variant] = target
                print(f"validating {len(outs)} variant(s) of {path} on {device}")
                results = run_numerics(str(root / path), modules, device)
                if not _print_numerics(results):
                    failed += [r.variant for r in results if not r.ok]
            if failed:
                raise VerifyFailure(f"not written: {len(failed)} variant(s) failed validation: {', '.join(failed)}")

    old_lock = read_lock(generated)
    outputs = _with_isa(outputs, generated, old_lock, "lock" if args.no_compile else "changed")
    entries, stale = plan_lock(old_lock, [o for outs in outputs.values() for o in outs], list(outputs))
    written = sum(write_atomic(generated / o.relpath, o.text) for outs in outputs.values() for o in outs)
    for relpath in stale:
        (generated / relpath).unlink(missing_ok=True)
        print(f"removed {generated / relpath} (no spec produces it any more)")
    write_atomic(generated / LOCK_NAME, lock_text(entries))
    total = sum(len(o) for o in outputs.values())
    print(f"kgen build: {total} variant(s) from {len(specs)} spec(s), {written} written, {total - written} unchanged")
    return 0


def _verify(args) -> int:
    from kgen.emit import read_lock
    from kgen.generate import generate, load_all, project_path
    from kgen.verify.drift import drift_problems
    from kgen.verify.numerics import run_numerics

    root = args.root
    specs = load_all(args.specs, root)  # static tier: spec constraints and index proofs run here
    generated = root / "generated"
    outputs = {project_path(s, root): generate(s, root) for s in specs}
    failures = 0
    if any(o.compile_arch for outs in outputs.values() for o in outs):
        try:
            outputs = _with_isa(outputs, generated, read_lock(generated), "lock" if args.no_compile else "all")
        except VerifyFailure as err:
            print(f"compile: {err}")
            failures += 1

    problems = drift_problems(generated, [o for outs in outputs.values() for o in outs], list(outputs))
    print(f"drift: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    for line in problems:
        print(f"  {line}")
    if problems:
        failures += 1
        named = " ".join(args.specs)
        print(f"  fix: kgen build {named}".rstrip())

    if not args.no_numerics:
        device = _device(args.device)
        for path, outs in outputs.items():
            modules = {o.variant: generated / o.relpath for o in outs if (generated / o.relpath).exists()}
            if args.only:
                modules = {name: path for name, path in modules.items() if fnmatch.fnmatch(name, args.only)}
            if not modules:
                continue
            print(f"numerics: {path} on {device} ({'Triton interpreter' if device == 'cpu' else 'GPU'})")
            if not _print_numerics(run_numerics(str(root / path), modules, device)):
                failures += 1
    if failures:
        raise VerifyFailure("verification failed")
    print("kgen verify: ok")
    return 0


def _with_isa(outputs: dict, generated: Path, lock: dict, mode: str) -> dict:
    """Attach ISA counts to FlyDSL outputs. mode "all": compile every one (verify); "changed":
    compile those whose content differs from the lock's record (build); "lock": copy the lock's
    counts without compiling (--no-compile). Raises VerifyFailure when a variant does not compile
    or its assembly breaks a design rule."""
    from kgen.verify.flydsl import compile_outputs

    flydsl = [o for outs in outputs.values() for o in outs if o.compile_arch]
    if not flydsl:
        return outputs
    if mode == "lock":
        print("kgen: --no-compile: FlyDSL ISA counts taken from the lock, not compiled", file=sys.stderr)
        recorded = lambda o: {k: v for k, v in lock.get(o.relpath, {}).get("isa", {}).items() if k != "arch"}  # noqa: E731
        return {p: [o.with_isa(recorded(o)) if o.compile_arch else o for o in outs] for p, outs in outputs.items()}
    print(f"compile: {len(flydsl)} FlyDSL variant(s) in compile-only mode")
    result, problems = {}, {}
    for path, outs in outputs.items():
        result[path], found = compile_outputs(outs, generated, lock if mode == "changed" else None)
        problems.update(found)
    if problems:
        raise VerifyFailure(f"{len(problems)} FlyDSL variant(s) failed the compile tier: {', '.join(problems)}")
    return result


def _list(args) -> int:
    from kgen.ops import OPS
    from kgen.generate import load_all

    for spec in load_all(args.specs, args.root):
        for v in OPS[spec.op].variants(spec):
            axes = " ".join(f"{k}={val}" for k, val in v.values.items())
            print(f"{v.name:40s} {spec.path}  {axes}")
    return 0


def _show(args) -> int:
    from kgen.ops import OPS
    from kgen.generate import load_all

    for spec in load_all(None, args.root):
        op = OPS[spec.op]
        for v in op.variants(spec):
            if v.name == args.variant:
                plan = op.lower(spec, v)
                print(f"{v.name}  ({spec.path}, op {spec.op}, backends {', '.join(spec.backends)})")
                print("derived:")
                for f in plan.facts:
                    print(f"  {f.name:28s} {f.value:24s} {f.why}".rstrip())
                print("address expressions (int width from the bound over the declared ranges):")
                for w in plan.widths:
                    print(f"  {w.name:12s} = {w.expr}")
                    print(f"  {'':12s}   range [{w.lo}, {w.hi}]; {w.reason}")
                proofs = getattr(plan, "proofs", ())
                if proofs:
                    print("lane mappings, each proven to cover its tile exactly once:")
                    for proof in proofs:
                        print(f"  {'ok  ' if proof.ok else 'FAIL'} {proof.name}: {proof.domain} -> {proof.image}")
                printed = getattr(plan, "expr", None) or getattr(plan, "printed", {})
                if printed:
                    print("printed for the template:")
                    for name, text in _flatten(printed):
                        print(f"  {name:12s} {text}")
                return 0
    raise KgenError(f"no variant named {args.variant!r} (see `kgen list`)")


def _flatten(printed, prefix=""):
    """(name, text) of printed expressions, nested groups as group.name; doc strings left out."""
    for name, value in printed.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{name}.")
        elif not name.startswith("doc."):
            yield f"{prefix}{name}", value


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


if __name__ == "__main__":
    sys.exit(main())
