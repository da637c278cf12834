#!/usr/bin/env python3
"""Pull the uncompressed ELF kernel out of a bzImage (vmlinuz).

A bzImage is a small real-mode/decompressor stub followed by the compressed
kernel payload.  We do not parse the boot header; we scan the whole file for
the magic bytes of each compressor the kernel can use, try to decompress from
every hit, and keep the first result that is an ELF file.  Booting this ELF
directly (QEMU -kernel accepts it through its PVH note) skips the in-guest
decompressor, which is slow under TCG.

usage: extract-vmlinux.py VMLINUZ OUT
"""
import lzma
import os
import shutil
import subprocess
import sys
import zlib

ELF = b"\x7fELF"

def try_xz(data, off):
    d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    return d.decompress(data[off:])

def try_lzma(data, off):
    d = lzma.LZMADecompressor(format=lzma.FORMAT_ALONE)
    return d.decompress(data[off:])

def try_gzip(data, off):
    d = zlib.decompressobj(wbits=31)
    return d.decompress(data[off:])

def try_tool(tool):
    def run(data, off):
        if shutil.which(tool[0]) is None:
            raise RuntimeError(f"{tool[0]} not installed")
        p = subprocess.run(tool, input=data[off:], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL)
        # zstd/lz4 complain about the trailing bytes after the frame but
        # still write the decompressed frame: judge by the output.
        return p.stdout
    return run

# magic -> decoder.  Order matters only for speed.
CANDIDATES = [
    ("xz", b"\xfd7zXZ\x00", try_xz),
    ("zstd", b"\x28\xb5\x2f\xfd", try_tool(["zstd", "-dc"])),
    ("gzip", b"\x1f\x8b\x08", try_gzip),
    ("lz4", b"\x02\x21\x4c\x18", try_tool(["lz4", "-dc"])),
    ("lzma", b"\x5d\x00\x00", try_lzma),
]

def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        data = f.read()
    if data.startswith(ELF):
        out = data
    else:
        out = None
        for name, magic, dec in CANDIDATES:
            off = data.find(magic)
            while off != -1 and out is None:
                try:
                    res = dec(data, off)
                    if res.startswith(ELF):
                        out = res
                        print(f"extract-vmlinux: {name} payload at offset {off}, {len(res)} bytes",
                              file=sys.stderr)
                except Exception:
                    pass
                off = data.find(magic, off + 1)
            if out is not None:
                break
    if out is None:
        sys.exit(f"extract-vmlinux: no compressed ELF kernel found in {src}")
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(out)
    os.replace(tmp, dst)

if __name__ == "__main__":
    main()
