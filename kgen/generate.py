"""Spec → outputs in memory: lower each variant, render its template, prepend the header."""

from __future__ import annotations

from pathlib import Path

from kgen.emit import Output, header, spec_sha256, validation_sha256
from kgen.ops import OPS
from kgen.render import render, template_closure, templates_dir, templates_sha256
from kgen.spec import Spec, load_specs


def width_proofs(plan) -> list[str]:
    """Header lines recording each address expression's int width and its proven bound."""
    maxima = ", ".join(f"{n} <= {m}" for n, m, _ in plan.runtime_dims)
    lines = [f"Index widths, proven at the declared maxima ({maxima}):"]
    lines += [f"  {w.name}: {w.reason}" for w in plan.widths]
    return lines


def project_path(spec: Spec, root: Path) -> str:
    """The spec's path relative to the project root: what headers and the lock record, so the
    output does not depend on the directory kgen was started from."""
    try:
        return Path(spec.path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return Path(spec.path).name


def generate(spec: Spec, root: Path = Path(".")) -> list[Output]:
    op = OPS[spec.op]
    source_path = project_path(spec, root)
    spec_sha = spec_sha256(spec.normalized)
    directory = templates_dir(root)
    outputs = []
    for variant in op.variants(spec):
        # A variant's header hashes exactly the templates it is rendered from (includes too).
        tmpl_sha = templates_sha256(template_closure(op.template_for(variant), directory), directory)
        plan = op.lower(spec, variant)
        source = render(op.template_for(variant), {"p": plan}, f"{spec.path}, variant {variant.name}", directory)
        backend = getattr(plan, "backend", None) or spec.backends[0]
        extra = list(getattr(plan, "header_lines", ()))  # e.g. the hash of a tuning file the plan read
        proofs = extra + width_proofs(plan)
        text = header(source_path, variant.name, backend, spec_sha, tmpl_sha, proofs) + "\n" + source
        unhashed = header(source_path, variant.name, backend, "", tmpl_sha, proofs) + "\n" + source
        flydsl = getattr(plan, "backend", None) == "flydsl"
        outputs.append(
            Output(
                f"{spec.name}/{variant.name}.py", text, source_path, variant.name, spec_sha, tmpl_sha,
                validation_sha256(spec.normalized, unhashed),
                compile_arch=spec.options.target.arch if flydsl else None,
                planned_lds=plan.consts.get("LDS_BYTES", 0) if flydsl else 0,
            )
        )
    return outputs


def find_specs(root: Path) -> list[Path]:
    return sorted((root / "specs").glob("*.yaml"))


def load_all(paths: list[str] | None, root: Path, *, check: bool = True) -> list[Spec]:
    """The named specs, or every spec under specs/; duplicate spec names are an error. check=False
    skips the operators' checks (load_spec)."""
    from kgen.errors import SpecError

    files = [Path(p) for p in paths] if paths else find_specs(root)
    if not files:
        raise SpecError(str(root / "specs"), None, "", "no spec files (*.yaml) found")
    return load_specs(files, check=check)

