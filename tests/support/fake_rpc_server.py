"""Something on a worker's RPC port that is not the RPC server the head needs, for the head's failure tests.

    python3 fake_rpc_server.py MODE PORT [--host H] [--version X.Y.Z]

Modes (what llama.cpp's ggml-rpc client meets at the worker's address):

- ``garbage``: a plain TCP listener that writes text that is not RPC and closes (the client aborts:
  ``Remote RPC server crashed or returned malformed response``);
- ``close``: accepts and closes at once, saying nothing (the same abort);
- ``version``: answers the RPC hello with another protocol version (``RPC server version mismatch``);
- ``nodevices``: a well-formed RPC server of the client's protocol that offers no device: llama-server adds no
  device for it and loads the whole model on the head, logging nothing about it.

``FakeRpcServer`` runs one in a thread of the test itself.
"""
from __future__ import annotations

import argparse
import socket
import struct
import threading

RPC_CMD_HELLO = 14
RPC_CMD_DEVICE_COUNT = 15
CAPS = 24
GARBAGE = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nthis is not an RPC server\n"


def _recv(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def serve_rpc(conn, version, devices):
    """Answer the hello with ``version`` and DEVICE_COUNT with ``devices``; anything else ends the connection."""
    while True:
        head = _recv(conn, 9)
        if head is None:
            return
        cmd, size = struct.unpack("<BQ", head)
        if size and _recv(conn, size) is None:
            return
        if cmd == RPC_CMD_HELLO:
            conn.sendall(struct.pack("<Q", 4 + CAPS) + bytes(version) + b"\0" + b"\0" * CAPS)
        elif cmd == RPC_CMD_DEVICE_COUNT:
            conn.sendall(struct.pack("<QI", 4, devices))
        else:
            return


class FakeRpcServer:
    """One of the modes above on ``host:port`` (port 0: any free one), served by a daemon thread."""

    def __init__(self, mode, port=0, host="127.0.0.1", version=(8, 0, 0), devices=None):
        assert mode in ("garbage", "close", "version", "nodevices"), mode
        # an RPC server of another protocol has its device; the `nodevices` one offers none
        self.mode, self.version = mode, tuple(version)
        self.devices = devices if devices is not None else (0 if mode == "nodevices" else 1)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.endpoint = "%s:%d" % (host, self.port)
        self.connections = 0
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        try:
            conn.settimeout(30)
            if self.mode == "garbage":
                conn.sendall(GARBAGE)
            elif self.mode in ("version", "nodevices"):
                serve_rpc(conn, self.version, self.devices)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["garbage", "close", "version", "nodevices"])
    ap.add_argument("port", type=int)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--version", default="8.0.0")
    args = ap.parse_args()
    server = FakeRpcServer(args.mode, args.port, args.host, [int(x) for x in args.version.split(".")])
    print("listening on %s (%s)" % (server.endpoint, args.mode), flush=True)
    server.thread.join()


if __name__ == "__main__":
    main()
