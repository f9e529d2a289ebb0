"""A TCP proxy in front of airlock that loses answers on purpose, for the retry tests.

Each request is read whole, and then, by the proxy's plan for it: forwarded and its answer
passed back ("pass"); forwarded, and the connection closed before the answer is passed
back — the request committed, the reply was lost ("drop"); or answered 503
store_unavailable without forwarding ("503"). It records every request's method, path and
headers.
"""

import socket
import threading
from typing import Dict, List, Tuple


def _read_message(sock: socket.socket) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return buf
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


class LossyProxy:
    def __init__(self, upstream: str) -> None:
        host, port = upstream.replace("http://", "").split(":")
        self.upstream = (host, int(port))
        self.plan: List[str] = []  # consumed one per request; then "pass"
        self.seen: List[Tuple[str, str, Dict[str, str]]] = []
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            req = _read_message(conn)
            if not req:
                return
            head = req.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
            method, path, _ = head[0].split(" ", 2)
            headers = {}
            for line in head[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            with self.lock:
                self.seen.append((method, path, headers))
                mode = self.plan.pop(0) if self.plan else "pass"
            if mode == "503":
                body = b'{"error":"store_unavailable","message":"test: the database is away"}'
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
                             b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                return
            # One request per connection upstream: the answer ends when airlock closes it.
            req = req.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1) if b"connection:" not in req.lower() else req
            with socket.create_connection(self.upstream) as up:
                up.sendall(req)
                answer = b""
                while True:
                    chunk = up.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            if mode == "drop":
                return  # the request ran; its answer never arrives
            conn.sendall(answer)

    def close(self) -> None:
        self.sock.close()
