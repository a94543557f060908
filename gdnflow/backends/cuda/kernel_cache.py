"""gdnflow's on-disk cache of compiled CUDA modules (cubins), and the nvcc run that fills it.

Pure Python (no PyCUDA), so CPU machines, CI and ``gdnflow build-kernels``
use it without a GPU. A module is a CUDA source (see
:mod:`~gdnflow.backends.cuda.sources`) compiled with a tuple of ``-D``
defines for one GPU architecture (``"sm_90"``); its cubin is stored under

    $GDNFLOW_KERNEL_CACHE, else $XDG_CACHE_HOME/gdnflow/kernels, else ~/.cache/gdnflow/kernels

as ``<arch>/<key>.cubin``, where the key is the SHA-256 of the expanded
source text, the nvcc options (defines included), the architecture and the
identity of nvcc (:func:`nvcc_identity`). Any change to one of them is a new
key: stale entries are never read, only left behind (delete the folder to
clear it). Entries are written atomically (a temporary file, then a rename),
so concurrent processes can share a cache; each starts with a header holding
the SHA-256 of its cubin, so a truncated or corrupted entry reads as missing
and is compiled again. A cache folder that cannot be written is reported
once (a warning) and modules are compiled without being kept.

A source whose ``__host__`` functions the host runs too (rans.cu's lane coder)
is also built as a shared library for the host (:meth:`KernelCache.host_library`):
``host/<key>.so`` in the same folder, the key made the same way.
"""
import ctypes
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

from gdnflow.errors import BackendUnavailableError, KernelCompileError
from gdnflow.backends.cuda.sources import compile_error_message, expand_source, owner_of, resolve

#: Environment variable naming the cache folder (overrides the XDG default).
CACHE_VARIABLE = "GDNFLOW_KERNEL_CACHE"
#: The options every module is compiled with, before its ``-D`` defines.
NVCC_OPTIONS = ("-O3", "-std=c++17")
#: Start of every entry; the SHA-256 of the cubin follows, then the cubin.
ENTRY_MAGIC = b"gdnflow-cubin-1\n"
#: The cache's folder (in place of an architecture) and nvcc's options for host libraries.
HOST_FOLDER = "host"
#: gdnflow's sources with host entry points (the codec's lanes and grouping:
#: gdnflow/codec/host_lanes.py, device_groups.py), which ``build-kernels`` builds too.
HOST_LIBRARY_SOURCES = ("rans.cu", "table_groups.cu")
HOST_LIBRARY_OPTIONS = ("-x", "cu", "--shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fopenmp")
_DIGEST_BYTES = 32
_SCRIPT_BYTES = 4096    # a wrapper script of nvcc is at most this long (the binary is MBs)


def default_folder(environ=None):
    """The cache folder: ``$GDNFLOW_KERNEL_CACHE``, else under ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_VARIABLE):
        return Path(environ[CACHE_VARIABLE]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or Path("~/.cache").expanduser()
    return Path(base) / "gdnflow" / "kernels"


def find_nvcc():
    """The resolved path of nvcc (from PATH, else ``$CUDA_HOME/bin``), or None if there is none."""
    found = shutil.which("nvcc")
    if found is None:
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        candidate = Path(home) / "bin" / "nvcc"
        found = str(candidate) if candidate.is_file() else None
    return None if found is None else str(Path(found).resolve())


def nvcc_identity(nvcc):
    """What tells one nvcc from another in a cache key: its resolved path, size and mtime.

    ``nvcc --version`` would say it in words, but costs a process start (what
    made PyCUDA's warm cache slow); a stat costs microseconds. A CUDA upgrade
    replaces the nvcc binary (new size or mtime), so its entries are new keys;
    copies of one installation (a container image, packages of one release)
    keep the mtime and so share entries. Where nvcc is a wrapper script
    (``exec /usr/local/cuda-13.0/bin/nvcc "$@"``) its text counts too: it
    names the toolkit it runs.
    """
    if not nvcc:
        return "no nvcc"
    try:
        stat = os.stat(nvcc)
        identity = f"{nvcc} {stat.st_size} {stat.st_mtime_ns}"
        if stat.st_size <= _SCRIPT_BYTES:
            with open(nvcc, "rb") as handle:
                head = handle.read(_SCRIPT_BYTES)
            if head.startswith(b"#!"):
                identity += " " + head.decode(errors="replace")
    except OSError as exc:      # compiling will say what is wrong with it
        identity = f"{nvcc} ({exc.strerror})"
    return identity


#: A module whose defines set this to 1 is compiled for its architecture's arch-specific
#: target (sm_90 -> sm_90a), where Hopper's wgmma exists; the cubin runs only on that
#: architecture (the cache's folder is still the plain one: the define is in the key).
ARCH_SPECIFIC_DEFINE = "ARCH_SPECIFIC"


def nvcc_arch(arch, defines):
    """The ``-arch`` nvcc gets for a module of ``defines`` on ``arch``: ``arch`` itself, or
    its arch-specific target (``sm_90`` -> ``sm_90a``) where :data:`ARCH_SPECIFIC_DEFINE` is
    set and ``arch`` is a plain one (an ``sm_90a`` or ``sm_100f`` given is kept)."""
    if (ARCH_SPECIFIC_DEFINE, 1) in tuple(defines) and re.fullmatch(r"sm_\d+", arch):
        return f"{arch}a"
    return arch


def nvcc_options(defines):
    """The nvcc options of a module built with ``defines`` ((NAME, value) pairs)."""
    # nvcc splits an option's value at commas: a comma within a define's value is escaped.
    return list(NVCC_OPTIONS) + [f"-D{name}={str(value).replace(',', chr(92) + ',')}"
                                 for name, value in defines]


class NvccRunner:
    """Runs nvcc command lines: ``runner(argv)`` is (exit status, stderr and stdout).

    Keeps the processes under way so that :meth:`stop` can end them: a
    process exiting while modules compile in the background need not wait
    for them (nor leave nvcc running on its temporary files).
    """

    def __init__(self):
        self._running = set()
        self._stopped = False
        self._lock = threading.Lock()

    def __call__(self, argv):
        # nvcc's own temporary files go to a folder removed after the run: a killed nvcc
        # leaves its tmpxft_* files behind.
        with tempfile.TemporaryDirectory(prefix="gdnflow-nvcc-") as scratch:
            with self._lock:
                if self._stopped:
                    return 1, "not started: gdnflow is exiting"
                try:
                    # A process group of its own, so that stop() reaches the cicc and
                    # ptxas nvcc starts (they would compile on, holding the pipe open).
                    process = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True,
                                               start_new_session=True,
                                               env=dict(os.environ, TMPDIR=scratch))
                except OSError as exc:
                    return 127, f"cannot run {argv[0]}: {exc.strerror}"
                self._running.add(process)
            try:
                output, _ = process.communicate()
            except BaseException:   # Ctrl-C: nvcc, in a session of its own, did not get it
                _kill_group(process)
                raise
            finally:
                with self._lock:
                    self._running.discard(process)
        return process.returncode, output

    def stop(self):
        """Kill the nvcc runs under way (with the processes they started) and refuse new ones."""
        with self._lock:
            self._stopped = True
            for process in self._running:
                _kill_group(process)


def _kill_group(process):
    """Kill ``process`` and the processes it started (its process group)."""
    if process.poll() is None:      # not reaped: the group id is still its own
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


#: Per host library's path: the lock held while it is found or built (one build at a time
#: per library; different libraries build at once).
_HOST_BUILDS = {}
_HOST_BUILDS_LOCK = threading.Lock()


def _host_build_lock(path):
    with _HOST_BUILDS_LOCK:
        return _HOST_BUILDS.setdefault(path, threading.Lock())


class KernelCache:
    """Cubins on disk by key, compiled with nvcc on a miss.

    ``folder`` defaults to :func:`default_folder`; ``nvcc`` to
    :func:`find_nvcc` (``""``: there is none, compiling raises); ``run`` runs an nvcc command line and returns
    (exit status, output) (a new :class:`NvccRunner`; a test passes one
    that counts).
    Thread-safe: each method works on its own files.
    """

    def __init__(self, folder=None, nvcc=None, run=None):
        self.folder = Path(folder) if folder is not None else default_folder()
        self.nvcc = nvcc if nvcc is not None else find_nvcc()
        self.run = run if run is not None else NvccRunner()
        self.identity = nvcc_identity(self.nvcc)
        self._unwritable_reported = False
        self._lock = threading.Lock()

    def stop(self):
        """End the nvcc runs under way and refuse new ones (where the runner can: NvccRunner)."""
        stop = getattr(self.run, "stop", None)
        if stop is not None:
            stop()

    def key(self, file, defines, arch):
        """The hex SHA-256 naming the module of ``file`` built with ``defines`` for ``arch``."""
        digest = hashlib.sha256()
        # Options joined by NUL: a define's value may hold spaces (a fused program's text).
        for part in (expand_source(file), "\0".join(nvcc_options(defines)), arch, self.identity):
            digest.update(part.encode())
            digest.update(b"\0")
        return digest.hexdigest()

    def path(self, key, arch):
        """Where the entry of ``key`` for ``arch`` lives (whether or not it exists)."""
        return self.folder / arch / f"{key}.cubin"

    def lookup(self, key, arch):
        """The cubin stored under ``key``, or None if it is missing, truncated or corrupted."""
        try:
            data = self.path(key, arch).read_bytes()
        except OSError:
            return None
        header = len(ENTRY_MAGIC) + _DIGEST_BYTES
        cubin = data[header:]
        if (not data.startswith(ENTRY_MAGIC) or not cubin
                or hashlib.sha256(cubin).digest() != data[len(ENTRY_MAGIC):header]):
            return None
        return cubin

    def store(self, key, arch, cubin):
        """Write ``cubin`` under ``key`` atomically; warn once (and keep going) if it cannot."""
        return self._write(self.path(key, arch),
                           ENTRY_MAGIC + hashlib.sha256(cubin).digest() + cubin)

    def _write(self, path, data):
        """Write ``data`` to ``path`` atomically (a temporary file renamed); False, after one
        warning per cache, where the folder cannot be written."""
        temporary = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}-",
                                                 suffix=".tmp")
            os.fchmod(handle, 0o644)        # mkstemp's 0600 would hide a shared cache
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temporary, path)
        except OSError as exc:
            if temporary is not None:
                Path(temporary).unlink(missing_ok=True)
            with self._lock:
                reported, self._unwritable_reported = self._unwritable_reported, True
            if not reported:
                warnings.warn(f"gdnflow: cannot write the kernel cache {self.folder} "
                              f"({exc.strerror or exc}); CUDA modules are compiled without "
                              f"being kept (set {CACHE_VARIABLE} to a writable folder)",
                              RuntimeWarning, stacklevel=2)
            return False
        return True

    def cubin(self, file, defines, arch, key=None):
        """The cubin of ``file`` with ``defines`` for ``arch``: from disk, else compiled and kept."""
        key = key or self.key(file, defines, arch)
        cubin = self.lookup(key, arch)
        if cubin is None:
            cubin = self.compile(file, defines, arch)
            self.store(key, arch, cubin)
        return cubin

    def host_path(self, file):
        """Where :meth:`host_library` keeps ``file``'s library (whether or not it exists)."""
        key = self.key(file, (), " ".join((HOST_FOLDER, *HOST_LIBRARY_OPTIONS)))
        return self.folder / HOST_FOLDER / f"{key}.so"

    def build_host_libraries(self, sources=HOST_LIBRARY_SOURCES):
        """[(source, outcome, error)]: each of ``sources``' host library built or found
        (outcome "compiled", "cached" or "failed"; error the KernelCompileError or None)."""
        results = []
        for source in sources:
            cached = self.host_path(source).is_file()
            try:
                self.host_library(source)
            except (KernelCompileError, OSError) as error:     # OSError: it does not load
                results.append((source, "failed", error))
                continue
            results.append((source, "cached" if cached else "compiled", None))
        return results

    def host_library(self, file):
        """``file``'s host functions as a loaded ``ctypes.CDLL``: the shared library that
        ``nvcc -x cu --shared`` (with OpenMP) builds of the expanded source, from the cache,
        else built and kept (a kept library that does not load, e.g. truncated, is built
        again). One build of a library at a time in a process: threads asking for it at
        once wait for the first's. Raises :class:`BackendUnavailableError` without nvcc,
        :class:`KernelCompileError` where nvcc fails."""
        path = self.host_path(file)
        with _host_build_lock(path):
            return self._host_library(file, path)

    def _host_library(self, file, path):
        if path.is_file():
            try:
                return ctypes.CDLL(str(path))
            except OSError:
                pass
        if not self.nvcc:
            raise BackendUnavailableError(
                f"nvcc is not on PATH (nor in $CUDA_HOME/bin): cannot build {file} for the host")
        with tempfile.TemporaryDirectory(prefix="gdnflow-nvcc-") as folder:
            _, output = self._run_nvcc(file, folder, "library.so",
                                       [*HOST_LIBRARY_OPTIONS, *nvcc_options(())])
            # Loaded from the scratch copy: the library stays mapped after the folder goes,
            # so an unwritable cache costs a build per process, not a failure.
            library = ctypes.CDLL(str(output))
            self._write(path, output.read_bytes())
        return library

    def compile(self, file, defines, arch, owner=None):
        """Compile ``file`` (its header expanded) with ``defines`` for ``arch``; the cubin.

        ``nvcc --cubin -arch=<arch> -O3 -std=c++17 -D...``, as PyCUDA's
        SourceModule ran it (``no_extern_c``: the source is compiled as it
        is). Raises :class:`KernelCompileError` naming the real file (not the
        temporary copy), its owner (``owner``, else the one
        :func:`~gdnflow.backends.cuda.sources.owner_of` finds), the line and
        the defines.
        """
        return self.compile_with_ptx(file, defines, arch, owner, keep_ptx=False)[0]

    def compile_with_ptx(self, file, defines, arch, owner=None, keep_ptx=True):
        """(cubin, PTX text) of ``file``, as :meth:`compile` builds it; the PTX is the one nvcc
        made on the way (``--keep``: no second run), None unless ``keep_ptx``."""
        if not self.nvcc:
            raise BackendUnavailableError(
                f"nvcc is not on PATH (nor in $CUDA_HOME/bin): cannot compile {file}")
        with tempfile.TemporaryDirectory(prefix="gdnflow-nvcc-") as folder:
            keep = ["--keep", "--keep-dir", folder] if keep_ptx else []
            source, output = self._run_nvcc(
                file, folder, "module.cubin",
                ["--cubin", f"-arch={nvcc_arch(arch, defines)}", *nvcc_options(defines), *keep],
                defines, owner)
            ptx = source.with_suffix(".ptx").read_text() if keep_ptx else None
            return output.read_bytes(), ptx

    def _run_nvcc(self, file, folder, output_name, options, defines=(), owner=None):
        """(source, output) paths in ``folder``: ``file`` expanded there and nvcc run on it
        with ``options``, writing ``output_name``; KernelCompileError naming the real file
        (not the temporary copy), its owner, the line and ``defines`` where nvcc fails."""
        path = resolve(file)
        source = Path(folder) / Path(str(path)).name
        source.write_text(expand_source(file))
        output = Path(folder) / output_name
        status, text = self.run([self.nvcc, *options, "-o", str(output), str(source)])
        if status != 0 or not output.is_file():
            raise KernelCompileError(compile_error_message(
                path, text.replace(str(source), str(path)), defines, owner or owner_of(path)))
        return source, output
