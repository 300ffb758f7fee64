"""Each operator's own spec sections, declared field by field with what each field means.

The operator modules read these sections (`parse_options`); `kgen schema` and
docs/spec-reference.md are generated from the declarations here, and tests/test_schema.py checks
that every key an operator reads is declared here with the same check. Adding a field to an
operator means declaring it here too.
"""

from __future__ import annotations

from kgen.ops import msda, tq_decode
from kgen.spec import reader as r
from kgen.spec.reader import OPTIONAL, Either, Field, Items, Struct
from kgen.targets import AMD_TARGETS, NVIDIA_TARGETS
from kgen.tune import FIELD_CHECKS, FIELD_DEFAULTS, TUNE_FIELD

# ---- msda_forward ------------------------------------------------------------------------------

_TOLERANCE = Struct(
    {
        "atol": Field(r.number(0.0), "Absolute tolerance."),
        "rtol": Field(r.number(0.0), "Relative tolerance: an element passes when |out - ref| <= atol + rtol * |ref|."),
    }
)

# The decode output also answers for its error relative to its own size: long-context outputs
# are averages of many values, small enough for a badly rounded kernel to pass atol alone.
_TQ_TOLERANCE = Struct(
    {
        **_TOLERANCE.fields,
        "rel_rms": Field(
            r.number(0.0),
            "Per sequence, rms(out - ref) / rms(ref) over all its heads and elements must stay within this (sequences whose reference is all zero are skipped).",
            default=OPTIONAL,
        ),
    }
)

_MSDA_CASE = Struct(
    {
        "batch": Field(r.integer(0), "Batch size B."),
        "queries": Field(r.integer(0), "Queries Q."),
        "spatial_shapes": Field(
            r.list_of(r.list_of(r.integer(1, 2**20), 2, 2), min_len=1),
            "[height, width] of each feature level; S is their summed area.",
        ),
        "locations": Field(
            r.list_of(r.number(), min_len=2),
            "[low, high]: sampling locations are drawn uniformly from this range (outside [0, 1] samples fall "
            "partly or wholly outside the image and test the corner masks).",
            default=(-0.2, 1.2),
        ),
    }
)

MSDA = Struct(
    {
        "schedule": Field(
            Struct(
                {
                    "block_q": Field(r.power_of_two(8, 256), "Queries per program: the tile is (block_q, D rounded up to a power of two)."),
                    "num_warps": Field(r.power_of_two(1, 16), "Warps per program (Triton `num_warps`)."),
                    "num_stages": Field(r.integer(1, 8), "Triton software-pipelining stages.", default=1),
                    "point_loop": Field(
                        FIELD_CHECKS["point_loop"],
                        "The kernels' loop over sampling points: unrolled (`static_range`; a run-time loop anyway where "
                        "levels x points x tile values per thread would take LLVM minutes), or a run-time `tl.range` loop.",
                        default=FIELD_DEFAULTS["point_loop"],
                    ),
                    "corners": Field(
                        FIELD_CHECKS["corners"],
                        "How the forward adds a sample's four bilinear corners: one weighted sum (`summed`), or one fused "
                        "multiply-add each into the accumulator (`fused`; bf16 rows then widen to fp32 by inline PTX on NVIDIA).",
                        default=FIELD_DEFAULTS["corners"],
                    ),
                    "locations": Field(
                        FIELD_CHECKS["locations"],
                        "How the forward loads a sample's location: x and y as two (block_q,) loads (`separate`), or as one "
                        "(block_q, 2) load split in registers (`paired`; needs y right after x in sampling_locations' layout), or a "
                        "level's locations and weights of each query as 64-bit words, each value shifted out of its word "
                        "(`words`; 16- or 32-bit dtypes, an unrolled point loop, and runs of whole 8-byte-aligned words in "
                        "both layouts).",
                        default=FIELD_DEFAULTS["locations"],
                    ),
                    "target": Field(
                        r.one_of(*NVIDIA_TARGETS),
                        "The NVIDIA GPU the backward is planned for: grad_value is scattered with native atomic adds "
                        "in the input dtype where this target has them (kgen/targets.py), else into an fp32 buffer.",
                        default="sm_90",
                    ),
                    "grad_accumulation": Field(
                        msda.Accumulation(),
                        "How a 16-bit variant's grad_value scatter accumulates: `native` adds in the input dtype where "
                        "`target` has such atomics (fastest; each add rounds the running sum to 8 or 11 bits, so "
                        "pixels that thousands of samples hit lose precision), `fp32` always into an fp32 buffer, cast at the end; "
                        "or a mapping with one of the two per size class of `tune.size_classes`, e.g. `{decoder: native, encoder: fp32}`.",
                        default="native",
                    ),
                    "deterministic": Field(
                        r.boolean,
                        "Bitwise-reproducible grad_value: contributions are scaled to int64 fixed point and added "
                        "with integer atomics, whose sum does not depend on their order.",
                        default=False,
                    ),
                }
            ),
            "How the work is tiled and launched, kept apart from what is computed.",
        ),
        "masking": Field(
            Struct(
                {
                    "out_of_image": Field(
                        r.one_of("zeros"),
                        "What a bilinear corner outside its level's image contributes (grid_sample's padding_mode). "
                        "Ragged query tails and head-dim padding are derived from the dims, not declared.",
                    )
                }
            ),
            "Masking rules.",
        ),
        "validation": Field(
            Struct(
                {
                    "tolerances": Field(
                        Struct(rest=Field(_TOLERANCE, "Tolerance of one dtype."), rest_name="dtype"),
                        "Forward output against the float64 PyTorch reference, per dtype; every dtype of the "
                        "variants needs an entry.",
                    ),
                    "grad_tolerances": Field(
                        Struct(rest=Field(_TOLERANCE, "Tolerance of one dtype."), rest_name="dtype"),
                        "The backward's three gradients against float64 autograd, per dtype; every dtype of the "
                        "variants needs an entry.",
                    ),
                    "grad_cases": Field(Items(_MSDA_CASE), "Problems the gradients are checked on, on every device.", default=OPTIONAL),
                    "cpu_cases": Field(
                        Items(_MSDA_CASE, min_len=1),
                        "Problems the forward is checked on under the Triton interpreter (and on the GPU).",
                    ),
                    "gpu_cases": Field(Items(_MSDA_CASE), "Further, larger problems checked only on a CUDA GPU.", default=OPTIONAL),
                }
            ),
            "How `kgen build` and `kgen verify` check each variant against its PyTorch reference.",
        ),
        "tune": TUNE_FIELD,  # declared in kgen/tune.py, beside the parser
    }
)

# ---- tq_decode ---------------------------------------------------------------------------------

_AXES = Field(
    Struct(rest=Field(r.DimName(extra=("fields",)), "The axis's extent."), rest_name="axis"),
    "The region's axes, outermost first, each with its extent: a dim, or `fields` for the number of "
    "metadata fields. Byte strides follow from this order.",
)

_PACKED_REGION = Struct(
    {
        "axes": _AXES,
        "fields": Field(
            Struct(
                rest=Field(
                    Struct(
                        {
                            "bits": Field(r.one_of(4, 8), "Bits per element."),
                            "count": Field(r.DimName(), "Elements per record: a dim."),
                            "packing": Field(
                                r.one_of("low_first", "high_first"),
                                "For 4-bit fields: `low_first` puts element 2j in the low nibble of byte j.",
                                default="low_first",
                            ),
                        }
                    ),
                    "One bit-packed field of the record.",
                ),
                rest_name="field",
            ),
            "The record stored at every point of the axes: its bit-packed fields, in order.",
        ),
    },
    title="packed region",
)

_META_REGION = Struct(
    {
        "axes": _AXES,
        "dtype": Field(r.one_of(*tq_decode.META_DTYPE_BYTES), "Element type of every metadata scalar."),
        "fields": Field(r.list_of(r.name, min_len=1), "Names of the scalars stored per point (the `fields` axis)."),
    },
    title="metadata region",
)

TQ_DECODE = Struct(
    {
        "quant": Field(
            Struct(
                {
                    "key": Field(
                        Struct(
                            {
                                "bits": Field(r.one_of(4), "Bits per key index."),
                                "centroids": Field(r.integer(1, 1 << 16), "Codebook size: 2^bits."),
                                "codebook": Field(r.one_of("lloyd_max_gaussian"), "How the centroids are chosen."),
                                "rotation": Field(r.one_of("hadamard"), "The rotation applied to keys and queries before quantizing."),
                            }
                        ),
                        "Key quantization: rotate, normalize (the norm kept as metadata), then codebook indices.",
                    ),
                    "value": Field(
                        Struct(
                            {
                                "bits": Field(r.one_of(4), "Bits per value element."),
                                "scheme": Field(r.one_of("affine_min_max"), "Per-token scale and zero point from the min and max."),
                            }
                        ),
                        "Value quantization.",
                    ),
                }
            ),
            "How keys and values are quantized into the cache.",
        ),
        "cache": Field(
            Struct(
                {
                    "blocks": Field(r.DimName(), "The dim that counts cache blocks."),
                    "regions": Field(
                        Struct(rest=Field(Either((_PACKED_REGION, _META_REGION)), "One region of the block."), rest_name="region"),
                        "The regions of one cache block, in memory order. Block stride, field offsets and "
                        "tensor bases are derived from them for both backends.",
                    ),
                }
            ),
            "The byte layout of one paged cache block.",
        ),
        "schedule": Field(
            Struct(
                {
                    "target": Field(r.one_of(*AMD_TARGETS), "The AMD GPU the FlyDSL kernel is generated for (MFMA shapes, LDS size)."),
                    "waves_per_program": Field(r.one_of(1), "Waves per program: one 64-lane wave per (sequence, kv head, partition)."),
                    "max_partitions": Field(
                        r.power_of_two(1, 64),
                        "Most partitions a sequence is split into (split-K); the launcher picks a power of two up "
                        "to this and the declared max of P.",
                    ),
                }
            ),
            "How the work is split and launched.",
        ),
        "masking": Field(
            Struct(
                {
                    "tokens_past_seq_len": Field(r.one_of("minus_inf"), "Scores of tokens at or past seq_len."),
                    "unused_mfma_rows": Field(r.one_of("not_stored"), "Rows QG..15 of the 16-row MFMA tile."),
                    "block_table_past_seq": Field(
                        r.one_of("first_entry"),
                        "Which block a tile past the sequence's end reads: entry 0, never past the sequence.",
                    ),
                }
            ),
            "Masking rules (each has one supported value; stated so the spec says it).",
        ),
        "validation": Field(
            Struct(
                {
                    "tolerance": Field(_TQ_TOLERANCE, "Decode output against the PyTorch reference."),
                    "cases": Field(
                        Items(
                            Struct(
                                {
                                    "num_seqs": Field(r.integer(1, 64), "Sequences in the batch."),
                                    "kv_heads": Field(r.integer(1, 16), "KV heads Hk."),
                                    "seq_lens": Field(r.list_of(r.integer(0, 1 << 20), min_len=1), "Length of each sequence (num_seqs of them)."),
                                    "max_blocks": Field(r.integer(1, 4096), "Block-table width."),
                                }
                            )
                        ),
                        "Problems every variant is checked on.",
                        default=OPTIONAL,
                    ),
                }
            ),
            "How each variant is checked against its PyTorch reference.",
        ),
    }
)

SECTIONS = {"msda_forward": MSDA, "tq_decode": TQ_DECODE}
