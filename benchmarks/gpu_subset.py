"""GPU validation of named variants without the drift stage, for short device sessions:
`python benchmarks/gpu_subset.py SPEC VARIANT...` runs kgen's own numerics worker on the GPU and
prints one line per variant as it finishes (failing cases in full, and what passing checks
with no error size found, such as gradcheck), with the largest max abs error and, for TQ
decode, the largest per-sequence relative rms error. Several of these can run side by side on
disjoint variant lists. `kgen verify --device cuda --only GLOB` is the full check."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

spec_path, names = sys.argv[1], sys.argv[2:]
folder = Path("generated") / Path(spec_path).stem
items = [f"{name}={folder / name}.py" for name in names]
worker = subprocess.Popen([sys.executable, "-m", "kgen.verify.worker", spec_path, "cuda", *items],
                          stdout=subprocess.PIPE, text=True)
start = time.time()
for line in worker.stdout:
    record = json.loads(line)
    cases = record.get("cases", [])
    max_abs = max((c.get("max_abs", 0.0) for c in cases), default=0.0)
    # Only TQ decode's checks report a relative rms error; MSDA's line leaves it out.
    rel = [float(x) for c in cases for x in re.findall(r"relative rms error (\S+)", c.get("detail", ""))]
    rms = f"max relative rms {max(rel):.2e}, " if rel else ""
    print(f"{'ok  ' if record['ok'] else 'FAIL'} {record['variant']}: {len(cases)} checks, max abs {max_abs:.2e}, "
          f"{rms}{time.time() - start:.1f} s since start", flush=True)
    for c in cases:
        if not c["ok"]:
            print("   ", c["case"], {k: c.get(k) for k in ("max_abs", "max_rel", "worst", "detail")}, flush=True)
        elif c.get("max_abs") is None:  # a passing check with no error size (gradcheck) says what it found
            print("    ok", c["case"], c.get("detail", ""), flush=True)
    if "error" in record:
        print("   ", record["error"], flush=True)
sys.exit(worker.wait())
