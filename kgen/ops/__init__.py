"""Operator families. Each module lowers a Spec to per-variant plans its templates render.

An operator module provides:
  backends                      backends it can generate for
  parse_options(root, dims, axes)  its own spec sections (schedule, masking, validation)
  check_spec(spec, root)        the contract its semantics impose on dims and tensors
  variants(spec)                the Variant list (readable names)
  lower(spec, variant)          a plan: plain data with every number and printed expression
  template_for(variant)         the template that renders a variant's plan
"""

from __future__ import annotations

from kgen.ops import msda, tq_decode

OPS = {"msda_forward": msda, "tq_decode": tq_decode}
