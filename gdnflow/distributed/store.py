"""A TCP store for launchers that are not MPI (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

Rank 0 listens at MASTER_ADDR:MASTER_PORT and every other rank connects to it
(a star, stdlib sockets only). Each message is a length-prefixed pickle of
``("data", value)`` or ``("fail", rank, message)``. A collective is an
all-gather through rank 0: each rank sends its value, rank 0 reads them in
rank order and sends the list back. All-reduce and broadcast of NumPy arrays
are built on it (sums taken in rank order, so every rank gets the same bits);
it carries little data fast, which is what it is for: the NCCL unique id, the
start-up checks, NumPy runs of a few processes.

Failures: rank 0 reads each rank with the deadline; a rank that sent a
failure notice, closed its connection (died) or did not answer in time is
named in a notice that rank 0 forwards to the others before it raises. The
other ranks wait for rank 0 a little longer than the deadline, so that they
hear rank 0's verdict rather than blame rank 0.
"""
import pickle
import socket
import struct
import time

from gdnflow.distributed.transport import Done, Transport
from gdnflow.distributed.world import DistributedError

#: Extra seconds a rank other than 0 waits for rank 0's answer.
RELAY_GRACE = 5.0
_LENGTH = struct.Struct("!Q")


class StoreTransport(Transport):
    """Host collectives through rank 0's TCP store; see the module docstring."""

    name = "store"

    def __init__(self, rank, size, local_rank, address, timeout):
        self.rank, self.size, self.local_rank, self.timeout = rank, size, local_rank, timeout
        self.peers = {}     # rank -> socket (on rank 0: every other rank; elsewhere: {0: rank 0})
        if rank == 0:
            self._accept(address)
        else:
            self._connect(address)

    @classmethod
    def from_environ(cls, environ, timeout):
        """The transport the launcher's variables describe."""
        address = (environ["MASTER_ADDR"], int(environ["MASTER_PORT"]))
        rank, size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        if not 0 <= rank < size:
            raise DistributedError(f"RANK={rank} is not in 0..WORLD_SIZE-1={size - 1}")
        return cls(rank, size, int(environ["LOCAL_RANK"]), address, timeout)

    # ------------------------------------------------------------ set-up --
    def _accept(self, address):
        server = socket.create_server(address, reuse_port=False)
        server.settimeout(self.timeout)
        try:
            while len(self.peers) < self.size - 1:
                try:
                    connection, _ = server.accept()
                except socket.timeout:
                    missing = sorted(set(range(1, self.size)) - set(self.peers))
                    raise DistributedError(
                        f"rank 0: ranks {missing} did not connect to {address[0]}:{address[1]} "
                        f"within {self.timeout:g} s", failed_rank=missing[0]) from None
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.peers[self._receive(connection, None)[1]] = connection
        finally:
            server.close()

    def _connect(self, address):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                connection = socket.create_connection(address, timeout=self.timeout)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise DistributedError(
                        f"rank {self.rank}: could not reach rank 0's store at "
                        f"{address[0]}:{address[1]} within {self.timeout:g} s ({exc})",
                        failed_rank=0) from exc
                time.sleep(0.1)
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peers[0] = connection
        self._send(connection, ("data", self.rank))

    # ------------------------------------------------------- collectives --
    def all_gather_object(self, obj):
        if self.rank != 0:
            self._send(self.peers[0], ("data", obj))
            return self._receive(self.peers[0], 0, self.timeout + RELAY_GRACE)[1]
        values = [obj]
        for peer in range(1, self.size):
            values.append(self._receive(self.peers[peer], peer)[1])
        for peer in range(1, self.size):
            self._send(self.peers[peer], ("data", values))
        return values

    def start_all_reduce(self, array):
        arrays = self.all_gather_object(array)
        total = arrays[0].copy()
        for other in arrays[1:]:
            total += other
        array[...] = total
        return Done()

    def broadcast_array(self, array, root):
        array[...] = self.all_gather_object(array if self.rank == root else None)[root]

    # ------------------------------------------------------------ failure --
    def report_failure(self, message):
        self._tell_others(("fail", self.rank, message))

    def abort(self, code):
        time.sleep(0.2)         # let a notice leave before the connection closes
        for connection in self.peers.values():
            connection.close()

    def _tell_others(self, notice):
        """Send a failure notice to rank 0 (or, on rank 0, to every rank), ignoring dead peers."""
        for connection in self.peers.values():
            try:
                self._send(connection, notice)
            except OSError:
                pass

    # ------------------------------------------------------------- frames --
    def _send(self, connection, message):
        data = pickle.dumps(message)
        connection.sendall(_LENGTH.pack(len(data)) + data)

    def _receive(self, connection, peer, timeout=None):
        """The next message from ``peer``; a failure (theirs, or found here) is raised."""
        connection.settimeout(timeout or self.timeout)
        try:
            header = self._read(connection, _LENGTH.size)
            message = pickle.loads(self._read(connection, _LENGTH.unpack(header)[0]))
        except socket.timeout:
            error = DistributedError(
                f"rank {self.rank}: rank {peer} did not answer within {self.timeout:g} s "
                "(stuck, or busy outside gdnflow's collectives)", failed_rank=peer)
        except (ConnectionError, EOFError) as exc:
            error = DistributedError(f"rank {self.rank}: rank {peer} closed its connection "
                                     f"(it died or ended: {exc})", failed_rank=peer)
        else:
            if message[0] != "fail":
                return message
            error = DistributedError(f"rank {self.rank}: rank {message[1]} failed: {message[2]}",
                                     failed_rank=message[1], from_peer=True)
        if self.rank == 0:      # pass the verdict on before raising it here
            self._tell_others(("fail", error.failed_rank, str(error)))
            error.from_peer = True
        raise error

    @staticmethod
    def _read(connection, count):
        chunks = []
        while count:
            chunk = connection.recv(min(count, 1 << 20))
            if not chunk:
                raise EOFError("connection closed")
            chunks.append(chunk)
            count -= len(chunk)
        return b"".join(chunks)

