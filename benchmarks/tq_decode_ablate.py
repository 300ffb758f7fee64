"""What the TQ decode loop's nibble unpacking costs in time (issue 4's gap, measured).

Run from the project root on a CUDA machine:
  python benchmarks/tq_decode_ablate.py [--variant d128_qg8_bs16] [--configs 16x32768,...]
Offline, without a GPU (sm_90 SASS counts per form, with Triton's NVIDIA backend):
  python benchmarks/tq_decode_ablate.py --sass [--variant ...]

The bulk configs are bound by the integer ALU, and K's codebook lookup is most of the loop's
integer instructions (benchmarks/RESULTS.md, session 23). This times the shipped pipeline against
copies of the generated module whose inline-PTX unpacking is replaced by one byte permute per
output register:

  shipped   as generated
  k_cheap   K's lookup (12 instructions per 4 nibbles) cut to 2 per 4 nibbles
  kv_cheap  the same, and V's unpacking (5 per 4 nibbles) cut to 2 as well

The same registers go in and out, so the loads, the MMAs and the softmax are unchanged; the
values are garbage, so the outputs are only printed, not checked. If k_cheap is still above a
target, the lookup alone is not what keeps that target out of reach. Whole pipeline as
`tq_decode` runs it, cold L2, the forms interleaved over 3 rounds, median.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tq_decode import load, random_decode_inputs  # noqa: E402

from kgen.reference.tq import hadamard_rotation, lloyd_max_centroids  # noqa: E402

# sm_90 integer-pipe instructions counted by --sass (bitwise, permutes, shifts, integer adds,
# compares, selects, min/max, address arithmetic).
INTEGER_OPS = ("PRMT", "LOP3", "SHF", "IADD3", "ISETP", "SEL", "IMNMX", "LEA")


def cheap_asm(source: str, function: str) -> str:
    """source with the PTX of `function`'s inline asm replaced by one prmt per output register,
    each permuting the first two inputs (the two packed words), so outputs still depend on the loads."""
    at = source.index(f"def {function}(")
    start = source.index('asm="""', at) + len('asm="""')
    end = source.index('"""', start)
    outputs = source[end:source.index("pack=2", end)].count("=r")
    body = "".join(f"            prmt.b32 ${i}, ${outputs}, ${outputs + 1}, 0x{0x6240 + 0x1111 * (i % 2):04X};\n"
                   for i in range(outputs))
    return source[:start] + "\n            {\n" + body + "            }\n            " + source[end:]


def ablated_sources(source: str) -> dict[str, str]:
    k_cheap = cheap_asm(source, "_unpack_k_pairs")
    return {"shipped": source, "k_cheap": k_cheap, "kv_cheap": cheap_asm(k_cheap, "_unpack_v_words")}


def load_forms(name: str, folder: Path) -> dict:
    forms = {}
    for form, source in ablated_sources((ROOT / "generated" / "tq_decode" / f"{name}.py").read_text()).items():
        path = folder / f"{name}_{form}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        forms[form] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(forms[form])
    return forms


def sass_counts(name: str, forms: dict) -> None:
    """Per form: the bulk decode launch compiled for sm_90, its registers, spills and SASS counts."""
    sys.path.insert(0, str(ROOT / "tests"))
    import sm90_compile as sm90

    for form, module in forms.items():
        kernel, args, options = next(l for l in sm90.record_launches(module) if l[0].__name__ == f"{name}_kernel")
        compiled = sm90.compile_kernel(kernel, args, options)
        info = sm90.resource_usage(compiled, options)
        sass = sm90.cuobjdump(compiled, "-sass")
        ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
        integer = sum(op.split(".")[0] in INTEGER_OPS for op in ops)
        print(f"{form}: CHUNKS {options.get('CHUNKS')}, {info['registers']} registers, {info['stack']} B stack, "
              f"{len(ops)} SASS instructions in the kernel, {integer} of them {'/'.join(INTEGER_OPS)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="d128_qg8_bs16")
    parser.add_argument("--configs", default="1x1024,1x32768,16x8192,16x32768,64x32768")
    parser.add_argument("--sass", action="store_true", help="offline: sm_90 SASS counts per form, no timing")
    args = parser.parse_args()
    name = f"tq_decode_triton_{args.variant}"
    forms = load_forms(name, Path(tempfile.mkdtemp()))
    if args.sass:
        sass_counts(name, forms)
        return

    shipped = forms["shipped"]
    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    store = load(f"tq_store_d{shipped.HEAD_DIM}_bs{shipped.BS}")
    g = torch.Generator(device=dev).manual_seed(0)
    centroids, rotation = lloyd_max_centroids(shipped.HEAD_DIM).to(dev), hadamard_rotation(shipped.HEAD_DIM).to(dev)
    print(torch.cuda.get_device_name() if gpu else "cpu (interpreter: the PTX is not used, so the forms agree)",
          args.variant, flush=True)
    if gpu:
        from timing import cold_l2_us
    for num_seqs, ctx in (tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")):
        q, cache, table, seq_lens = random_decode_inputs(shipped, store, num_seqs, ctx, g, centroids, rotation)
        ref = shipped.tq_decode(q, cache, table, seq_lens, centroids, rotation).float()
        diffs = {form: (m.tq_decode(q, cache, table, seq_lens, centroids, rotation).float() - ref).abs().max().item()
                 for form, m in forms.items()}
        line = f"{num_seqs:3d} x {ctx:6d}: max |diff| vs shipped " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items())
        if gpu:
            times = {form: [] for form in forms}
            for _ in range(3):
                for form, m in forms.items():
                    times[form].append(cold_l2_us(lambda: m.tq_decode(q, cache, table, seq_lens, centroids, rotation)))
            line += "; us " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in times.items())
        print(line, flush=True)


if __name__ == "__main__":
    main()
