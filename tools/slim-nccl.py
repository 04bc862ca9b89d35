#!/usr/bin/env python3
"""Shrink a real libnccl.so.2 to one GPU architecture, so it fits the device tool's 64 MiB carry.

  tools/slim-nccl.py IN_LIBNCCL OUT_LIBNCCL [SM]      (SM: 90 for H100/H200, the default)

NCCL's wheel library is ~340 MB: debug sections, and fat binaries with code for every architecture
from sm_50 to sm_120. This strips the debug sections (objcopy), then blanks the payload of every
fat-binary entry (cubin or PTX) built for another architecture, leaving each entry's header, every
offset and the file's layout as they were; blanked bytes compress to nothing with xz. The CUDA
driver picks an entry by the architecture in its header, so a GPU of the kept architecture never
reads a blanked one. A measuring aid for tools/device-session.sh (issue 14's comparison with NCCL
2.30+), not part of the library. Entry layout: 16-byte container header (magic 0xBA55ED50 or
0x466243B1, u16 version, u16 header size, u64 bytes that follow), then entries of u16 kind, u16,
u32 header size, u32 padded payload size, u32, u32 payload size, u32, u32 minor, u32 sm arch, ...
"""
import shutil, struct, subprocess, sys

MAGICS = (0xBA55ED50, 0x466243B1)


def sections(data):
    """(name, file offset, size) of every section of a 64-bit little-endian ELF."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    stroff = heads[shstrndx][4]
    out = []
    for h in heads:
        name = data[stroff + h[0]:data.index(b"\0", stroff + h[0])].decode()
        out.append((name, h[4], h[5], h[1]))
    return out


def blank(data, off, size, keep_sm):
    """Blank foreign entries of the containers in data[off:off+size]; returns (kept, blanked) bytes."""
    end, pos, kept, blanked = off + size, off, 0, 0
    while pos + 16 <= end:
        magic, _ver, hsize, body = struct.unpack_from("<IHHQ", data, pos)
        if magic not in MAGICS:
            pos += 8  # containers are 8-byte aligned in the section; skip padding
            continue
        e, cend = pos + hsize, min(end, pos + hsize + body)
        while e + 64 <= cend:
            kind, _u, ehs, padded, _p, psize, _u2, _minor, sm = struct.unpack_from("<HHIIIIIII", data, e)
            if ehs < 64 or e + ehs + padded > cend:
                break
            if sm == keep_sm:
                kept += padded
            else:
                data[e + ehs:e + ehs + padded] = bytes(padded)
                blanked += padded
            e += ehs + padded
        pos = cend
    return kept, blanked


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    keep = int(sys.argv[3]) if len(sys.argv) > 3 else 90
    shutil.copyfile(src, dst)
    subprocess.run(["objcopy", "--strip-debug", dst], check=True)
    data = bytearray(open(dst, "rb").read())
    for name, off, size, stype in sections(data):
        if name in (".nv_fatbin", "__nv_relfatbin") and stype != 8:  # 8: SHT_NOBITS
            k, b = blank(data, off, size, keep)
            print(f"{name}: {size >> 20} MiB, kept sm_{keep} {k >> 20} MiB, blanked {b >> 20} MiB")
    open(dst, "wb").write(data)


if __name__ == "__main__":
    main()
