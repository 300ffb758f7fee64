import sys, time, importlib.util
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
    print(f"{'ok  ' if not bad else 'FAIL'} {name}: {len(res)} checks, max abs {max(r['max_abs'] for r in res):.2e}, {time.time() - t:.1f} s", flush=True)
    for r in bad:
        print("   ", r["case"], r["detail"][:200], flush=True)
