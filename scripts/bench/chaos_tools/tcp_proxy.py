"""CuttingProxy: a TCP proxy on 127.0.0.1 between one worker and the coordinator (one proxy per worker, so a
connection's owner is known) that can cut that worker's connections in the middle of a push.

arm_cut() arms it; the next upstream read of at least `push_bytes` bytes starts a push (pushes stream pseudo-gradient
chunks; the worker's heartbeats, joins and pull requests are a few hundred bytes); once a random number of bytes in
[push_bytes, cut_max_bytes] (drawn from `seed`; keep cut_max_bytes below the model's push size) of it went through,
every connection of the worker is reset (RST, SO_LINGER 0): the coordinator holds a push that broke off mid-stream,
the worker sees its call fail. on_cut(proxy) is called from the proxy's thread when that happens.
Each proxy runs one thread (selectors); arm_cut/disarm/armed are thread-safe (an Event)."""
import random
import selectors
import socket
import struct
import threading


class CuttingProxy:
    def __init__(self, upstream_port, seed=0, push_bytes=4096, cut_max_bytes=128 << 10, on_cut=None):
        self.upstream_port = upstream_port
        self.push_bytes = push_bytes
        self.cut_max_bytes = cut_max_bytes
        self._rng = random.Random(seed)
        self._cut_left = None  # bytes of the push still to forward before the cut (proxy thread only)
        self.on_cut = on_cut
        self.cuts = 0
        self._armed = threading.Event()
        self._stop = threading.Event()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._peer = {}  # socket -> (other socket, is upstream direction: client -> coordinator)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def arm_cut(self):
        self._armed.set()

    def disarm(self):  # (a cut already under way still happens)
        self._armed.clear()

    def armed(self):
        return self._armed.is_set()

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)

    def _accept(self):
        client, _ = self._listener.accept()
        up = socket.socket()
        try:
            up.connect(("127.0.0.1", self.upstream_port))  # refused while the coordinator is down: the worker retries
        except OSError:
            _reset(client)
            up.close()
            return
        for s in (client, up):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._peer[client] = (up, True)
        self._peer[up] = (client, False)
        self._sel.register(client, selectors.EVENT_READ, None)
        self._sel.register(up, selectors.EVENT_READ, None)

    def _drop(self, s, reset=False):
        other, _ = self._peer.pop(s, (None, None))
        for x in (s, other):
            if x is None:
                continue
            self._peer.pop(x, None)
            try:
                self._sel.unregister(x)
            except (KeyError, ValueError):
                pass
            _reset(x) if reset else x.close()

    def _cut_all(self):
        for s in list(self._peer):
            if s in self._peer:
                self._drop(s, reset=True)

    def _loop(self):
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.1):
                s = key.fileobj
                if s is self._listener:
                    self._accept()
                    continue
                if s not in self._peer:
                    continue
                other, upstream = self._peer[s]
                try:
                    data = s.recv(1 << 16)
                except OSError:
                    data = b""
                if not data:
                    self._drop(s)
                    continue
                if upstream and self._cut_left is None and len(data) >= self.push_bytes and self._armed.is_set():
                    self._cut_left = self._rng.randint(self.push_bytes, self.cut_max_bytes)
                if upstream and self._cut_left is not None:
                    if len(data) < self._cut_left:
                        self._cut_left -= len(data)
                    else:
                        _send_all(other, data[:self._cut_left])
                        self._cut_left = None
                        self._armed.clear()
                        self._cut_all()
                        self.cuts += 1
                        if self.on_cut:
                            self.on_cut(self)
                        continue
                if not _send_all(other, data):
                    self._drop(s)
        self._cut_all()
        self._listener.close()


def _send_all(s, data):
    s.setblocking(True)  # the peer is local and reads promptly; a short blocking send keeps the order simple
    s.settimeout(10)
    try:
        s.sendall(data)
        return True
    except OSError:
        return False
    finally:
        s.setblocking(False)


def _reset(s):
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    s.close()
