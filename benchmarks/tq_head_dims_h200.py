"""TQ Triton variants on a CUDA GPU: numerics (kgen.verify.tq's H200 matrix), registers and
spills of each compiled kernel, and a short timing per head_dim. From the project root:
`python benchmarks/tq_head_dims_h200.py [GLOB ...]` (results: benchmarks/tq_head_dims_h200.log)."""
import fnmatch
import importlib.util
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402
import triton  # noqa: E402

from kgen.ops import tq_decode  # noqa: E402
from kgen.spec import load_spec  # noqa: E402
from kgen.verify import tq as vt  # noqa: E402

print("device", torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
spec = load_spec("specs/tq_decode.yaml")
globs = sys.argv[1:] or ["*"]
mods = {}
for v in tq_decode.variants(spec):
    if v.values["backend"] != "triton" or not any(fnmatch.fnmatch(v.name, g) for g in globs):
        continue
    sp = importlib.util.spec_from_file_location(v.name, f"generated/tq_decode/{v.name}.py")
    mod = importlib.util.module_from_spec(sp)
    sp.loader.exec_module(mod)
    mods[v.name] = mod
    t = time.time()
    res = vt.check(mod, spec, v, "cuda")
    bad = [r for r in res if not r["ok"]]
    worst = max(r["max_abs"] for r in res)
    print(f"{'ok  ' if not bad else 'FAIL'} {v.name}: {len(res)} checks, max abs {worst:.3g}, {time.time() - t:.1f} s", flush=True)
    for r in bad:
        print("     FAIL", r["case"], r["max_abs"], r["detail"], flush=True)
    for name in dir(mod):
        fn = getattr(mod, name)
        if not isinstance(fn, triton.runtime.jit.JITFunction):
            continue
        for entry in getattr(fn, "device_caches", {}).values():
            cache = entry[0] if isinstance(entry, tuple) else entry
            for k in cache.values():
                print(f"     {name}: regs {getattr(k, 'n_regs', '?')}, spills {getattr(k, 'n_spills', '?')}, smem {k.metadata.shared}", flush=True)

# timing: 16 sequences x 8192 tokens, Hk=8, per head_dim (QG 4, BS 16)
for d in (64, 128, 256):
    name = f"tq_decode_triton_d{d}_qg4_bs16"
    if name not in mods:
        continue
    mod = mods[name]
    case = vt.DecodeCase("bench", 16, 8, (8192,) * 16, None)
    inp = vt.make_decode_inputs(case, mod.QG, mod.BS, d, "cuda", seed=7)
    ms = triton.testing.do_bench(lambda: mod.tq_decode(**inp), warmup=25, rep=100)
    cache_bytes = inp["kv_cache"].numel()
    print(f"bench {name}: 16 x 8192 tokens, Hk=8: {ms * 1e3:.0f} us (do_bench median), cache {cache_bytes / 1e6:.0f} MB", flush=True)
