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


def _kv_spans(f):
    """Yields (key, start, end) byte spans of every metadata entry."""
    f.seek(4)
    _version = _read(f, "<I")
    _n_tensors = _read(f, "<Q")
    n_kv = _read(f, "<Q")
    for _ in range(n_kv):
        start = f.tell()
        key = _read_str(f)
        vtype = _read(f, "<I")
        _read_value(f, vtype)
        yield key, start, f.tell()


def write_vocab_only_copy(src, dst, overrides):
    """Writes a GGUF with src's metadata (no tensors), string values replaced or
    added from `overrides` — enough for llama.cpp's vocab_only loading."""
    with open(src, "rb") as f:
        spans = list(_kv_spans(f))
        f.seek(0)
        data = f.read(spans[-1][2])
    body = b""
    keys = set()
    for key, start, end in spans:
        keys.add(key)
        if key in overrides:
            continue
        body += data[start:end]
    for key, value in overrides.items():
        kb, vb = key.encode(), value.encode()
        body += struct.pack("<Q", len(kb)) + kb + struct.pack("<I", 8) + struct.pack("<Q", len(vb)) + vb
    n_kv = len([k for k in keys if k not in overrides]) + len(overrides)
    out = b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", 0) + struct.pack("<Q", n_kv) + body
    out += b"\0" * ((-len(out)) % 32)
    with open(dst, "wb") as f:
        f.write(out)
