"""A small GGUF v3 writer (stdlib + numpy), for F32/F16 tensors and all KV kinds.

File layout (little-endian): "GGUF", u32 version 3, u64 n_tensors, u64 n_kv;
the KV pairs (string key, u32 value type, value); the tensor infos (string
name, u32 n_dims, u64 ne[n_dims] with ne[0] the fastest-varying dimension,
u32 ggml type, u64 offset into the data section); zero padding to the
alignment; the data section, every tensor starting at a multiple of the
alignment.  Strings are u64 length + UTF-8 bytes, arrays are u32 element
type + u64 count + elements.
"""
import struct

import numpy as np

# GGUF metadata value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
           FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

# ggml tensor types written here
GGML_F32, GGML_F16 = 0, 1
_NP_OF = {GGML_F32: "<f4", GGML_F16: "<f2"}

ALIGNMENT = 32


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype, v):
    if vtype == STRING:
        return _str(v)
    return struct.pack(_SCALAR[vtype], v)


class GGUFWriter:
    def __init__(self):
        self.kv = []          # (key, encoded bytes)
        self.keys = set()
        self.tensors = []     # (name, ne list, ggml type, bytes)

    def _add(self, key, blob):
        if key in self.keys:
            raise ValueError("duplicate key %s" % key)
        self.keys.add(key)
        self.kv.append((key, blob))

    def add(self, key, vtype, value):
        self._add(key, struct.pack("<I", vtype) + _value(vtype, value))

    def add_array(self, key, etype, values):
        body = b"".join(_value(etype, v) for v in values) if etype in (STRING, BOOL) else \
            np.asarray(values, dtype=_SCALAR[etype]).tobytes()
        self._add(key, struct.pack("<IIQ", ARRAY, etype, len(values)) + body)

    def add_tensor(self, name, array, ggml_type):
        """array in numpy (row-major) order: shape (..., n1, n0) -> ggml ne = [n0, n1, ...]."""
        if any(t[0] == name for t in self.tensors):
            raise ValueError("duplicate tensor %s" % name)
        a = np.ascontiguousarray(np.asarray(array, dtype=np.float64).astype(_NP_OF[ggml_type]))
        if ggml_type == GGML_F16 and not np.all(np.isfinite(a)):
            raise ValueError("tensor %s overflows f16" % name)
        self.tensors.append((name, list(reversed(a.shape)), ggml_type, a.tobytes()))

    def write(self, path):
        head = [b"GGUF", struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))]
        head += [_str(k) + blob for k, blob in self.kv]
        offset = 0
        offsets = []
        for name, ne, gtype, data in self.tensors:
            offsets.append(offset)
            head.append(_str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
                        + struct.pack("<IQ", gtype, offset))
            offset += len(data)
            offset += -offset % ALIGNMENT
        header = b"".join(head)
        with open(path, "wb") as f:
            f.write(header)
            f.write(b"\0" * (-len(header) % ALIGNMENT))
            for (name, ne, gtype, data), off in zip(self.tensors, offsets):
                f.write(data)
                f.write(b"\0" * (-len(data) % ALIGNMENT))
