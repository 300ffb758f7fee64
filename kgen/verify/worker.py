"""Subprocess that runs generated kernels numerically (one per spec, so an abort stays contained).

Usage: python -m kgen.verify.worker SPEC DEVICE VARIANT=PATH ...
Prints one JSON object per variant on stdout. DEVICE is "cpu" (Triton interpreter) or "cuda".
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback


def main(argv: list[str]) -> int:
    spec_path, device, *items = argv
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton is imported
    from kgen.ops import OPS
    from kgen.spec import load_spec
    from kgen.spec.model import Variant
    from kgen.verify import msda, tq

    checks = {"msda_forward": msda.check, "tq_decode": tq.check}
    spec = load_spec(spec_path)
    variants = {v.name: v for v in OPS[spec.op].variants(spec)}
    for item in items:
        name, path = item.split("=", 1)
        record = {"variant": name, "device": device}
        try:
            module_spec = importlib.util.spec_from_file_location(f"kgen_verify_{name}", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
            record["cases"] = checks[spec.op](module, spec, variants.get(name) or Variant(name, {}), device)
            record["ok"] = all(c["ok"] for c in record["cases"])
        except Exception:  # report, don't crash: the parent prints it as a failed variant
            record["ok"] = False
            record["error"] = traceback.format_exc(limit=-3)
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
