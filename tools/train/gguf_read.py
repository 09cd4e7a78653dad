"""A small GGUF v3 reader (stdlib + numpy): metadata and F32/F16 tensors.
The layout is the one gguf_write.py documents."""
import struct

import numpy as np

from gguf_write import ARRAY, STRING, _SCALAR

_NP = {0: "<f4", 1: "<f2"}


class Reader:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        d = self.data
        if d[:4] != b"GGUF" or struct.unpack_from("<I", d, 4)[0] != 3:
            raise ValueError("%s: not a GGUF v3 file" % path)
        n_tensors, n_kv = struct.unpack_from("<QQ", d, 8)
        self.off = 24
        self.kv = {}
        for _ in range(n_kv):
            key = self._str()
            vtype = self._u32()
            self.kv[key] = self._value(vtype)
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            nd = self._u32()
            ne = struct.unpack_from("<%dQ" % nd, d, self.off)
            self.off += 8 * nd
            ttype = self._u32()
            toff = struct.unpack_from("<Q", d, self.off)[0]
            self.off += 8
            infos.append((name, ne, ttype, toff))
        align = self.kv.get("general.alignment", 32)
        base = (self.off + align - 1) // align * align
        self.tensors = {}
        for name, ne, ttype, toff in infos:
            if ttype not in _NP:
                raise ValueError("%s: type %d (only F32/F16 are read here)" % (name, ttype))
            count = int(np.prod(ne))
            a = np.frombuffer(d, dtype=_NP[ttype], count=count, offset=base + toff)
            self.tensors[name] = a.reshape(tuple(reversed(ne))).astype(np.float32)

    def _u32(self):
        v = struct.unpack_from("<I", self.data, self.off)[0]
        self.off += 4
        return v

    def _str(self):
        n = struct.unpack_from("<Q", self.data, self.off)[0]
        s = self.data[self.off + 8:self.off + 8 + n].decode("utf-8")
        self.off += 8 + n
        return s

    def _value(self, vtype):
        if vtype == STRING:
            return self._str()
        if vtype == ARRAY:
            etype = self._u32()
            n = struct.unpack_from("<Q", self.data, self.off)[0]
            self.off += 8
            return [self._value(etype) for _ in range(n)]
        fmt = _SCALAR[vtype]
        v = struct.unpack_from(fmt, self.data, self.off)[0]
        self.off += struct.calcsize(fmt)
        return v
