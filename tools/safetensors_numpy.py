#!/usr/bin/python3
"""Write and read the safetensors layout with NumPy only (no safetensors
package), to check that tapegrad's parameter files move to and from the
NumPy world.

Layout: 8-byte little-endian header length N, N bytes of JSON
{"name": {"dtype": "F32"|"F64"|"I64", "shape": [...], "data_offsets": [b, e]},
 ..., "__metadata__": {"key": "string"}}, then the raw little-endian data;
offsets are relative to the data section, which the tensors cover exactly.

  safetensors_numpy.py write PATH   write the sample file that
                                    tests/test_params.c loads (committed as
                                    tests/golden_io/numpy_written.safetensors)
  safetensors_numpy.py read PATH    validate a file (for example one that
                                    tapegrad wrote) and print its tensors

The sample file stores its data in the reverse of header order and a header
without alignment padding, so the reader under test cannot rely on either.
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8")}


def sample_tensors():
    """The tensors of the sample file; tests/test_params.c checks these values."""
    return {
        "fc.weight": np.arange(12, dtype="<f4").reshape(3, 4) * np.float32(0.25) - np.float32(1),
        "fc.bias": np.array([0.5, -1.5, 2.25], dtype="<f8"),
        "bn.count": np.array(7, dtype="<i8"),
        "big": np.array([[2**40 + 1, -3], [2**62, -(2**62)]], dtype="<i8"),
        "empty": np.zeros((0, 2), dtype="<f4"),
    }


def write(path, tensors, metadata):
    names = list(tensors)
    raw = {n: np.ascontiguousarray(tensors[n]).tobytes() for n in names}
    dtype_name = {v: k for k, v in DTYPES.items()}
    spans, offset = {}, 0
    for n in reversed(names):  # data in reverse order of the header entries
        spans[n] = [offset, offset + len(raw[n])]
        offset += len(raw[n])
    header = {n: {"dtype": dtype_name[tensors[n].dtype], "shape": list(tensors[n].shape),
                  "data_offsets": spans[n]} for n in names}
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for n in reversed(names):
            f.write(raw[n])


def read(path):
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError("truncated: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > len(buf) - 8:
        raise ValueError(f"header length {n} larger than the file")
    header = json.loads(buf[8:8 + n].decode())
    data = buf[8 + n:]
    meta = header.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("metadata values must be strings")
    out, spans = {}, []
    for name, e in header.items():
        dt = DTYPES[e["dtype"]]
        begin, end = e["data_offsets"]
        count = int(np.prod(e["shape"], dtype=np.int64))
        if end - begin != count * dt.itemsize:
            raise ValueError(f"{name}: offsets do not match dtype and shape")
        spans.append((begin, end, name))
        out[name] = np.frombuffer(data[begin:end], dtype=dt).reshape(e["shape"])
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise ValueError(f"{name}: data not contiguous at byte {at}")
        at = max(at, end)
    if at != len(data):
        raise ValueError(f"tensors cover {at} bytes, data section has {len(data)}")
    return out, meta


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "read"):
        sys.exit(__doc__)
    path = sys.argv[2]
    if sys.argv[1] == "write":
        write(path, sample_tensors(), {"written_by": "tools/safetensors_numpy.py"})
        print(f"wrote {path}")
        return
    tensors, meta = read(path)
    for k, v in sorted(meta.items()):
        print(f"meta {k} = {v}")
    for name, t in tensors.items():
        flat = t.reshape(-1)
        head = " ".join(repr(x.item()) for x in flat[:6])
        print(f"{name} {t.dtype.str} {list(t.shape)} sum={flat.sum().item()!r} [{head}"
              f"{' ...' if flat.size > 6 else ''}]")
    print(f"ok: {len(tensors)} tensors")


if __name__ == "__main__":
    main()
