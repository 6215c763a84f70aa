#!/usr/bin/env python3
"""Rebuilds what a device with a volatile write cache could hold after a power cut, from the
log of a device-mapper log-writes target (drivers/md/dm-log-writes.c).

The log device starts with a super block {magic, version, nr_entries, sectorsize}; then each
entry is one sector {sector, nr_sectors, flags, data_len} (little endian u64s, sectors in
units of sectorsize) followed by nr_sectors of data for a write (none for a discard or a
flush; a mark keeps its text in the entry sector). Entries are in the order the device
completed them.

Power-cut model (worst case a conforming device allows): a write is durable if a FLUSH was
logged after it, or if it carried FUA itself. Everything else is lost.

usage: dm-log-replay.py LOG_DEVICE DATA_BYTES IMAGE_OUT [CUT_MARK]
With CUT_MARK, the power fails at the first mark of that text (`dmsetup message DEV 0 mark
TEXT`): nothing logged after it counts. Writes the replayed image and prints a one-line
summary.
"""
import struct
import sys

MAGIC = 0x6A736677736872
FLUSH, FUA, DISCARD, MARK = 1, 2, 4, 8


def entries(log):
    magic, _version, nr_entries, sectorsize = struct.unpack_from("<QQQI", log.read(28))
    if magic != MAGIC:
        sys.exit(f"not a dm-log-writes log (magic {magic:#x})")
    pos = sectorsize
    for _ in range(nr_entries):
        log.seek(pos)
        sector, nr_sectors, flags, data_len = struct.unpack("<QQQQ", log.read(32))
        mark = ""
        if flags & MARK:
            mark = log.read(data_len).decode(errors="replace")
        pos += sectorsize
        data = None
        if not flags & DISCARD and nr_sectors:
            log.seek(pos)
            data = log.read(nr_sectors * sectorsize)
            pos += nr_sectors * sectorsize
        yield sector * sectorsize, nr_sectors * sectorsize, flags, data, mark


def main():
    log_path, size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cut_mark = sys.argv[4] if len(sys.argv) > 4 else None
    with open(log_path, "rb") as log:
        log_entries = list(entries(log))
    if cut_mark is not None:
        at = next((i for i, e in enumerate(log_entries) if e[2] & MARK and e[4] == cut_mark), None)
        if at is None:
            sys.exit(f"no mark '{cut_mark}' in the log")
        log_entries = log_entries[:at]
    last_flush = max((i for i, e in enumerate(log_entries) if e[2] & FLUSH), default=-1)
    image = bytearray(size)
    writes = durable = lost = flushes = fua = 0
    for i, (offset, length, flags, data, _mark) in enumerate(log_entries):
        flushes += bool(flags & FLUSH)
        fua += bool(flags & FUA)
        if not length:
            continue
        writes += 1
        if i >= last_flush and not flags & FUA:
            lost += 1
            continue
        durable += 1
        # A discard's contents are undefined; the worst case that still counts as the host's
        # intent is zeroes.
        image[offset:offset + length] = data if data is not None else bytes(length)
    with open(out, "wb") as f:
        f.write(image)
    print(f"entries {len(log_entries)} writes {writes} flushes {flushes} fua {fua} "
          f"durable {durable} lost {lost}")


if __name__ == "__main__":
    main()
