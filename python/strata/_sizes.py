"""Sizes as the CLI reads them: a number with an optional K, M, G or T suffix (binary units)."""
import re

from ._strata import Error

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(name, value):
    """`value` (an int, or text like "64M", "1.5G", "unlimited") as bytes; 0 = unlimited."""
    if isinstance(value, bool):
        raise Error(f"{name}={value!r} is not a size; give bytes or text like \"64M\"")
    if value is None or value == "unlimited":
        return 0
    if isinstance(value, int):
        if value < 0:
            raise Error(f"{name}={value} is negative; give a size like \"64M\"")
        return value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([KMGTkmgt]?)(?:i?[Bb])?\s*",
                     str(value))
    if not m:
        raise Error(f"{name}={value!r} is not a size; use a number with an optional K, M, G or "
                    "T suffix (binary units), e.g. 4096, 512K, 64M, 1.5G")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()] + 0.5)
