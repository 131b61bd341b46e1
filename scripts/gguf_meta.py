"""Minimal GGUF metadata reader for the golden-generating scripts (metadata only,
no tensors). Kept in the repo so the scripts need no extra package."""
import struct

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}


def _read(f, fmt):
    n = struct.calcsize(fmt)
    return struct.unpack(fmt, f.read(n))[0]


def _read_str(f):
    n = _read(f, "<Q")
    return f.read(n).decode("utf-8", errors="surrogateescape")


def _read_value(f, vtype):
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == 8:
        return _read_str(f)
    if vtype == 9:
        etype = _read(f, "<I")
        n = _read(f, "<Q")
        if etype in _SCALARS:
            fmt = _SCALARS[etype]
            size = struct.calcsize(fmt)
            data = f.read(size * n)
            return list(struct.unpack("<" + fmt[1:] * n, data))
        return [_read_value(f, etype) for _ in range(n)]
    raise ValueError(f"unknown GGUF value type {vtype}")


def read_metadata(path):
    """Returns the metadata key/values of a GGUF v2/v3 file as a dict."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = _read(f, "<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: unsupported GGUF version {version}")
        _n_tensors = _read(f, "<Q")
        n_kv = _read(f, "<Q")
        meta = {}
        for _ in range(n_kv):
            key = _read_str(f)
            vtype = _read(f, "<I")
            meta[key] = _read_value(f, vtype)
        return meta
