#!/usr/bin/env python3
"""Generate tests/malformed/*.gguf: tiny GGUF files, each broken in one way,
and tests/malformed/EXPECTED.txt (filename<TAB>substring the reader's error
message must contain). tests/test_gguf_malformed.c checks every file.

Usage: scripts/make_malformed_corpus.py [OUTDIR]   (python3 stdlib only)
       scripts/make_malformed_corpus.py --seeds DIR   (valid files: fuzz seeds)

Files named fuzz_*.gguf are inputs found by the fuzzer; they are listed in
FUZZ_FOUND below as hex so that regenerating the corpus keeps them."""
import os
import struct
import sys

# value type ids
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
# ggml tensor type ids
T_F32, T_F16, T_Q4_0, T_Q8_0 = 0, 1, 2, 8


def u32(x): return struct.pack('<I', x)
def u64(x): return struct.pack('<Q', x)
def gstr(b): return u64(len(b)) + b


def kv(key, vtype, payload):
    """A key/value record; payload is the encoded value."""
    return gstr(key) + u32(vtype) + payload


def kv_u32(key, x): return kv(key, U32, u32(x))
def kv_str(key, s): return kv(key, STR, gstr(s))


def arr(elem_type, n, body): return u32(elem_type) + u64(n) + body


def tinfo(name, dims, ttype, offset):
    return gstr(name) + u32(len(dims)) + b''.join(u64(d) for d in dims) + u32(ttype) + u64(offset)


def header(n_tensors, n_kv, magic=b'GGUF', version=3):
    return magic + u32(version) + u64(n_tensors) + u64(n_kv)


def pad(b, align=32):
    return b + b'\0' * (-len(b) % align)


def gguf(kvs, tensors=(), data=b'', align=32, n_tensors=None, n_kv=None):
    """Whole file: header, kvs, tensor infos, padding, data."""
    meta = header(len(tensors) if n_tensors is None else n_tensors,
                  len(kvs) if n_kv is None else n_kv)
    meta += b''.join(kvs) + b''.join(tensors)
    return pad(meta, align) + data


ARCH = kv_str(b'general.architecture', b'test')
TOKENS = kv(b'tokenizer.ggml.tokens', ARR, arr(STR, 2, gstr(b'a') + gstr(b'bc')))
W = tinfo(b'w', [8], T_F32, 0)        # 32 bytes at offset 0
V = tinfo(b'v', [8, 2], T_F32, 32)    # 64 bytes at offset 32
DATA = bytes(range(96))


def valid():
    return gguf([ARCH, TOKENS], [W, V], DATA)


def cut_at(marker_len):
    """The valid file cut to its first marker_len bytes."""
    return valid()[:marker_len]


def nested(depth, leaf=arr(U8, 1, b'\x01')):
    """An array value nested `depth` arrays deep (depth 1 = leaf)."""
    body = leaf
    for _ in range(depth - 1):
        body = arr(ARR, 1, body)
    return body


# Offsets inside valid(): header 24; ARCH record 24..; TOKENS after it.
H = 24
A_END = H + len(ARCH)
K_END = A_END + len(TOKENS)
W_END = K_END + len(W)

CASES = []  # (filename, bytes, expected substring)


def case(name, data, expect):
    CASES.append((name + '.gguf', data, expect))


# --- header ---
case('empty', b'', 'offset 0: truncated file while reading magic')
case('trunc_magic', b'GG', 'truncated file while reading magic: needs 4 bytes, only 2 remain')
case('bad_magic', b'GGUX' + valid()[4:], "bad magic 'GGUX'")
case('bad_magic_ggjt', b'tjgg' + valid()[4:], "bad magic 'tjgg'")
case('version2', header(0, 0, version=2), 'unsupported GGUF version 2')
case('version4', header(0, 0, version=4), 'unsupported GGUF version 4')
case('version_bigendian', b'GGUF' + struct.pack('>I', 3) + bytes(16), 'looks like a big-endian file')
case('trunc_version', b'GGUF\x03\x00', 'truncated file while reading version')
case('trunc_tensor_count', b'GGUF' + u32(3) + b'\0\0\0', 'truncated file while reading tensor count')
case('trunc_kv_count', b'GGUF' + u32(3) + u64(0) + b'\x01', 'truncated file while reading key/value count')
case('huge_n_kv', header(0, 1 << 60) + ARCH, 'key/value count 1152921504606846976 cannot fit')
case('max_n_kv', header(0, 2**64 - 1) + ARCH, 'key/value count 18446744073709551615 cannot fit')
case('huge_n_tensors', header(1 << 60, 1) + ARCH, 'tensor count 1152921504606846976 cannot fit')
case('counts_fit_alone_not_together', header(2, 4) + ARCH + bytes(60),
     'tensor count 2 and key/value count 4 together cannot fit in the 104 bytes remaining')
# --- key/value records ---
case('trunc_key_len', header(0, 2) + ARCH + b'\x05\0\0', 'offset 68: kv #1: truncated file while reading key length')
case('key_past_eof', header(0, 2) + ARCH + u64(10) + b'gen', 'kv #1: key length 10 exceeds the 3 bytes remaining')
case('huge_key_len', header(0, 1) + u64(1 << 63) + bytes(12),
     'key length 9223372036854775808 exceeds the 12 bytes remaining')
case('empty_key', gguf([kv(b'', U32, u32(1))]), 'offset 24: kv #0: empty key')
case('key_control_char', gguf([kv_u32(b'bad\nkey', 1)]), "key 'bad\\x0akey' contains control byte 0x0a")
case('key_nul_byte', gguf([kv_u32(b'a\0b', 1)]), 'contains control byte 0x00 at position 1')
case('duplicate_key', gguf([ARCH, kv_u32(b'x.y', 1), kv_str(b'general.architecture', b'other')]),
     "key 'general.architecture': duplicate key (first defined at offset 24)")
case('trunc_value_type', header(0, 2) + ARCH + gstr(b'k') + b'\x04\0', "key 'k': truncated file while reading value type")
case('unknown_value_type', gguf([kv(b'k', 13, u32(0))]), "key 'k': unknown value type 13")
case('unknown_value_type_max', gguf([kv(b'k', 0xFFFFFFFF, u32(0))]), 'unknown value type 4294967295')
case('trunc_u32_value', header(0, 1) + gstr(b'k') + u32(U32) + b'\x01\x02',
     "key 'k': truncated file while reading uint32 value: needs 4 bytes, only 2 remain")
case('trunc_f64_value', header(0, 1) + gstr(b'k') + u32(F64) + b'\x01\x02\x03', 'reading float64 value')
case('trunc_i16_value', header(0, 1) + gstr(b'k') + u32(I16) + b'\x01', 'reading int16 value')
case('bool_value_2', gguf([kv(b'flag', BOOL, b'\x02')]), "key 'flag': bool value 2 is not 0 or 1")
case('bool_array_ff', gguf([kv(b'flags', ARR, arr(BOOL, 3, b'\x01\xff\x00'))]),
     'bool array element 1 has value 255, not 0 or 1')
case('trunc_string_len', header(0, 1) + gstr(b'k') + u32(STR) + b'\x01\0\0\0',
     "key 'k': truncated file while reading string length")
case('huge_string_len', header(0, 1) + gstr(b'k') + u32(STR) + u64(1 << 60) + b'abc',
     'string length 1152921504606846976 exceeds the 3 bytes remaining')
case('string_past_eof', header(0, 1) + gstr(b'k') + u32(STR) + u64(100) + b'hello',
     'string length 100 exceeds the 5 bytes remaining')
# --- arrays ---
case('unknown_array_elem_type', gguf([kv(b'a', ARR, arr(13, 1, u32(0)))]), "key 'a': unknown array element type 13")
case('trunc_array_elem_type', header(0, 1) + gstr(b'a') + u32(ARR) + b'\x04',
     'truncated file while reading array element type')
case('trunc_array_len', header(0, 1) + gstr(b'a') + u32(ARR) + u32(U32) + b'\x02\0',
     'truncated file while reading array length')
case('huge_array_len', gguf([kv(b'a', ARR, arr(U32, 1 << 61, u32(1)))]),
     'array length 2305843009213693952 of uint32 needs at least 4 bytes per element')
case('max_array_len_u8', gguf([kv(b'a', ARR, arr(U8, 2**64 - 1, b'\x01'))]),
     'array length 18446744073709551615 of uint8')
case('huge_string_array', gguf([kv(b'tokenizer.ggml.tokens', ARR, arr(STR, 1 << 40, gstr(b'a')))]),
     "key 'tokenizer.ggml.tokens': array length 1099511627776 of string")
case('array_elems_past_eof', header(0, 1) + gstr(b'a') + u32(ARR) + arr(U64, 10, bytes(16)),
     'array length 10 of uint64 needs at least 8 bytes per element but only 16 bytes remain')
case('array_string_past_eof', header(0, 1) + gstr(b'a') + u32(ARR) + arr(STR, 2, gstr(b'x') + u64(50) + b'yy'),
     'array string length 50 exceeds the 2 bytes remaining')
case('nested_array_bomb', gguf([kv(b'a', ARR, arr(ARR, 1 << 50, arr(U8, 0, b'')))]),
     'array length 1125899906842624 of array needs at least 12 bytes per element')
case('nested_inner_bomb', gguf([kv(b'a', ARR, arr(ARR, 2, arr(U8, 1, b'\x01') + arr(U32, 1 << 40, b'')))]),
     'array length 1099511627776 of uint32')
case('nested_too_deep', gguf([kv(b'a', ARR, nested(9))]), 'arrays nested deeper than 8 levels')
# --- general.alignment ---
case('alignment_zero', gguf([kv_u32(b'general.alignment', 0)]), 'alignment 0 is not a non-zero power of two')
case('alignment_three', gguf([kv_u32(b'general.alignment', 3)]), 'alignment 3 is not a non-zero power of two')
case('alignment_u64', gguf([kv(b'general.alignment', U64, u64(32))]),
     "key 'general.alignment': must be of type uint32, found uint64")
case('alignment_string', gguf([kv_str(b'general.alignment', b'32')]), 'must be of type uint32, found string')
# --- tensor infos ---
case('trunc_after_kvs', cut_at(K_END + 3),
     'tensor #0: truncated file while reading tensor name length')
case('trunc_tensor_name', cut_at(K_END + 8),
     'tensor #0: tensor name length 1 exceeds the 0 bytes remaining')
case('empty_tensor_name', gguf([ARCH], [tinfo(b'', [8], T_F32, 0)], bytes(32)), 'tensor #0: empty tensor name')
case('tensor_name_too_long', gguf([ARCH], [tinfo(b'n' * 257, [8], T_F32, 0)], bytes(32)),
     'tensor name length 257 exceeds the limit of 256')
case('tensor_name_control', gguf([ARCH], [tinfo(b'w\x01', [8], T_F32, 0)], bytes(32)),
     "tensor name 'w\\x01' contains control byte 0x01")
case('duplicate_tensor', gguf([ARCH], [W, tinfo(b'w', [8], T_F32, 32)], bytes(64)),
     "tensor 'w': duplicate tensor name (first defined at offset")
case('n_dims_zero', gguf([ARCH], [tinfo(b'w', [], T_F32, 0)], bytes(32)), "tensor 'w': n_dims 0 is outside 1..4")
case('n_dims_five', gguf([ARCH], [tinfo(b'w', [8, 1, 1, 1, 1], T_F32, 0)], bytes(32)), 'n_dims 5 is outside 1..4')
case('trunc_n_dims', cut_at(K_END + 8 + 1 + 2), "tensor 'w': truncated file while reading n_dims")
case('trunc_dims', cut_at(K_END + 8 + 1 + 4 + 5), "tensor 'w': truncated file while reading dimension")
case('dim_zero', gguf([ARCH], [tinfo(b'w', [8, 0], T_F32, 0)], bytes(32)), "tensor 'w': dimension 1 is zero")
case('element_overflow', gguf([ARCH], [tinfo(b'w', [1 << 32, 1 << 32], T_F32, 0)], bytes(32)),
     'element count overflows at dimension 1')
case('dim_above_int64', gguf([ARCH], [tinfo(b'w', [1 << 63], T_F32, 0)], bytes(32)),
     'element count overflows at dimension 0')
case('byte_size_overflow', gguf([ARCH], [tinfo(b'w', [1 << 31, 1 << 31], T_F32, 0)], bytes(32)),
     'byte size of 4611686018427387904 F32 elements overflows')
case('unknown_tensor_type', gguf([ARCH], [tinfo(b'w', [32], 4, 0)], bytes(32)), "tensor 'w': unknown tensor type id 4")
case('unknown_tensor_type_max', gguf([ARCH], [tinfo(b'w', [32], 0xFFFFFFFF, 0)], bytes(32)),
     'unknown tensor type id 4294967295')
case('row_not_block_multiple', gguf([ARCH], [tinfo(b'q', [48, 2], T_Q4_0, 0)], bytes(64)),
     "tensor 'q': row length 48 is not a multiple of the Q4_0 block size 32")
case('trunc_tensor_type', cut_at(K_END + 8 + 1 + 4 + 8 + 1), "tensor 'w': truncated file while reading tensor type")
case('trunc_tensor_offset', cut_at(K_END + 8 + 1 + 4 + 8 + 4 + 7),
     "tensor 'w': truncated file while reading tensor data offset")
# --- tensor placement ---
case('offset_misaligned', gguf([ARCH], [tinfo(b'w', [8], T_F32, 4)], bytes(64)),
     "tensor 'w': data offset 4 is not a multiple of the alignment 32")
case('offset_misaligned_align64', gguf([kv_u32(b'general.alignment', 64)], [W, tinfo(b'v', [8], T_F32, 32)],
                                       bytes(128), align=64),
     "tensor 'v': data offset 32 is not a multiple of the alignment 64")
case('overlapping_tensors', gguf([ARCH], [tinfo(b'a', [16], T_F32, 0), tinfo(b'b', [8], T_F32, 32)], bytes(96)),
     "tensor 'b': data [32, 64) overlaps tensor 'a' [0, 64)")
case('same_offset_tensors', gguf([ARCH], [tinfo(b'a', [8], T_F32, 0), tinfo(b'b', [8], T_F32, 0)], bytes(32)),
     "tensor 'b': data [0, 32) overlaps tensor 'a' [0, 32)")
case('data_past_eof', gguf([ARCH], [tinfo(b'w', [64], T_F32, 0)], bytes(100)),
     "tensor 'w': tensor data (256 bytes at data offset 0) extends past the end of the file")
case('data_truncated', valid()[:-1], "tensor 'v': tensor data (64 bytes at data offset 32) extends past the end")
case('no_data_section', gguf([ARCH], [W])[:H + len(ARCH) + len(W)], "tensor 'w': tensor data (32 bytes")
case('offset_overflow', gguf([ARCH], [tinfo(b'w', [8], T_F32, 2**64 - 32)], bytes(32)),
     'at data offset 18446744073709551584) extends past the end of the file')
case('q8_0_data_past_eof', gguf([ARCH], [tinfo(b'q', [32, 4], T_Q8_0, 0)], bytes(135)),
     "tensor 'q': tensor data (136 bytes at data offset 0) extends past")

# Inputs the fuzzer found (hex), kept so regeneration preserves them.
FUZZ_FOUND = [
]


def valid_seeds():
    """Small valid files covering every value type, for fuzzing seeds."""
    scalars = [kv(b'u8', U8, b'\x05'), kv(b'i8', I8, b'\xfb'), kv(b'u16', U16, struct.pack('<H', 7)),
               kv(b'i16', I16, struct.pack('<h', -7)), kv_u32(b'u32', 9), kv(b'i32', I32, struct.pack('<i', -9)),
               kv(b'f32', F32, struct.pack('<f', 1.5)), kv(b'bool', BOOL, b'\x01'), kv_str(b's', b'str'),
               kv(b'u64', U64, u64(11)), kv(b'i64', I64, struct.pack('<q', -11)),
               kv(b'f64', F64, struct.pack('<d', 2.5))]
    nested_kv = kv(b'nested', ARR, arr(ARR, 2, arr(I32, 2, struct.pack('<ii', 1, 2)) +
                                        arr(STR, 1, gstr(b'x'))))
    aligned = gguf([kv_u32(b'general.alignment', 64), TOKENS], [W, tinfo(b'v', [8, 2], T_F32, 64)],
                   bytes(128), align=64)
    quant = gguf([ARCH], [tinfo(b'q4', [64, 2], T_Q4_0, 0), tinfo(b'q8', [32], T_Q8_0, 96)], bytes(160))
    return [('valid_basic.gguf', valid()), ('valid_scalars.gguf', gguf([ARCH] + scalars)),
            ('valid_nested.gguf', gguf([nested_kv, kv_str(b'tokenizer.chat_template', b'{{x}}')])),
            ('valid_align64.gguf', aligned), ('valid_quant.gguf', quant),
            ('valid_empty.gguf', header(0, 0))]


def main():
    if len(sys.argv) == 3 and sys.argv[1] == '--seeds':
        os.makedirs(sys.argv[2], exist_ok=True)
        for name, data in valid_seeds():
            with open(os.path.join(sys.argv[2], name), 'wb') as fh:
                fh.write(data)
        return
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.normpath(os.path.join(here, '..', 'tests', 'malformed'))
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        if name.endswith('.gguf'):
            os.remove(os.path.join(out, name))
    cases = CASES + [(n, bytes.fromhex(h), e) for n, h, e in FUZZ_FOUND]
    names = set()
    lines = []
    for name, data, expect in cases:
        assert name not in names, name
        assert '\t' not in expect and '\n' not in expect
        names.add(name)
        with open(os.path.join(out, name), 'wb') as fh:
            fh.write(data)
        lines.append(f'{name}\t{expect}\n')
    with open(os.path.join(out, 'EXPECTED.txt'), 'w') as fh:
        fh.write('# filename<TAB>substring the reader error must contain '
                 '(generated by scripts/make_malformed_corpus.py)\n')
        fh.writelines(lines)
    print(f'{len(cases)} files in {out}')


if __name__ == '__main__':
    main()
