#!/usr/bin/env python3
"""memcap_watch.py — memcap.sh's three requests and the watch over /metrics.

    memcap_watch.py BASE OUT_DIR BODY1 BODY2 BODY3

Sends BODY1 and BODY2 (streamed completions) at once; when /metrics shows
both running, sends BODY3, which must wait for a slot; then reads /metrics
over and over until the first two are answered, and prints one line,
"waited W slow S offloaded L": W 1 if requests_waiting was ever 1, S and L
the largest kv_bytes_slow and kv_layers_offloaded seen.  The raw SSE
bodies go to OUT_DIR/r1.txt, r2.txt and r3.txt (as `curl -sN` writes them).

Why not curl in a shell loop: the states it looks for last only part of a
decode (the layers go to the slow tier at about 220 tokens of 300, and the
third request waits only until a slot frees), and a loop that starts curl
and three seds per sample, on a host busy with other work, took a sample
every few tenths of a second and sometimes missed the whole window (the
test failed with offload events counted but no slow-tier KV seen).  Here
one process keeps one connection and samples as fast as the server
answers, and the third request leaves right after both are seen running,
with no process to start in between.  No check depends on a duration.
"""
import http.client
import os
import re
import sys
import threading
import time
import urllib.parse


def post_stream(base, body, path):
    """One streamed completion; its raw body is written to path."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=170)
    try:
        conn.request("POST", "/v1/completions", body=body.encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        with open(path, "wb") as f:
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                f.write(chunk)
    except OSError as e:  # the shell's checks on the file report it
        with open(path, "ab") as f:
            f.write(("\nmemcap_watch: %s\n" % e).encode())
    finally:
        conn.close()


class Metrics:
    """/metrics over one kept-alive connection (reopened if the server closes it)."""

    def __init__(self, base):
        u = urllib.parse.urlsplit(base)
        self.host, self.port, self.conn = u.hostname, u.port, None

    def get(self):
        for _ in range(2):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
                self.conn.request("GET", "/metrics")
                text = self.conn.getresponse().read().decode()
                return {m.group(1): float(m.group(2))
                        for m in re.finditer(r"^kvsieve_(\w+) ([0-9.e+-]+)$", text, re.M)}
            except (OSError, http.client.HTTPException):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
        return {}


def main():
    base, out, bodies = sys.argv[1], sys.argv[2], sys.argv[3:6]
    threads = [threading.Thread(target=post_stream, args=(base, bodies[i], os.path.join(out, "r%d.txt" % (i + 1))))
               for i in range(3)]
    threads[0].start()
    threads[1].start()
    m = Metrics(base)
    while threads[0].is_alive() and threads[1].is_alive():
        if m.get().get("requests_running") == 2:
            break
        time.sleep(0.005)  # pacing only: the poll must not take the server's cores
    threads[2].start()
    waited, slow, offl = 0, 0, 0
    while threads[0].is_alive() or threads[1].is_alive():
        s = m.get()
        waited = waited or int(s.get("requests_waiting", 0) == 1)
        slow = max(slow, int(s.get("kv_bytes_slow", 0)))
        offl = max(offl, int(s.get("kv_layers_offloaded", 0)))
        time.sleep(0.005)
    for t in threads:
        t.join()
    print("waited %d slow %d offloaded %d" % (waited, slow, offl))


if __name__ == "__main__":
    main()
