"""What the tests' S3 server itself can answer: requests per second by kind, with no delay and no proxy.

    .venv/bin/python -m bench.s3_server                      # buckets of 1,000 and 5,000 objects
    .venv/bin/python -m bench.s3_server --objects 2000 --requests 500

The object-store benchmark's figures at several writers are bounded by this server before any round trip
counts: it answers one request at a time (moto decides a conditional PUT by a lookup and then a write, so
answering concurrently would let two creates of one name both succeed), and a listing costs it in
proportion to the names it returns. Eight client threads keep it busy, so requests per second here is one
over the server's own time per request. The bucket holds a timeline of 200 commit files, base files, and
a Delta log that makes up the rest of ``--objects`` names, as the benchmark's bucket does by its end.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3

from bench.bucket import BUCKET, REGION, SECRET, s3_server

CLIENTS = 8
TIMELINE = "t/.hoodie/timeline/"


def fill(server: Any, objects: int) -> None:
    """A timeline of 200 commit files, base files, and a Delta log making up the rest."""
    files = {f"{TIMELINE}{i:017d}.commit": b"c" * 2000 for i in range(200)}
    files |= {f"t/p{i % 8}/f{i}.parquet": b"p" * 5000 for i in range(400)}
    files |= {f"d/_delta_log/{i:020d}.json": b"d" * 1000 for i in range(objects - len(files))}
    server.load(BUCKET, files)


def calls(client: Any) -> dict[str, Callable[[int], object]]:
    def get(i: int) -> bytes:
        return client.get_object(Bucket=BUCKET, Key=f"{TIMELINE}{i % 200:017d}.commit")["Body"].read()

    return {
        "LIST the timeline (200 names)": lambda i: client.list_objects_v2(Bucket=BUCKET, Prefix=TIMELINE),
        "LIST an empty prefix": lambda i: client.list_objects_v2(Bucket=BUCKET, Prefix="t/.hoodie/locks/"),
        "GET 2 KB": get,
        "PUT 2 KB if absent": lambda i: client.put_object(
            Bucket=BUCKET, Key=f"new/{i}", Body=b"n" * 2000, IfNoneMatch="*"
        ),
    }


def rate(call: Callable[[int], object], requests: int) -> float:
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(call, range(CLIENTS)))  # connections open before the clock starts
        started = time.monotonic()
        list(pool.map(call, range(CLIENTS, CLIENTS + requests)))
        return requests / (time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", default="1000,5000", help="comma-separated bucket sizes (1000,5000)")
    parser.add_argument("--requests", type=int, default=300, help="requests of each kind (300)")
    args = parser.parse_args(argv)
    print(f"{'objects':>8}  {'request':32} {'requests/s':>10} {'ms each':>8}")
    for objects in (int(n) for n in args.objects.split(",")):
        with s3_server() as server:
            fill(server, objects)
            client = boto3.client(
                "s3",
                endpoint_url=server.endpoint_url,
                aws_access_key_id="ceiling",
                aws_secret_access_key=SECRET,
                region_name=REGION,
            )
            for name, call in calls(client).items():
                per_second = rate(call, args.requests)
                print(f"{objects:>8}  {name:32} {per_second:>10.0f} {1000 / per_second:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
