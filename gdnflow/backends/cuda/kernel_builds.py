"""Compiling CUDA modules in parallel: a pool of nvcc runs, and the modules compiled ahead.

Pure Python (no PyCUDA). :class:`Builds` hands out cubins for one GPU
architecture from a :class:`~gdnflow.backends.cuda.kernel_cache.KernelCache`.
A warm cache costs a hash of the source and a file read per module, and
starts no process. The first miss of a process also queues every module
of :func:`prefetch_list` that is not on disk yet to a pool of nvcc runs (in
the background, one line on stderr says so), so that the operators that come
next find their module compiled or compiling; a module asked for waits only
for itself, and one still queued is compiled at once by the thread asking.

Operators whose file is always loaded with some ``-D`` defines say which with
:func:`declare_variants`, so the prefetch compiles those instead of the plain
module. Variants built for a layer's shape are known only once it runs: a
:class:`Builds` that knows its GPU's SM count journals each one it had to
compile on demand, and its prefetch queues the journaled ones too
(:mod:`~gdnflow.backends.cuda.variant_journal`).
"""
import atexit
import os
import queue
import sys
import threading

from gdnflow.backends.cuda import variant_journal
from gdnflow.backends.cuda.sources import source_files

_declared = {}      # file name -> the define tuples it is loaded with (declare_variants)


def declare_variants(file, *variants):
    """Say that ``file`` (a name in ``cuda_src/``) is loaded with these define tuples.

    The prefetch then compiles ``file`` once per tuple (``()``: no defines)
    instead of once without defines; declare only variants known when the
    operator module is imported (not per-shape ones).
    """
    _declared[str(file)] = [tuple(sorted(defines)) for defines in variants]


def prefetch_list():
    """(file name, defines) of every module of gdnflow's own ``cuda_src`` worth compiling ahead."""
    return [(path.name, defines) for path in source_files()
            for defines in _declared.get(path.name, [()])]


def default_workers():
    """nvcc runs at a time: one per CPU core, at most 16."""
    return max(1, min(os.cpu_count() or 1, 16))


class Job:
    """The compilation of one module: queued, then run once by a worker or by who asks first."""

    def __init__(self, file, defines, key):
        self.file, self.defines, self.key = file, defines, key
        self.cubin = self.error = None
        self._claimed = False
        self._claim_lock = threading.Lock()
        self._done = threading.Event()

    def claim(self):
        """True for the first caller only: that caller must :meth:`run` the job."""
        with self._claim_lock:
            claimed, self._claimed = self._claimed, True
        return not claimed

    def run(self, cache, arch):
        """Fetch or compile the cubin; keep the error instead if it fails."""
        try:
            self.cubin = cache.cubin(self.file, self.defines, arch, self.key)
        except Exception as exc:      # kept for whoever asks for this module
            self.error = exc
        finally:
            self._done.set()

    def result(self):
        """Wait for the job; the cubin, or the error it ended with, raised."""
        self._done.wait()
        if self.error is not None:
            raise self.error
        return self.cubin


class Builds:
    """Cubins for ``arch`` from ``cache``, compiled ``workers`` at a time where missing.

    ``announce(text)`` is called once, at the first miss (default: a line on
    stderr); ``prefetch`` is the list queued then (default :func:`prefetch_list`;
    empty: compile only what is asked for). With ``sm_count`` (the GPU's SMs)
    the variants journaled for (``arch``, ``sm_count``) are queued too, from
    the cache's journal and from ``shipped`` (default
    :data:`~gdnflow.backends.cuda.variant_journal.SHIPPED`), and each module
    of gdnflow's own sources compiled on demand that none of those listed is
    appended to the cache's journal. :attr:`loaded` holds every (file,
    defines) handed out, in order (``benchmarks/record_variants.py`` reads it).
    """

    def __init__(self, cache, arch, workers=None, announce=None, prefetch=None, sm_count=None,
                 shipped=variant_journal.SHIPPED):
        self.cache, self.arch, self.sm_count, self.shipped = cache, arch, sm_count, shipped
        self.workers = workers or default_workers()
        self.announce = announce if announce is not None else _print_to_stderr
        self.prefetch = prefetch
        self.loaded = {}
        self._jobs = {}
        self._queue = queue.SimpleQueue()
        self._threads = []
        self._missed = False
        self._known = set()         # keys the prefetch listed or this process journaled
        self._lock = threading.Lock()

    def cubin(self, file, defines=()):
        """The cubin of ``file`` with ``defines``: from disk, else compiled (and kept)."""
        self.loaded[file, defines] = None
        key = self.cache.key(file, defines, self.arch)
        cubin = self.cache.lookup(key, self.arch)
        if cubin is not None:
            return cubin
        self._first_miss(file, defines)
        job = self.submit(file, defines, key)
        if job.claim():
            job.run(self.cache, self.arch)
        cubin = job.result()
        self._journal(file, defines, key)
        return cubin

    def journal(self):
        """The path of the cache's journal this instance reads and appends to (None without
        ``sm_count``)."""
        if self.sm_count is None:
            return None
        return variant_journal.journal_path(self.cache.folder, self.arch, self.sm_count)

    def prefetch_variants(self):
        """(file, defines) of every module the first miss queues (where not on disk yet):
        ``prefetch``, then the variants journaled for this architecture and SM count."""
        variants = prefetch_list() if self.prefetch is None else list(self.prefetch)
        if self.sm_count is not None:
            variants += variant_journal.journaled_variants(self.cache.folder, self.arch,
                                                           self.sm_count, self.shipped)
        return variants

    def submit(self, file, defines=(), key=None):
        """Queue ``file`` with ``defines`` for the pool (once per module); its :class:`Job`."""
        key = key or self.cache.key(file, defines, self.arch)
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                job = self._jobs[key] = Job(file, defines, key)
                self._queue.put(job)
                self._start_workers()
        return job

    def build(self, variants):
        """Yield (file, defines, "cached" or "compiled", error or None) for each of ``variants``.

        All missing modules (a damaged entry counts as missing) are queued at once and
        reported in the order given.
        """
        keys = [self.cache.key(file, defines, self.arch) for file, defines in variants]
        cached = [self.cache.lookup(key, self.arch) is not None for key in keys]
        jobs = [None if hit else self.submit(file, defines, key)
                for (file, defines), key, hit in zip(variants, keys, cached)]
        for (file, defines), job in zip(variants, jobs):
            if job is None:
                yield file, defines, "cached", None
                continue
            try:
                job.result()
                yield file, defines, "compiled", None
            except Exception as exc:      # reported per module; the caller decides
                yield file, defines, "failed", exc

    def close(self):
        """Drop the queued modules, end the nvcc runs under way and stop the workers."""
        self.cache.stop()
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            thread.join(timeout=1.0)

    def _first_miss(self, file, defines):
        with self._lock:
            first, self._missed = not self._missed, True
        if not first:
            return
        keyed = {self.cache.key(f, d, self.arch): (f, d) for f, d in self.prefetch_variants()}
        with self._lock:
            self._known.update(keyed)
        missing = [(f, d, key) for key, (f, d) in keyed.items()
                   if not self.cache.path(key, self.arch).is_file()]
        count = len(missing) + ((str(file), tuple(defines)) not in
                                {(str(f), tuple(d)) for f, d, _ in missing})
        self.announce(f"gdnflow: compiling {count} CUDA kernel module"
                      f"{'s' if count != 1 else ''} for {self.arch} (first run; cached in "
                      f"{self.cache.folder}) ...")
        for f, d, key in missing:
            self.submit(f, d, key)

    def _journal(self, file, defines, key):
        """Append a module compiled on demand to the journal, unless the prefetch listed it,
        it was journaled already, or it is not one of gdnflow's own sources."""
        path = self.journal()
        if path is None:
            return
        with self._lock:
            known = key in self._known
            self._known.add(key)
        name = variant_journal.own_source_name(file)
        # A fused elementwise program is a variant of one plan's, not worth compiling ahead
        # in every later process (and there is no bound on how many a machine sees).
        if not known and name is not None and "FUSED_PROGRAM" not in dict(defines):
            variant_journal.append(path, name, defines)

    def _start_workers(self):
        # Called with self._lock held, after queueing a job.
        if len(self._threads) >= self.workers:
            return
        if not self._threads:
            atexit.register(self.close)
        thread = threading.Thread(target=self._work, name="gdnflow-nvcc", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _work(self):
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.claim():
                job.run(self.cache, self.arch)


def _print_to_stderr(text):
    print(text, file=sys.stderr, flush=True)
