"""The parts of the spec format every operator shares, declared field by field.

`kgen.spec.load_spec` reads these sections through these declarations, and `kgen schema` and
docs/spec-reference.md are generated from them. Each operator's own sections are declared in
`kgen.ops.formats`.
"""

from __future__ import annotations

from kgen.spec import reader as r
from kgen.spec.model import FLOAT_DTYPES
from kgen.spec.reader import OPTIONAL, Field, Items, Struct

MAX_DECLARED = 2**62  # real sizes stay far below this; larger declared maxima are almost surely typos


NAME = Field(r.name, "The spec's name: the folder of its output under generated/ and the prefix of its variant names.")
DOC = Field(r.text, "What the operator computes, in words, for the reader of the spec.", default="")


def op_field(ops: tuple[str, ...]) -> Field:
    return Field(r.one_of(*ops), "The operator family. It fixes the dims and tensors the spec must declare and the further sections it has.")


def backends_field(backends: tuple[str, ...]) -> Field:
    return Field(
        r.list_of(r.one_of(*backends), min_len=1),
        "The code generators to emit every variant for, in this order.",
    )


DIM = Struct(
    {
        "value": Field(
            r.integer(1, MAX_DECLARED),
            "A compile-time constant. Leave it out to make the dim a variant axis (`variants.axes`).",
            default=None,
        ),
        "max": Field(
            r.integer(1, MAX_DECLARED),
            "Makes the dim a run-time size, with this declared maximum: the int32/int64 decision for every "
            "address expression is proven over the declared maxima. Not together with `value`.",
            default=None,
        ),
        "multiple_of": Field(
            r.integer(1, MAX_DECLARED),
            "Run-time sizes only: what the caller guarantees the size is a multiple of (a tail mask is "
            "dropped when it is a multiple of the tile).",
            default=1,
        ),
        "doc": Field(r.text, "What the size counts; shown by `kgen show` and in generated headers.", default=""),
    }
)

DIMS = Field(
    Struct(rest=Field(DIM, "One named size."), rest_name="dim", keys=r.name),
    "Named sizes, each a compile-time constant (`value`, or a variant axis) or a run-time size (`max`). "
    "Tensor shapes, address expressions and proofs are stated over these names.",
)

AXES = Struct(
    {
        "dtype": Field(
            r.list_of(r.one_of(*FLOAT_DTYPES), min_len=1),
            "The element types to emit; tensors whose `dtype` is `dtype` take each in turn.",
            default=OPTIONAL,
        )
    },
    rest=Field(r.list_of(r.integer(1, MAX_DECLARED), min_len=1), "The values of a compile-time dim that has no `value`."),
    rest_name="dim",
)

SHAPE_VALUE = Field(r.integer(1, MAX_DECLARED), "The dim's value in this shape.")

VARIANTS = Field(
    Struct(
        {
            "axes": Field(
                AXES,
                "The axes whose product gives the kernels to emit, in declared order (it is the order of the "
                "parts of a variant's name). Values must not repeat.",
            ),
            "shapes": Field(
                Items(Struct(rest=SHAPE_VALUE, rest_name="dim")),
                "Listed combinations of compile-time dims (not axes), such as model shapes: every point of "
                "the axes is emitted once per shape. Every shape names the same dims.",
                default=OPTIONAL,
            ),
            "exclude": Field(
                Items(Struct(rest=Field(r.AxisValue(), "An axis and one of its values."), rest_name="axis")),
                "Points of the product not to emit: a variant is left out when it matches every axis value "
                "of one entry.",
                default=OPTIONAL,
            ),
        }
    ),
    "Which kernels the spec produces.",
)

TENSOR = Struct(
    {
        "shape": Field(r.list_of(r.ShapeItem(), min_len=1), "Logical shape, outermost first."),
        "dtype": Field(r.ElementType(), "Element type, or `dtype` for the variant axis of that name."),
        "layout": Field(
            r.list_of(r.ShapeItem()),
            "Memory order: the shape's entries from outermost to innermost in memory (a permutation of "
            "`shape`). Strides are derived from it, never written.",
            default=None,
        ),
        "role": Field(
            r.one_of("input", "output", "scratch"),
            "`scratch`: allocated by the launcher between the kernels it runs.",
            default="input",
        ),
    }
)

TENSORS = Field(
    Struct(rest=Field(TENSOR, "One tensor argument or buffer."), rest_name="tensor"),
    "The tensors the kernels address, by name; the operator fixes which names and shapes it needs.",
)

COMMON_AFTER_HEAD = {"dims": DIMS, "variants": VARIANTS, "tensors": TENSORS}


def spec_struct(op: str, backends: tuple[str, ...], sections: Struct) -> Struct:
    """The whole format of one operator's specs: the shared fields, then the operator's sections."""
    head = {"name": NAME, "op": op_field((op,)), "backends": backends_field(backends), "doc": DOC}
    return Struct({**head, **COMMON_AFTER_HEAD, **sections.fields})
