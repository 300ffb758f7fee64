"""GPU validation of named MSDA variants without the drift stage (for short device sessions):
`python benchmarks/msda_gpu_subset.py VARIANT...`, one line per variant as it finishes.
`kgen verify --device cuda --only GLOB` is the full check."""

import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, ".")
from kgen.ops import OPS  # noqa: E402
from kgen.spec import load_spec  # noqa: E402
from kgen.verify import msda as vm  # noqa: E402

spec = load_spec(Path("specs/msda.yaml"))
variants = {v.name: v for v in OPS[spec.op].variants(spec)}
for name in sys.argv[1:]:
    t = time.time()
    path = Path("generated/msda") / f"{name}.py"
    s = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(s)
    s.loader.exec_module(m)
    res = vm.check(m, spec, variants[name], "cuda")
    bad = [r for r in res if not r["ok"]]
    print(f"{'ok  ' if not bad else 'FAIL'} {name}: {len(res)} checks (forward and the three gradients), "
          f"{time.time() - t:.1f} s", flush=True)
    for r in bad:
        print("   ", r["case"], {k: r.get(k) for k in ("max_abs", "max_rel", "worst", "detail")}, flush=True)
        if r.get("worst") is not None:
            print("    tolerance", spec.options.tolerances[variants[name].values["dtype"]],
                  spec.options.grad_tolerances[variants[name].values["dtype"]], flush=True)
