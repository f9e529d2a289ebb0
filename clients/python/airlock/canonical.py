"""The JSON Canonicalization Scheme (RFC 8785) and the hashes airlock compares.

airlock hashes a claim's payload as SHA-256 (lowercase hex) of its canonical form, and
compares an agent's input hashes on every plan of an effect id; :func:`hash_input`
computes the same value from a Python value, so a client can send ``payload_hash`` or
``input_hash`` itself. The rules that make this differ from ``json.dumps(sort_keys=True)``:

* object keys are sorted by their UTF-16 code units, not by code points (they differ for
  characters outside the Basic Multilingual Plane against U+E000–U+FFFF);
* every number is an IEEE 754 double printed as ECMAScript does (``1.0`` is ``1``,
  ``1e21`` is ``1e+21``, ``2**53 + 1`` is ``9007199254740992``, ``-0.0`` is ``0``);
* strings are UTF-8 with only ``"``, ``\\`` and control characters escaped.
"""

import hashlib
import json
import math
from decimal import Decimal
from typing import Any

__all__ = ["canonical_json", "hash_input", "number_to_json"]


def number_to_json(x: float) -> str:
    """ECMAScript's Number.prototype.toString of the double x (RFC 8785 section 3.2.2.3)."""
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"canonical JSON has no representation for {x!r}")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    # repr is the shortest string that reads back as x, as ECMAScript's digits are.
    t = Decimal(repr(abs(x))).as_tuple()
    digits = "".join(str(d) for d in t.digits).rstrip("0")
    exp = int(t.exponent) + (len(t.digits) - len(digits))
    k = len(digits)
    n = k + exp  # the value is 0.digits × 10^n
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mant = digits if k == 1 else digits[0] + "." + digits[1:]
        out = mant + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + out


def _utf16_key(s: str) -> bytes:
    # Big-endian UTF-16 bytes compare as the code units do.
    return s.encode("utf-16-be", "surrogatepass")


def _write(v: Any, out: list) -> None:
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, str):
        out.append(json.dumps(v, ensure_ascii=False))
    elif isinstance(v, int):
        out.append(number_to_json(float(v)))
    elif isinstance(v, float):
        out.append(number_to_json(v))
    elif isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise TypeError(f"canonical JSON: object keys must be strings, not {type(k).__name__}")
        out.append("{")
        for i, k in enumerate(sorted(v, key=_utf16_key)):
            if i:
                out.append(",")
            out.append(json.dumps(k, ensure_ascii=False))
            out.append(":")
            _write(v[k], out)
        out.append("}")
    elif isinstance(v, (list, tuple)):
        out.append("[")
        for i, item in enumerate(v):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise TypeError(f"canonical JSON: cannot encode {type(v).__name__}")


def canonical_json(v: Any) -> bytes:
    """v (dicts, lists, tuples, str, int, float, bool, None) in canonical form, UTF-8."""
    out: list = []
    _write(v, out)
    return "".join(out).encode("utf-8")


def hash_input(v: Any) -> str:
    """SHA-256, lowercase hex, of v's canonical JSON: airlock's payload hash of v.

    Give it to :meth:`airlock.Client.plan` as the effect's input hash. Hash only what
    defines the effect (a document's title and body, a message's recipient and text),
    never a timestamp or a random id: a different hash for the same effect id stops the
    run (input_mismatch).
    """
    return hashlib.sha256(canonical_json(v)).hexdigest()
