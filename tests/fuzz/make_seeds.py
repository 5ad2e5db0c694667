#!/usr/bin/env python3
"""Seed corpora for the fuzz targets, from the committed golden/demo files, tests/fuzz/seeds/ and
../shared models, plus a few tiny well-formed inputs (a fuzzer finds deep paths faster from small
valid files).
Usage: make_seeds.py <repo root> <shared dir> <out dir>; writes <out>/<target>/*."""
import json, os, shutil, struct, sys

root, shared, out = sys.argv[1:4]
def put(target, name, data):
    d = os.path.join(out, target); os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f: f.write(data)
def copy(target, src):
    if os.path.isfile(src): put(target, os.path.basename(src), open(src, "rb").read())

golden = os.path.join(root, "data", "golden")
demo = os.path.join(root, "data", "kvq-demo-llama")
# HDF5: the golden allocation files, but not the 1.1 MB golden calibration file (fuzz_calib ran at a
# quarter of the speed from it); tests/fuzz/seeds/ holds tiny calibration/allocation files of the
# same layout instead (tests/fuzz/make-tiny-h5-seeds).
for f in sorted(os.listdir(golden)):
    if f.endswith(".kvqalloc.h5"): copy("alloc", os.path.join(golden, f))
tiny = os.path.join(root, "tests", "fuzz", "seeds")
for target in ("calib", "alloc", "tokenizer_json", "probe"):
    d = os.path.join(tiny, target)
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        copy(target, os.path.join(d, f))

# kvq-inspect's summaries read both kinds of HDF5 file, calib-capture merge calibration files: the
# tiny seeds and the HDF5 regressions of the readers.
reg = os.path.join(root, "tests", "fuzz", "regressions")
for target, kinds in (("inspect_summary", ("calib", "alloc")), ("merge", ("calib",))):
    for kind in kinds:
        for d in (os.path.join(tiny, kind), os.path.join(reg, kind)):
            for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
                copy(target, os.path.join(d, f))

# safetensors: the demo model's real header with a tiny data section re-laid out, plus small files.
def st(tensors, meta=None):
    hdr, blob = {}, b""
    if meta: hdr["__metadata__"] = meta
    for name, dtype, shape, payload in tensors:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(payload)]}
        blob += payload
    h = json.dumps(hdr).encode()
    return struct.pack("<Q", len(h)) + h + blob
put("safetensors", "tiny_f32.safetensors", st([("a", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
                                               ("b", "F16", [3], b"\x00\x3c" * 3),
                                               ("c", "BF16", [1, 2], b"\x80\x3f" * 2),
                                               ("d", "I64", [1], b"\x00" * 8)], {"format": "pt"}))
put("safetensors", "empty.safetensors", st([]))
with open(os.path.join(demo, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
# same names/dtypes as the real model, every shape shrunk to fit a 4 KiB payload
small = []
for name, t in list(hdr.items())[:12]:
    if name == "__metadata__": continue
    shape = [min(d, 2) for d in t["shape"]]
    cnt = 1
    for d in shape: cnt *= d
    small.append((name, t["dtype"], shape, b"\x00\x00\x80\x3f" * cnt))
put("safetensors", "demo_shrunk.safetensors", st(small))

# llama2.c checkpoint: the real stories260K plus a minimal legacy v0 file that loads.
copy("llama2c", os.path.join(shared, "models", "stories260K", "stories260K.bin"))
def l2c(D, Hd, L, H, Hkv, V, S, tied=True):
    kvd, hd = D * Hkv // H, D // H
    floats = V*D + L*D + L*D*D + 2*L*kvd*D + L*D*D + L*D + 3*L*Hd*D + D + 2*S*(hd//2) + (0 if tied else V*D)
    return struct.pack("<7i", D, Hd, L, H, Hkv, V if tied else -V, S) + struct.pack("<f", 0.5) * floats
put("llama2c", "tiny_tied.bin", l2c(4, 8, 1, 2, 1, 5, 3))
put("llama2c", "tiny_untied.bin", l2c(4, 4, 2, 2, 2, 6, 2, tied=False))

# tokenizer.bin: the real 512-token one plus a tiny one.
copy("tokenizer", os.path.join(shared, "models", "stories260K", "tok512.bin"))
pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(256)] + [b" ", b"a", b"b", b"ab", b" a", b"\xc3\xa9"]
put("tokenizer", "tiny.bin", struct.pack("<i", 6) + b"".join(struct.pack("<fi", -float(i), len(p)) + p for i, p in enumerate(pieces)))

# tiktoken ranks files: every byte then a few merges; alone, and with a GLM-4 tokenizer_config.json
# after fuzz_tiktoken's mark.
import base64
def ranks(merged):
    toks = [bytes([b]) for b in range(256)] + merged
    return b"".join(base64.b64encode(t) + b" %d\n" % i for i, t in enumerate(toks))
put("tiktoken", "bytes.tiktoken", ranks([b"ab", b"abc", b" a", b"aa", b"\xc5\xbf", b"\xc5\xbft"]))
glm = {"tokenizer_class": "ChatGLM4Tokenizer", "eos_token": "<|endoftext|>",
       "added_tokens_decoder": {str(262 + i): {"content": c, "special": True}
                                for i, c in enumerate(["<|endoftext|>", "[gMASK]", "<sop>", "<|user|>"])}}
put("tiktoken", "glm.tiktoken", ranks([b"ab", b"abc", b" a", b"aa", b"he", b"llo"]) +
    b"\n#kvq-tokenizer-config\n" + json.dumps(glm).encode())

# corpus text
copy("corpus", os.path.join(demo, "psalm23.txt"))
put("corpus", "mixed.txt", "h\u00e9llo \u20ac \U0001F600\n".encode() + b"bad \xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \xe2\x82")

# provenance JSON: the one stored in the golden calibration file (the attribute is plain text).
raw = open(os.path.join(golden, "calib-v1.kvqcal.h5"), "rb").read()
start = raw.find(b'{\n "architecture"')
if start >= 0:
    depth, j = 0, start
    while j < len(raw):
        c = raw[j:j+1]
        depth += (c == b"{") - (c == b"}")
        j += 1
        if depth == 0: break
    put("provenance", "golden.json", raw[start:j])

# Inputs that once crashed a reader (kept as seeds so every run re-checks them).
reg = os.path.join(root, "tests", "fuzz", "regressions")
if os.path.isdir(reg):
    for target in sorted(os.listdir(reg)):
        for f in sorted(os.listdir(os.path.join(reg, target))):
            copy(target, os.path.join(reg, target, f))
