"""GPU validation of named TQ variants without the drift stage (for short device sessions):
`python benchmarks/tq_gpu_subset.py VARIANT...`, one line per variant as it finishes, with the
largest per-sequence relative rms error. `kgen verify --device cuda --only GLOB` is the full check."""

import importlib.util, re, sys, time
from pathlib import Path
sys.path.insert(0, ".")
from kgen.spec import load_spec
from kgen.ops import OPS
from kgen.verify import tq as vt
spec = load_spec(Path("specs/tq_decode.yaml"))
variants = {v.name: v for v in OPS[spec.op].variants(spec)}
for name in sys.argv[1:]:
    t = time.time()
    path = Path("generated/tq_decode") / f"{name}.py"
    s = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(s); s.loader.exec_module(m)
    res = vt.check(m, spec, variants[name], "cuda")
    bad = [r for r in res if not r["ok"]]
    rel = max((float(x) for r in res for x in re.findall(r"relative rms error (\S+)", r["detail"])), default=0.0)
    print(f"{'ok  ' if not bad else 'FAIL'} {name}: {len(res)} checks, max abs {max(r['max_abs'] for r in res):.2e}, "
          f"max relative rms {rel:.2e}, {time.time() - t:.1f} s", flush=True)
    for r in bad:
        print("   ", r["case"], r["detail"][:200], flush=True)
