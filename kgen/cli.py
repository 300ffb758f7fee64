"""kgen command line: build · verify · list · show · doctor · schema.

Exit status: 0 ok, 1 verification failed, 2 bad usage or bad spec.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import tempfile
from pathlib import Path

from kgen import __version__
from kgen.errors import KgenError, VerifyFailure


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        _configure(args)
        return args.run(args)
    except KgenError as err:
        print(f"kgen: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `kgen list | head`
        sys.stderr.close()
        return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kgen", description="Generate verified GPU kernels from YAML specs.")
    p.add_argument("--version", action="version", version=f"kgen {__version__}")
    p.add_argument("--root", type=Path, default=None,
                   help="project root holding specs/ and generated/ (default: the nearest folder at or above . with "
                        "a specs/ folder or a pyproject.toml with [tool.kgen], whose paths it may set)")
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    b = sub.add_parser("build", help="generate kernels for the specs (all of specs/*.yaml when none is named)")
    b.add_argument("specs", nargs="*", metavar="SPEC")
    b.add_argument("--no-validate", action="store_true", help="write without the numerical check (not recommended)")
    b.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where to validate (default: cuda if present)")
    b.add_argument("--no-compile", action="store_true", help="FlyDSL: keep the lock's recorded ISA counts instead of compiling")
    b.add_argument("-j", "--jobs", type=_jobs, default=1, metavar="N", help="run up to N validation/compile subprocesses at once (0: one per core; default 1)")
    b.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    b.set_defaults(run=_build)

    v = sub.add_parser("verify", help="check generated/ against the specs: drift, static proofs, numerics")
    v.add_argument("specs", nargs="*", metavar="SPEC")
    v.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="numerics device (default: cuda if present)")
    v.add_argument("--no-numerics", action="store_true", help="skip the numerical tier")
    v.add_argument("--no-compile", action="store_true", help="skip the FlyDSL compile tier (trust the lock's ISA counts)")
    v.add_argument("--only", metavar="GLOB", help="numerics only for variants whose name matches (e.g. '*triton*')")
    v.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or one JSON report on stdout, for tools")
    v.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    v.add_argument("-j", "--jobs", type=_jobs, default=1, metavar="N", help="run up to N numerics/compile subprocesses at once (0: one per core; default 1)")
    v.set_defaults(run=_verify)

    ls = sub.add_parser("list", help="list the variants every spec produces, with their axes")
    ls.add_argument("specs", nargs="*", metavar="SPEC")
    ls.set_defaults(run=_list)

    sh = sub.add_parser("show", help="show a variant's derived plan: numbers, index expressions, proofs")
    sh.add_argument("variant")
    sh.set_defaults(run=_show)

    tu = sub.add_parser("tune", help="GPU only: time the spec's schedule candidates per variant and size class, write the winners to its tuning file")
    tu.add_argument("specs", nargs="+", metavar="SPEC")
    tu.add_argument("--only", action="append", metavar="GLOB", help="only variants whose name matches (repeatable; default: all the spec tunes)")
    tu.add_argument("--missing", action="store_true", help="only variants the tuning file has no entry for, or entries timed under other sampling than tune.sampling (resume an interrupted run)")
    tu.add_argument("--direction", choices=("forward", "backward"), help="time only this kernel (after a change to it); the other keeps its entries")
    tu.add_argument("--size-class", action="append", metavar="NAME", help="time only this class of tune.size_classes, e.g. encoder (repeatable); the other classes keep their entries")
    tu.add_argument("--narrow", action="append", metavar="FIELD=V1,V2", help="time only these values of one of tune.candidates' fields, e.g. num_warps=4 (repeatable; the spec's default schedule is always timed)")
    tu.set_defaults(run=_tune)

    d = sub.add_parser("doctor", help="versions, and which of Triton interpreter, CUDA GPU, FlyDSL compile-only work")
    d.add_argument("--format", choices=("text", "json"), default="text")
    d.set_defaults(run=_doctor)

    sc = sub.add_parser("schema", help="print the JSON Schema of the spec format (or the spec reference, --format markdown)")
    sc.add_argument("--format", choices=("json", "markdown"), default="json", help="json (default) or markdown (docs/spec-reference.md)")
    sc.set_defaults(run=_schema)
    return p


def _configure(args) -> None:
    """args.root (found when not given) and args.config ([tool.kgen] of its pyproject.toml)."""
    from kgen.config import find_root, load_config

    if getattr(args, "run", None) in (_doctor, _schema):
        return
    if args.root is None:
        found = find_root(Path.cwd())
        args.root = Path(".") if found == Path.cwd().resolve() else found
    args.config = load_config(args.root)


def _spec_args(args) -> list[str] | None:
    """The named specs, or every *.yaml in the configured specs folder."""
    from kgen.errors import SpecError

    if getattr(args, "specs", None):
        return args.specs
    folder = args.config.specs
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise SpecError(str(folder), None, "", "no spec files (*.yaml) found")
    return [str(f) for f in files]


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of jobs, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected 0 (one per core) or more, got {n}")
    return n or (os.cpu_count() or 1)


def _doctor(args) -> int:
    from kgen.doctor import print_report, report

    data = report()
    if args.format == "json":
        print(json.dumps(data, indent=2))
    else:
        print_report(data)
    return 0 if data["ok"] else 1


def _tune(args) -> int:
    from kgen.tune import main  # imported when it runs: `kgen --help` stays fast

    return main(args)


def _schema(args) -> int:
    from kgen.schema import reference_markdown, schema_json

    sys.stdout.write(schema_json() if args.format == "json" else reference_markdown())
    return 0


def _device(choice: str) -> str:
    from kgen.verify.numerics import cuda_available

    if choice == "auto":
        return "cuda" if cuda_available() else "cpu"
    if choice == "cuda" and not cuda_available():
        raise KgenError("--device cuda: no CUDA GPU is available")
    return choice


def _print_numerics(results, say=print) -> bool:
    ok = True
    for r in results:
        say(f"  {'ok  ' if r.ok else 'FAIL'} {r.variant} [{r.device}]")
        for line in r.lines:
            say(f"       {line}")
        ok &= r.ok
    return ok


def _build(args) -> int:
    from kgen.emit import LOCK_NAME, exclusive, lock_text, plan_lock, read_lock, validated_before, write_atomic
    from kgen.generate import generate, load_all, project_path

    root = args.root
    specs = load_all(_spec_args(args), root)
    generated = args.config.generated
    outputs = {project_path(s, root): generate(s, root) for s in specs}  # everything in memory before anything is written

    # Validate every output the lock does not record as validated for its code: new or changed
    # code, and files a --no-validate build wrote. One that differs from generated/ only in its
    # header's spec hash (a sibling variant added to or dropped from the spec) keeps its record.
    lock_before = read_lock(generated)
    unchecked: dict[str, list] = {}
    header_only: dict[str, int] = {}
    for path, outs in outputs.items():
        for o in outs:
            on_disk = _read(generated / o.relpath)
            if not validated_before(o, on_disk, lock_before.get(o.relpath, {})):
                unchecked.setdefault(path, []).append(o)
            elif on_disk != o.text:
                header_only[path] = header_only.get(path, 0) + 1
    validated: list[str] = []
    if args.no_validate:
        if any(_read(generated / o.relpath) != o.text for outs in unchecked.values() for o in outs):
            print("kgen: WARNING: --no-validate: writing kernels that were NOT checked against their reference", file=sys.stderr)
    else:
        device = _device(args.device)
        for path, count in header_only.items():
            print(f"{count} variant(s) of {path} differ from {generated.name}/ only in their header's spec hash "
                  "(same code, same spec but for its variants): validated before, not again")
        with tempfile.TemporaryDirectory(prefix="kgen-build-") as tmp:
            work = {}
            for path, outs in unchecked.items():
                work[path] = {}
                for o in outs:
                    target = Path(tmp) / o.relpath
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(o.text)
                    work[path][o.variant] = target
                print(f"validating {len(outs)} variant(s) of {path} on {device}")
            results = _numerics(root, work, device, args.jobs, _Progress(enabled=not args.no_progress)) if work else {}
            failed = []
            for path, outs in unchecked.items():
                if not _print_numerics(results[path]):
                    failed += [r.variant for r in results[path] if not r.ok]
                validated += [o.relpath for o in outs]
            if failed:
                raise VerifyFailure(f"not written: {len(failed)} variant(s) failed validation: {', '.join(failed)}")

    with exclusive(generated):  # from reading the lock to writing it: concurrent builds serialize here
        old_lock = read_lock(generated)
        outputs = _with_isa(outputs, generated, old_lock, "lock" if args.no_compile else "changed", jobs=args.jobs)
        entries, stale = plan_lock(old_lock, [o for outs in outputs.values() for o in outs], list(outputs), validated)
        written = sum(write_atomic(generated / o.relpath, o.text) for outs in outputs.values() for o in outs)
        for relpath in stale:
            (generated / relpath).unlink(missing_ok=True)
            print(f"removed {generated / relpath} (no spec produces it any more)")
        write_atomic(generated / LOCK_NAME, lock_text(entries))
    total = sum(len(o) for o in outputs.values())
    print(f"kgen build: {total} variant(s) from {len(specs)} spec(s), {written} written, {total - written} unchanged")
    return 0


def _verify(args) -> int:
    as_json = args.format == "json"
    report: dict = {"ok": False, "exit_code": 2, "compile": None, "drift": None, "numerics": []}
    try:
        code = _verify_run(args, report, (lambda *a, **k: None) if as_json else print)
    except KgenError as err:
        if not as_json:
            raise
        report.update(exit_code=err.exit_code, error=str(err))
        print(json.dumps(report, indent=2))
        return err.exit_code
    if as_json:
        report.update(ok=code == 0, exit_code=code)
        print(json.dumps(report, indent=2))
    return code


def _verify_run(args, report: dict, say) -> int:
    """The verify tiers; `say` prints the text report (a no-op for --format json), `report`
    collects the same findings as data."""
    from kgen.emit import read_lock
    from kgen.generate import generate, load_all, project_path
    from kgen.verify.drift import drift_problems

    root = args.root
    specs = load_all(_spec_args(args), root)  # static tier: spec constraints and index proofs run here
    generated = args.config.generated
    outputs = {project_path(s, root): generate(s, root) for s in specs}
    failures = 0
    progress = _Progress(enabled=not getattr(args, "no_progress", False))
    if any(o.compile_arch for outs in outputs.values() for o in outs):
        lines: list[str] = []
        report["compile"] = {"ok": True, "mode": "lock" if args.no_compile else "compiled", "lines": lines}

        def log(line: str) -> None:
            lines.append(line)
            say(line)

        try:
            outputs = _with_isa(outputs, generated, read_lock(generated), "lock" if args.no_compile else "all",
                                jobs=args.jobs, log=log, progress=progress)
        except VerifyFailure as err:
            say(f"compile: {err}")
            report["compile"].update(ok=False, error=str(err))
            failures += 1

    problems = drift_problems(generated, [o for outs in outputs.values() for o in outs], list(outputs))
    report["drift"] = {"ok": not problems, "problems": list(problems)}
    say(f"drift: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    for line in problems:
        say(f"  {line}")
    if problems:
        failures += 1
        named = " ".join(args.specs)
        say(f"  fix: kgen build {named}".rstrip())

    if not args.no_numerics:
        device = _device(args.device)
        work = {}
        for path, outs in outputs.items():
            modules = {o.variant: generated / o.relpath for o in outs if (generated / o.relpath).exists()}
            if args.only:
                modules = {name: path for name, path in modules.items() if fnmatch.fnmatch(name, args.only)}
            if modules:
                work[path] = modules
        results = _numerics(root, work, device, args.jobs, progress)
        for path in work:
            say(f"numerics: {path} on {device} ({'Triton interpreter' if device == 'cpu' else 'GPU'})")
            report["numerics"].append({
                "spec": path, "device": device,
                "variants": [{"variant": r.variant, "device": r.device, "ok": r.ok, "lines": list(r.lines)} for r in results[path]],
            })
            if not _print_numerics(results[path], say):
                failures += 1
    if failures:
        raise VerifyFailure("verification failed")
    say("kgen verify: ok")
    return 0


class _Progress:
    """Progress of long runs on stderr: one line rewritten in place on a terminal, plain lines
    otherwise (logs, CI), nothing when disabled."""

    def __init__(self, enabled: bool = True, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()

    def start(self, label: str, total: int):
        import time

        self.label, self.total, self.done, self.t0 = label, total, 0, time.monotonic()
        self._show("started")

    def step(self, what: str, ok: bool = True):
        self.done += 1
        self._show(f"{'ok' if ok else 'FAIL'} {what}")
        if self.tty and self.done == self.total:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def _show(self, what: str):
        import time

        if not self.enabled:
            return
        text = f"kgen: {self.label} [{self.done}/{self.total}, {time.monotonic() - self.t0:.0f} s] {what}"
        if self.tty:
            self.stream.write("\r\033[K" + text[: shutil_columns() - 1])
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def shutil_columns() -> int:
    import shutil

    return shutil.get_terminal_size((100, 24)).columns


def _numerics(root: Path, work: dict, device: str, jobs: int, progress: _Progress | None = None) -> dict:
    """Run the numerics workers: with jobs > 1 each spec's variants are split into up to `jobs`
    chunks, one worker subprocess each, run at once by a thread pool. Results keep spec and
    variant order, so the report reads the same for every -j."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from kgen.verify.numerics import run_numerics

    units = []
    for path, modules in work.items():
        names = list(modules)
        n = max(1, min(jobs, len(names)))
        for k in range(n):
            units.append((path, {name: modules[name] for name in names[k::n]}))
    if progress:
        progress.start(f"numerics on {device}", sum(len(m) for _, m in units))
    by_variant = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_numerics, str(root / path), chunk, device): path for path, chunk in units}
        for fut in as_completed(futures):
            for r in fut.result():
                by_variant[(futures[fut], r.variant)] = r
                if progress:
                    progress.step(r.variant, r.ok)
    return {path: [by_variant[(path, name)] for name in modules] for path, modules in work.items()}


def _with_isa(outputs: dict, generated: Path, lock: dict, mode: str, jobs: int = 1, log=print, progress=None) -> dict:
    """Attach ISA counts to FlyDSL outputs. mode "all": compile every one (verify); "changed":
    compile those whose content differs from the lock's record (build); "lock": copy the lock's
    counts without compiling (--no-compile). Raises VerifyFailure when a variant does not compile
    or its assembly breaks a design rule. Compiles run `jobs` at a time (subprocesses)."""
    from concurrent.futures import ThreadPoolExecutor

    from kgen.verify.flydsl import compile_outputs

    flydsl = [o for outs in outputs.values() for o in outs if o.compile_arch]
    if not flydsl:
        return outputs
    if mode == "lock":
        print("kgen: --no-compile: FlyDSL ISA counts taken from the lock, not compiled", file=sys.stderr)
        recorded = lambda o: {k: v for k, v in lock.get(o.relpath, {}).get("isa", {}).items() if k != "arch"}  # noqa: E731
        return {p: [o.with_isa(recorded(o)) if o.compile_arch else o for o in outs] for p, outs in outputs.items()}
    log(f"compile: {len(flydsl)} FlyDSL variant(s) in compile-only mode")
    reuse = lock if mode == "changed" else None

    def one(out):
        lines: list[str] = []
        done, found = compile_outputs([out], generated, reuse, log=lines.append)
        if progress and out.compile_arch:
            progress.step(out.variant, not found)
        return done[0], found, lines

    if progress:
        progress.start("compile", len(flydsl))
    result, problems = {}, {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {path: [pool.submit(one, o) for o in outs] for path, outs in outputs.items()}
        for path, futs in futures.items():  # in order: the log reads the same for every -j
            result[path] = []
            for fut in futs:
                done, found, lines = fut.result()
                result[path].append(done)
                problems.update(found)
                for line in lines:
                    log(line)
    if problems:
        raise VerifyFailure(f"{len(problems)} FlyDSL variant(s) failed the compile tier: {', '.join(problems)}")
    return result


def _list(args) -> int:
    from kgen.ops import OPS

    from kgen.spec import load_specs

    # Names and axes only: the constraint and proof checks (seconds of sympy) are left to build,
    # verify and show.
    for spec in load_specs(_spec_args(args), check=False):
        for v in OPS[spec.op].variants(spec):
            axes = " ".join(f"{k}={val}" for k, val in v.values.items())
            print(f"{v.name:40s} {spec.path}  {axes}")
    return 0


def _show(args) -> int:
    from kgen.ops import OPS
    from kgen.generate import load_all

    for spec in load_all(_spec_args(args), args.root):
        op = OPS[spec.op]
        for v in op.variants(spec):
            if v.name == args.variant:
                plan = op.lower(spec, v)
                print(f"{v.name}  ({spec.path}, op {spec.op}, backends {', '.join(spec.backends)})")
                print("derived:")
                name_width = max(28, *(len(f.name) for f in plan.facts))
                for f in plan.facts:
                    print(f"  {f.name:{name_width}s} {f.value:24s} {f.why}".rstrip())
                if getattr(plan, "mapping", ()):
                    print("which lane loads which bytes:")
                    print("\n".join(f"  {line}" for line in plan.mapping))
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
