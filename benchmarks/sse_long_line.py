"""Client CPU for one long SSE line read in 64 KiB pieces: linear in its length.

    python benchmarks/sse_long_line.py [--mb 20,40]
"""

from __future__ import annotations

import argparse
import time

from loadgen.load.sse import SSEParser


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default="20,40", help="line sizes in MiB, comma separated")
    args = ap.parse_args()
    for mb in (int(x) for x in args.mb.split(",")):
        parser = SSEParser(max_event_bytes=1 << 40)
        body = b'data: {"choices":[{"text":"' + b"x" * (mb << 20) + b'"}]}\n\n'
        start = time.process_time()
        events = []
        for i in range(0, len(body), 65536):
            events += parser.feed(body[i:i + 65536])
        cpu = time.process_time() - start
        print(f"{mb} MiB line: {cpu:.3f} s of CPU, {len(events)} event, {cpu / mb * 1e3:.1f} ms per MiB")


if __name__ == "__main__":
    main()
