"""The spec format's JSON Schema (`kgen schema`) and reference (docs/spec-reference.md): generated
from the field declarations, valid, current, accepting every shipped spec, rejecting what kgen
rejects, and declaring every key the parsers read with the check they read it with."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

jsonschema = pytest.importorskip("jsonschema")

from conftest import ROOT, run_kgen  # noqa: E402
from kgen.errors import SpecError  # noqa: E402
from kgen.schema import reference_markdown, spec_schema  # noqa: E402
from kgen.spec import format as F  # noqa: E402
from kgen.spec import load_spec  # noqa: E402
from kgen.spec import reader as r  # noqa: E402

SPECS = sorted((ROOT / "specs").glob("*.yaml"))  # whatever specs/ holds when the tests run
REFERENCE = ROOT / "docs" / "spec-reference.md"


@pytest.fixture(scope="module")
def validator():
    schema = spec_schema()
    jsonschema.Draft202012Validator.check_schema(schema)  # a valid draft 2020-12 schema
    return jsonschema.Draft202012Validator(schema)


def _errors(validator, data) -> list[str]:
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in validator.iter_errors(data))


def test_specs_exist():
    assert SPECS, "no specs/*.yaml"


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_shipped_spec_validates_against_the_schema(validator, path):
    assert _errors(validator, yaml.safe_load(path.read_text())) == [], path.name


def _mutations(data: dict):
    """Edits kgen refuses, each as (what, edited spec), for any spec whatever its operator."""
    def edit(what, change):
        copied = copy.deepcopy(data)
        change(copied)
        return what, copied

    first_dim, first_tensor = next(iter(data["dims"])), next(iter(data["tensors"]))
    first_section = next(k for k in data if k not in F.COMMON_AFTER_HEAD and k not in ("name", "op", "backends", "doc"))
    yield edit("unknown top-level key", lambda d: d.update(bogus=1))
    yield edit("unknown key in a tensor", lambda d: d["tensors"][first_tensor].update(strides=[1]))
    yield edit(f"unknown key in {first_section}", lambda d: d[first_section].update(bogus=1))
    yield edit("missing tensors", lambda d: d.pop("tensors"))
    yield edit("op not an operator", lambda d: d.update(op="conv2d"))
    yield edit("name not a name", lambda d: d.update(name="my spec"))
    yield edit("backend not the operator's", lambda d: d.update(backends=["cuda"]))
    yield edit("dim max of 0", lambda d: d["dims"].update({first_dim: {"max": 0}}))
    yield edit("tensor role unknown", lambda d: d["tensors"][first_tensor].update(role="inout"))
    yield edit("shape item 0", lambda d: d["tensors"][first_tensor].update(shape=[0]))


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_schema_rejects_what_kgen_rejects(validator, path, tmp_path):
    for what, data in _mutations(yaml.safe_load(path.read_text())):
        edited = tmp_path / path.name
        edited.write_text(yaml.safe_dump(data, sort_keys=False))
        with pytest.raises(SpecError):
            load_spec(edited, check=False)
        assert _errors(validator, data), f"{path.name}, {what}: kgen refuses it, the schema accepts it"


def _path_tokens(path: str) -> list[str]:
    return re.findall(r"\[\d+\]|[^.\[\]]+", path)


def _declared(node, tokens: list[str]) -> list:
    """The declared Fields at the path `tokens` below `node` (one per Either form that has it)."""
    if isinstance(node, r.Either):
        return [f for form in node.forms for f in _declared(form, tokens)]
    token, rest = tokens[0], tokens[1:]
    if token.startswith("["):  # an item of a list of mappings
        if not isinstance(node, r.Items):
            return []
        return _declared(node.item, rest) if rest else [node]
    if not isinstance(node, r.Struct):
        return []
    f = node.fields.get(token) or node.rest
    if f is None:
        return []
    return _declared(f.node, rest) if rest else [f]


def _described(check) -> bool:
    """A validator whose schema says all it checks (not a plain function, nor a list of them)."""
    if isinstance(check, r.ListOf):
        return _described(check.item)
    return isinstance(check, r.Check)


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_key_the_parsers_read_is_declared_with_its_check(path, monkeypatch):
    """Records every key kgen's parsers (the shared reader and the operator's parse_options) read
    while loading a shipped spec, then looks each up in the declarations the schema comes from."""
    from kgen.ops import OPS
    from kgen.ops.formats import SECTIONS

    reads = []  # (dotted field, the check it was read with, or None for a section or a name)
    get, section, items_of, entries = r.Section.get, r.Section.section, r.Section.items_of, r.Section.entries

    def record_get(self, key, check, *args, **kwargs):
        reads.append((self.child_field(key), check))
        return get(self, key, check, *args, **kwargs)

    def record(method):
        def wrapper(self, key, *args, **kwargs):
            reads.append((self.child_field(key), None))
            return method(self, key, *args, **kwargs)
        return wrapper

    def record_entries(self):
        for key, value, line in entries(self):
            reads.append((self.child_field(key), None))
            yield key, value, line

    monkeypatch.setattr(r.Section, "get", record_get)
    monkeypatch.setattr(r.Section, "section", record(section))
    monkeypatch.setattr(r.Section, "items_of", record(items_of))
    monkeypatch.setattr(r.Section, "entries", record_entries)
    spec = load_spec(path, check=False)
    monkeypatch.undo()

    per_op = F.spec_struct(spec.op, OPS[spec.op].backends, SECTIONS[spec.op])
    declaration = r.Struct({**per_op.fields, "op": F.op_field(tuple(sorted(OPS)))})  # the parser reads any op
    problems = []
    for field, check in reads:
        found = _declared(declaration, _path_tokens(field))
        if not found:
            problems.append(f"{field}: read by kgen, not declared (kgen/spec/format.py or kgen/ops/formats.py)")
            continue
        if isinstance(check, r.Field):
            check = check.node
        if not _described(check):
            continue
        fields = [f for f in found if isinstance(f, r.Field)]
        comparable = [f for f in fields if isinstance(f.node, r.Check) and not f.node.spec_dependent]
        if comparable and all(f.node.schema() != check.schema() for f in comparable):
            problems.append(f"{field}: read as {check.words}, declared as {comparable[0].node.words}")
    problems = dict.fromkeys(re.sub(r"\[\d+\]", "[]", p) for p in problems)
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


def _leaves(data: dict, struct, path=()):
    """(path, declared Field) of every scalar or list value of a spec, found by walking the data
    along its declaration; values whose check depends on the spec (dim names) are skipped."""
    for key, value in data.items():
        f = struct.fields.get(key) or struct.rest
        node = f.node if f else None
        if isinstance(node, r.Either):  # the form that declares every key present
            node = next((form for form in node.forms if all(k in form.fields for k in value)), None)
        if isinstance(node, r.Struct) and isinstance(value, dict):
            yield from _leaves(value, node, path + (key,))
        elif isinstance(node, r.Items) and isinstance(value, list):
            for i, item in enumerate(value):
                yield from _leaves(item, node.item, path + (key, i))
        elif isinstance(node, r.Check) and not node.spec_dependent:
            yield path + (key,), f


def _edges(check, current) -> list:
    """Values at and just past the edges of what `check` accepts, and of the wrong kind."""
    if isinstance(check, r.Integer):
        bounds = [b for b in (check.lo, check.hi) if b is not None]
        return [*bounds, *(b + d for b, d in zip(bounds, (-1, 1))), True, "1"]
    if isinstance(check, r.PowerOfTwo):
        return [check.lo, check.hi, check.lo // 2, check.hi * 2, 3 * check.lo]
    if isinstance(check, r.Number):
        return [0, -1, "1e-5", ".5", "x", True]
    if isinstance(check, r.OneOf):
        return [*check.choices, "nope", True]
    if isinstance(check, (r.Text, r.Name)):
        return ["ñandú", "a b", "1a", "", 1]
    if isinstance(check, r.Boolean):
        return ["true", 1]
    if isinstance(check, r.ListOf):
        current = list(current) if isinstance(current, list) else []
        lists = [[], current + current[:1], "x"]
        if current:
            lists += [[e] + current[1:] for e in _edges(check.item, current[0])]
        return lists
    return []


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_schema_is_never_stricter_than_kgen_at_the_edges(validator, path, tmp_path):
    """For every field of a shipped spec, values at and just past the edges of its declared check:
    whatever kgen loads must validate (the schema may be looser: it leaves out rules that relate
    fields). Catches a declaration that disagrees with the check the parser really applies."""
    from kgen.ops import OPS
    from kgen.ops.formats import SECTIONS

    data = yaml.safe_load(path.read_text())
    declaration = F.spec_struct(data["op"], OPS[data["op"]].backends, SECTIONS[data["op"]])
    stricter, refused, seen = [], 0, set()
    for where, f in _leaves(data, declaration):
        if repr(f.node) in seen:  # one field per distinct check (e.g. one tolerance, one dim)
            continue
        seen.add(repr(f.node))
        parent = functools.reduce(lambda d, k: d[k], where[:-1], data)
        for value in _edges(f.node, parent[where[-1]]):
            edited = copy.deepcopy(data)
            functools.reduce(lambda d, k: d[k], where[:-1], edited)[where[-1]] = value
            target = tmp_path / path.name
            target.write_text(yaml.safe_dump(edited, sort_keys=False, allow_unicode=True))
            try:
                load_spec(target, check=False)
            except SpecError:
                refused += 1
                continue
            if _errors(validator, edited):
                stricter.append(f"{'.'.join(map(str, where))} = {value!r}: kgen loads it, the schema refuses it")
    assert refused, "no edge value was refused: the edges are not edges"
    assert not stricter, "\n".join(stricter)


def test_reference_doc_is_current():
    expected = reference_markdown()
    actual = REFERENCE.read_text(encoding="utf-8") if REFERENCE.exists() else ""
    assert actual == expected, "docs/spec-reference.md is stale: run `kgen schema --format markdown > docs/spec-reference.md`"


def test_reference_lists_every_declared_field():
    text = reference_markdown()
    for key in ("`dims.<dim>.max`", "`variants.axes.dtype`", "`tensors.<tensor>.layout`", "`schedule.block_q`",
                "`cache.regions.<region>.fields.<field>.bits`", "`validation.cases[].seq_lens`"):
        assert key in text, key
    assert "## `op: msda_forward`" in text and "## `op: tq_decode`" in text


def test_cli_prints_the_same_schema_and_reference_anywhere_deterministically(tmp_path):
    """`kgen schema` needs no project (run from an empty folder) and prints the same bytes for any
    hash seed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    outputs = []
    for seed in ("0", "1234"):
        proc = subprocess.run([sys.executable, "-m", "kgen", "schema"], cwd=tmp_path, capture_output=True, text=True,
                              env=dict(env, PYTHONHASHSEED=seed))
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0]) == spec_schema()
    proc = run_kgen("schema", "--format", "markdown", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == reference_markdown(), proc.stderr


def test_validator_words_and_schema_agree_with_the_check():
    """Spot checks that a validator's schema accepts what its check accepts and refuses the rest."""
    cases = [
        (r.integer(1, 8), [1, 8], [0, 9, True, "3"]),
        (r.power_of_two(8, 256), [8, 256], [4, 24, 512]),
        (r.number(0.0), [0, 1.5, "1e-5"], [-1, "x", True]),
        (r.one_of("zeros"), ["zeros"], ["ones", 0]),
        (r.list_of(r.integer(1, 2), 2, 2), [[1, 2]], [[1], [1, 2, 1], [0, 1]]),
        (r.name, ["a_1", "ñ"], ["1a", "a b", ""]),
        (r.ShapeItem(("B", "Q")), ["B", "B*Q", 3], [0, "B+Q", True]),
    ]
    for check, good, bad in cases:
        v = jsonschema.Draft202012Validator(check.schema())
        for value in good:
            check(value)
            assert v.is_valid(value), (check, value)
        for value in bad:
            with pytest.raises(r.Invalid):
                check(value)
            assert not v.is_valid(value), (check, value)
    assert r.integer(1, 2**62).words == "integer, 1 to 2^62"
    assert r.list_of(r.one_of("a", "b"), min_len=1).words == "list (at least 1) of: `a` or `b`"
