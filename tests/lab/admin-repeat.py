#!/usr/bin/env python3
"""admin-repeat.py CTRL_DEV COUNT OPCODE CDW10 DATA_LEN MARKER_HEX [INTERVAL_MS]

Sends one admin command COUNT times through the kernel's NVME_IOCTL_ADMIN_CMD on CTRL_DEV
(/dev/nvmeN), each with a controller-to-host buffer of DATA_LEN bytes filled with 0x00, and
counts the replies whose data holds MARKER_HEX (any rotation of it, so a pattern cut at any
byte is still seen), INTERVAL_MS apart (default 0). One process for all the commands: `nvme admin-passthru` started 300 times
costs minutes under TCG, these ioctls take a second.

Prints "sent=N failed=F marked=M" and exits 0 when every command succeeded, 1 otherwise.
"""
import ctypes
import fcntl
import os
import struct
import sys
import time

# struct nvme_passthru_cmd (include/uapi/linux/nvme_ioctl.h): 72 bytes.
PASSTHRU = struct.Struct("=BBHIIIQQIIIIIIIIII")
assert PASSTHRU.size == 72
# _IOWR('N', 0x41, struct nvme_admin_cmd)
NVME_IOCTL_ADMIN_CMD = (3 << 30) | (PASSTHRU.size << 16) | (ord("N") << 8) | 0x41


def main() -> int:
    dev, count, opcode, cdw10, data_len, marker_hex = sys.argv[1:7]
    count, opcode, cdw10, data_len = int(count), int(opcode, 0), int(cdw10, 0), int(data_len)
    interval = int(sys.argv[7]) / 1000 if len(sys.argv) > 7 else 0
    marker = bytes.fromhex(marker_hex)
    rotations = [marker[i:] + marker[:i] for i in range(len(marker))]
    fd = os.open(dev, os.O_RDWR)
    failed = marked = 0
    for _ in range(count):
        time.sleep(interval)
        buf = bytearray(data_len)
        addr = ctypes.addressof((ctypes.c_char * data_len).from_buffer(buf))
        cmd = bytearray(PASSTHRU.pack(opcode, 0, 0, 0, 0, 0, 0, addr, 0, data_len,
                                      cdw10, 0, 0, 0, 0, 0, 30000, 0))
        try:
            status = fcntl.ioctl(fd, NVME_IOCTL_ADMIN_CMD, cmd)
        except OSError as err:
            print(f"ioctl: {err}", file=sys.stderr)
            failed += 1
            continue
        if status != 0:
            print(f"status 0x{status:x}", file=sys.stderr)
            failed += 1
            continue
        if any(r in buf for r in rotations):
            marked += 1
    os.close(fd)
    print(f"sent={count} failed={failed} marked={marked}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
