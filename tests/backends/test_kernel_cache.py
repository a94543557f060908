"""The on-disk cubin cache and the nvcc pool (CPU: nvcc only; one GPU test loads a cubin)."""
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import gdnflow as gf
from gdnflow.backends.cuda import variant_journal
from gdnflow.backends.cuda.kernel_builds import Builds, prefetch_list
from gdnflow.backends.cuda.kernel_cache import CACHE_VARIABLE, KernelCache, NvccRunner
from gdnflow.backends.cuda.sources import InlineSource
from gdnflow.cli import main
from gdnflow.errors import BackendUnavailableError, KernelCompileError

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

SMALL = InlineSource('extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n',
                     "small.cu")
OTHER = InlineSource('extern "C" __global__ void thrice(float* x) { x[threadIdx.x] *= 3.0f; }\n',
                     "other.cu")


class CountingRunner:
    """An nvcc runner that counts its runs (and can be slowed, to show runs overlapping)."""

    def __init__(self, delay=0.0):
        self.calls, self.delay, self.running, self.most_at_once = [], delay, 0, 0
        self._runner, self._lock = NvccRunner(), threading.Lock()

    def __call__(self, argv):
        with self._lock:
            self.calls.append(argv)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(self.delay)
        try:
            return self._runner(argv)
        finally:
            with self._lock:
                self.running -= 1


def writing_nvcc(cubin, calls):
    """A stand-in for nvcc that writes ``cubin`` where ``-o`` says and appends its argv to ``calls``."""
    def run(argv):
        calls.append(argv)
        with open(argv[argv.index("-o") + 1], "wb") as out:
            out.write(cubin)
        return 0, ""
    return run


@needs_nvcc
def test_a_miss_compiles_and_stores_and_the_next_lookup_runs_no_nvcc(tmp_path):
    runner = CountingRunner()
    cache = KernelCache(tmp_path, run=runner)
    cubin = cache.cubin(SMALL, (), "sm_90")
    assert cubin[:4] == b"\x7fELF" and len(runner.calls) == 1
    assert "--cubin" in runner.calls[0] and "-arch=sm_90" in runner.calls[0]
    key = cache.key(SMALL, (), "sm_90")
    assert cache.path(key, "sm_90").is_file()
    # A new cache object on the same folder (another process) hits without nvcc.
    again = KernelCache(tmp_path, run=runner)
    assert again.cubin(SMALL, (), "sm_90") == cubin and len(runner.calls) == 1


def test_the_key_follows_source_defines_arch_and_nvcc(tmp_path):
    nvcc = tmp_path / "nvcc"
    nvcc.write_bytes(b"\0" * 5000)
    cache = KernelCache(tmp_path, nvcc=str(nvcc))
    base = cache.key(SMALL, (("TILE", 8),), "sm_90")
    assert base == KernelCache(tmp_path, nvcc=str(nvcc)).key(SMALL, (("TILE", 8),), "sm_90")
    assert len({base, cache.key(OTHER, (("TILE", 8),), "sm_90"),
                cache.key(SMALL, (("TILE", 16),), "sm_90"), cache.key(SMALL, (), "sm_90"),
                cache.key(SMALL, (("TILE", 8),), "sm_80")}) == 5
    os.utime(nvcc, ns=(0, 123))          # another nvcc: the same path, another mtime
    assert KernelCache(tmp_path, nvcc=str(nvcc)).key(SMALL, (("TILE", 8),), "sm_90") != base


def test_a_wrapper_script_of_nvcc_counts_by_its_text(tmp_path):
    wrapper = tmp_path / "nvcc"
    keys = []
    for toolkit in ("cuda-13.0", "cuda-13.1"):      # the same size, mtime pinned
        wrapper.write_text(f'#!/bin/sh\nexec /usr/local/{toolkit}/bin/nvcc "$@"\n')
        os.utime(wrapper, ns=(0, 0))
        keys.append(KernelCache(tmp_path, nvcc=str(wrapper)).key(SMALL, (), "sm_90"))
    assert keys[0] != keys[1]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "foreign"])
def test_a_damaged_entry_reads_as_missing_and_is_compiled_again(tmp_path, damage):
    compiled = []
    cache = KernelCache(tmp_path, nvcc="nvcc", run=writing_nvcc(b"CUBIN" * 100, compiled))
    key = cache.key(SMALL, (), "sm_90")
    assert cache.cubin(SMALL, (), "sm_90") == b"CUBIN" * 100
    entry = cache.path(key, "sm_90")
    data = entry.read_bytes()
    entry.write_bytes({"truncate": data[:-7], "flip": data[:-1] + b"X", "empty": b"",
                       "foreign": b"CUBIN" * 120}[damage])
    assert cache.lookup(key, "sm_90") is None
    assert cache.cubin(SMALL, (), "sm_90") == b"CUBIN" * 100 and len(compiled) == 2
    assert entry.read_bytes() == data          # rewritten whole


def test_build_compiles_a_damaged_entry_again_instead_of_reporting_it_cached(tmp_path):
    compiled = []
    cache = KernelCache(tmp_path, nvcc="nvcc", run=writing_nvcc(b"CUBIN", compiled))
    cache.path(cache.key(SMALL, (), "sm_90"), "sm_90").parent.mkdir(parents=True)
    cache.path(cache.key(SMALL, (), "sm_90"), "sm_90").write_bytes(b"truncated")
    builds = Builds(cache, "sm_90", prefetch=[])
    try:
        assert [outcome for *_, outcome, _ in builds.build([(SMALL, ())])] == ["compiled"]
    finally:
        builds.close()
    assert cache.lookup(cache.key(SMALL, (), "sm_90"), "sm_90") == b"CUBIN"


@pytest.mark.parametrize("unwritable", ["read-only", "a file"])
def test_an_unwritable_folder_warns_once_and_still_compiles(tmp_path, unwritable):
    if unwritable == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
    else:                       # a check that holds for root too
        (tmp_path / "file").write_text("not a folder")
        folder = tmp_path / "file" / "kernels"
    compiled = []
    cache = KernelCache(folder, nvcc="nvcc", run=writing_nvcc(b"C", compiled))
    with pytest.warns(RuntimeWarning, match="cannot write the kernel cache") as warned:
        assert cache.cubin(SMALL, (), "sm_90") == b"C"
        assert cache.cubin(OTHER, (), "sm_90") == b"C"
    assert len(warned) == 1 and len(compiled) == 2


def test_a_missing_nvcc_is_a_compile_error_naming_it(tmp_path):
    cache = KernelCache(tmp_path, nvcc=str(tmp_path / "no-nvcc"))
    with pytest.raises(KernelCompileError, match=r"nvcc failed on small\.cu:\ncannot run .*no-nvcc"):
        cache.cubin(SMALL, (), "sm_90")


def _process_gone(pid):
    """True once ``pid`` has ended (gone, or a zombie waiting for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_stopping_the_runner_ends_nvcc_and_the_processes_it_started(tmp_path):
    # nvcc runs cicc and ptxas as child processes: killing nvcc alone left them compiling;
    # and a killed nvcc leaves its tmpxft_* files in $TMPDIR.
    child, scratch = tmp_path / "child.pid", tmp_path / "tmpdir"
    runner = NvccRunner()
    results = []
    nvcc = threading.Thread(target=lambda: results.append(runner(
        ["sh", "-c", f'touch "$TMPDIR/tmpxft_1"; echo "$TMPDIR" > {scratch}; '
                     f"sleep 60 & echo $! > {child}; wait"])))
    nvcc.start()
    deadline = time.monotonic() + 10
    while not (child.is_file() and child.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.stop()
    nvcc.join(10)
    assert results and results[0][0] != 0
    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while not _process_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _process_gone(pid), f"nvcc's child process {pid} still runs"
    nvcc_tmpdir = Path(scratch.read_text().strip())
    assert nvcc_tmpdir.name.startswith("gdnflow-nvcc-") and not nvcc_tmpdir.exists()
    assert runner(["true"]) == (1, "not started: gdnflow is exiting")


@needs_nvcc
def test_a_compile_error_names_the_file_line_and_defines(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(float* x) {\n  x[0] = ;\n}\n')
    cache = KernelCache(tmp_path / "cache")
    with pytest.raises(KernelCompileError) as caught:
        cache.cubin(bad, (("TILE", 4),), "sm_90")
    message = str(caught.value)
    assert message.startswith(f"nvcc failed on {bad}, line 2 (defines {{'TILE': 4}}):\n")
    assert f"{bad}(2): error: expected an expression" in message
    assert "gdnflow-nvcc-" not in message            # the temporary copy is not named
    assert not any((tmp_path / "cache").rglob("*.cubin"))


@needs_nvcc
def test_the_pool_compiles_modules_at_once_and_a_miss_announces_once(tmp_path):
    runner = CountingRunner(delay=0.5)
    lines = []
    third = InlineSource(SMALL.text.replace("twice", "half").replace("2.0f", "0.5f"), "third.cu")
    builds = Builds(KernelCache(tmp_path, run=runner), "sm_90", workers=3,
                    announce=lines.append, prefetch=[(OTHER, ()), (third, ())])
    try:
        builds.cubin(SMALL)                # the first miss queues the other two as well
        cubins = [builds.cubin(OTHER), builds.cubin(third)]
    finally:
        builds.close()
    assert len(runner.calls) == 3 and runner.most_at_once >= 2
    assert lines == [f"gdnflow: compiling 3 CUDA kernel modules for sm_90 (first run; cached "
                     f"in {tmp_path}) ..."]
    assert cubins[0] != cubins[1]
    # A warm start: every module from disk, no nvcc, no announcement.
    warm = Builds(KernelCache(tmp_path, run=runner), "sm_90", announce=lines.append,
                  prefetch=[(OTHER, ()), (third, ())])
    assert [warm.cubin(SMALL), warm.cubin(OTHER), warm.cubin(third)][1:] == cubins
    assert len(runner.calls) == 3 and len(lines) == 1


@needs_nvcc
def test_build_kernels_fills_a_cache_without_a_gpu(tmp_path):
    good = tmp_path / "good.cu"
    good.write_text(SMALL.text)
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k() {\n  int x = ;\n}\n")
    env = dict(os.environ, **{CACHE_VARIABLE: str(tmp_path / "cache")})

    def build_kernels(*files, arch="sm_90"):
        return subprocess.run([sys.executable, "-m", "gdnflow.cli", "build-kernels",
                               "--arch", arch, *map(str, files)],
                              capture_output=True, text=True, env=env, timeout=600)
    first = build_kernels(good, arch="sm_80,sm_90")     # one architecture after the other
    assert first.returncode == 0, first.stderr
    for arch in ("sm_80", "sm_90"):
        assert f"{arch} compiled {good}" in first.stdout
        key = KernelCache(tmp_path / "cache").key(good, (), arch)
        assert (tmp_path / "cache" / arch / f"{key}.cubin").is_file()
    second = build_kernels(good, bad)
    assert second.returncode == 1
    assert f"sm_90 cached   {good}" in second.stdout and f"sm_90 failed   {bad}" in second.stdout
    assert f"nvcc failed on {bad}, line 2:" in second.stderr
    assert second.stderr.strip().endswith(f"1 module did not compile (nvcc's messages above): "
                                          f"{bad} (sm_90)")


def test_build_kernels_refuses_defines_without_files(tmp_path, capsys):
    # They apply to the FILEs only: without any they were silently ignored.
    with pytest.raises(SystemExit) as exited:
        main(["build-kernels", "--arch", "sm_90", "--cache", str(tmp_path), "-D", "TILE=8"])
    assert exited.value.code == 2
    assert "gdnflow build-kernels: -D/--define applies to the FILEs" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.gpu
def test_relu_from_a_cached_module_matches_numpy(tmp_path, monkeypatch):
    from gdnflow.backends.cuda import kernels    # local import: PyCUDA, on the GPU machine only
    host = np.random.default_rng(0).standard_normal((3, 1000), dtype=np.float32)

    def fresh_loader():
        kernels.builds().close()        # its background nvcc runs end; a new pool follows
        for cached in (kernels.builds, kernels.load_module, kernels.kernel):
            cached.cache_clear()        # as in a new process: nothing compiled or loaded yet

    def relu_in_a_fresh_loader():
        fresh_loader()
        return gf.tensor(host, device="cuda").relu().numpy()
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path))
    try:
        np.testing.assert_array_equal(relu_in_a_fresh_loader(), np.maximum(host, 0))  # compiled
        entries = sorted(tmp_path.rglob("*.cubin"))
        assert entries, "nothing was stored in the kernel cache"
        stamps = [e.stat().st_mtime_ns for e in entries]
        np.testing.assert_array_equal(relu_in_a_fresh_loader(), np.maximum(host, 0))  # loaded
        assert [e.stat().st_mtime_ns for e in entries] == stamps      # read, not rewritten
    finally:
        monkeypatch.undo()
        fresh_loader()


# ------------------------------------------------------------- the variant journal --
VARIANT = ("elementwise.cu", (("GDNFLOW_JOURNAL_TEST", 1),))     # harmless: nothing reads it


def journaling_builds(folder, calls, sm_count=132, shipped=None, prefetch=()):
    """Builds for sm_90 at ``sm_count`` SMs on ``folder`` whose nvcc writes a fake cubin."""
    cache = KernelCache(folder, nvcc="nvcc", run=writing_nvcc(b"CUBIN", calls))
    return Builds(cache, "sm_90", announce=lambda _: None, prefetch=list(prefetch),
                  sm_count=sm_count, shipped=shipped or folder / "no-shipped.json")


def test_a_demanded_miss_is_journaled_once_and_a_warm_start_writes_nothing(tmp_path):
    calls = []
    listed = ("elementwise.cu", (("GDNFLOW_JOURNAL_TEST", 2),))
    plugin = tmp_path / "plugin.cu"
    plugin.write_text(OTHER.text)
    builds = journaling_builds(tmp_path, calls, prefetch=[listed])
    journal = tmp_path / "sm_90" / "variants-132.jsonl"
    for file, defines in (VARIANT, listed, (SMALL, ()), (str(plugin), ()), VARIANT):
        assert builds.cubin(file, defines) == b"CUBIN"
    builds.close()
    # Only the own source's variant the prefetch did not list; plugins and inline sources not.
    assert journal.read_text() == ('{"file":"elementwise.cu","defines":'
                                   '[["GDNFLOW_JOURNAL_TEST",1]]}\n')
    stamp = journal.stat().st_mtime_ns
    warm = journaling_builds(tmp_path, calls)
    assert warm.cubin(*VARIANT) == b"CUBIN" and warm.cubin(*listed) == b"CUBIN"
    assert journal.stat().st_mtime_ns == stamp and len(calls) == 4
    assert list(warm.loaded) == [VARIANT, listed]
    # Without an SM count (build-kernels) nothing is journaled.
    journaling_builds(tmp_path / "other", calls, sm_count=None).cubin(*VARIANT)
    assert not list((tmp_path / "other").rglob("*.jsonl"))


def test_a_journal_skips_corrupt_lines_and_unknown_files(tmp_path):
    journal = tmp_path / "variants-132.jsonl"
    assert variant_journal.read(journal) == []          # none yet
    assert variant_journal.append(journal, *VARIANT)
    journal.write_text(journal.read_text() + "\n".join([
        "{not json",
        '{"file": "no_such_file.cu", "defines": []}',
        '{"file": "../elementwise.cu", "defines": []}',
        '{"file": "elementwise.cu", "defines": [["TILE"]]}',
        '{"file": "elementwise.cu", "defines": [["TILE", null]]}',
        '["elementwise.cu", []]',
        '{"file": "elementwise.cu", "defines": [["B", "x"], ["A", 2]]}',
        '{"file": "elementwise.cu", "defines": [["A", 2], ["B", "x"]]}',
        '{"file": "pointwise.cu", "def']) + "\n")      # a crash mid-write
    expected = [VARIANT, ("elementwise.cu", (("A", 2), ("B", "x")))]
    assert variant_journal.read(journal) == [VARIANT] + [expected[1]] * 2
    assert variant_journal.journaled_variants(tmp_path, "sm_90", 132,
                                              tmp_path / "none.json") == []
    (tmp_path / "sm_90").mkdir()
    journal.rename(tmp_path / "sm_90" / journal.name)
    assert variant_journal.journaled_variants(tmp_path, "sm_90", 132,
                                              tmp_path / "none.json") == expected


def _append_many(path, tag, count):
    for i in range(count):
        variant_journal.append(path, "pointwise.cu",
                               tuple((f"D{tag}_{j}", i) for j in range(40)))


def test_concurrent_appends_from_two_processes_keep_whole_lines(tmp_path):
    journal = tmp_path / "sm_90" / "variants-132.jsonl"
    fork = multiprocessing.get_context("fork")
    writers = [fork.Process(target=_append_many, args=(journal, tag, 300)) for tag in "ab"]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert [w.exitcode for w in writers] == [0, 0]
    lines = journal.read_text().splitlines()
    assert len(lines) == 600 and len(variant_journal.read(journal)) == 600


def test_the_first_miss_queues_the_variants_journaled_for_this_arch_and_sm_count(tmp_path):
    def journaled(tag):
        return ("elementwise.cu", (("GDNFLOW_JOURNAL_TEST", tag),))
    for arch, sm_count, tag in (("sm_90", 132, 1), ("sm_90", 108, 2), ("sm_80", 132, 3)):
        variant_journal.append(variant_journal.journal_path(tmp_path, arch, sm_count),
                               *journaled(tag))
    shipped = tmp_path / "shipped.json"
    recorded = {"sm_90/132": [4, 1], "sm_90/108": [5], "sm_80/132": [6]}   # 1: the user's too
    shipped.write_text(json.dumps({"format": 1, "recorded": {
        key: {"variants": [variant_journal.entry(*journaled(tag)) for tag in tags]}
        for key, tags in recorded.items()}}))
    calls = []
    builds = journaling_builds(tmp_path, calls, shipped=shipped)
    assert builds.prefetch_variants() == [journaled(1), journaled(4)]
    assert journaling_builds(tmp_path, calls, sm_count=None).prefetch_variants() == []
    assert variant_journal.journaled_variants(tmp_path, "sm_90", None, shipped) == [
        journaled(2), journaled(1), journaled(5), journaled(4)]     # the user's, then shipped
    demanded = journaled(7)
    builds.cubin(*demanded)
    for *_, error in builds.build(builds.prefetch_variants()):      # waits for the queue
        assert error is None
    builds.close()
    compiled = sorted(argv[argv.index("-O3") + 2] for argv in calls)
    assert compiled == [f"-DGDNFLOW_JOURNAL_TEST={tag}" for tag in (1, 4, 7)]
    # The journal gained the demanded one only.
    assert variant_journal.read(builds.journal()) == [journaled(1), demanded]


@needs_nvcc
def test_build_kernels_compiles_the_journaled_variants_of_the_sm_count(tmp_path):
    cache = KernelCache(tmp_path)
    for file, defines in prefetch_list():   # the plain modules as if built: no nvcc for them
        cache.store(cache.key(file, defines, "sm_90"), "sm_90", b"CUBIN")
    # SM counts no shipped journal lists (known_variants.json has sm_90 at 132 SMs), so
    # that only the user's journal adds variants here.
    variant_journal.append(variant_journal.journal_path(tmp_path, "sm_90", 7), *VARIANT)
    env = dict(os.environ, **{CACHE_VARIABLE: str(tmp_path)})

    def build_kernels(*options):
        result = subprocess.run([sys.executable, "-m", "gdnflow.cli", "build-kernels", "--arch",
                                 "sm_90", *options], capture_output=True, text=True, env=env,
                                timeout=600)
        assert result.returncode == 0, result.stderr
        return result.stdout
    other = build_kernels("--sm-count", "5", "--workers", "1")
    assert "GDNFLOW_JOURNAL_TEST" not in other and "sm_90: 0 compiled" in other
    built = build_kernels("--sm-count", "7")
    assert "sm_90 compiled elementwise.cu {'GDNFLOW_JOURNAL_TEST': 1}" in built, built
    assert f"sm_90: 1 compiled, {len(prefetch_list())} already cached" in built
    assert cache.lookup(cache.key(*VARIANT, "sm_90"), "sm_90")[:4] == b"\x7fELF"


@pytest.mark.gpu
def test_a_module_loaded_on_the_gpu_is_journaled_for_its_arch_and_sm_count(tmp_path):
    code = ("from gdnflow.backends import cuda\n"
            f"cuda.kernel('elementwise.cu', 'relu_forward', 'PPiff', {VARIANT[1]!r})\n"
            "runtime = cuda.get_runtime()\n"
            "print(runtime.arch, runtime.sm_count)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, **{CACHE_VARIABLE: str(tmp_path)}), timeout=600)
    assert result.returncode == 0, result.stderr
    arch, sm_count = result.stdout.split()
    journal = variant_journal.journal_path(tmp_path, arch, int(sm_count))
    assert variant_journal.read(journal) == [VARIANT]


HOST_SOURCE = InlineSource('extern "C" int add_one(int x) { return x + 1; }\n', "host.cu")


@needs_nvcc
def test_a_host_library_is_built_once_kept_and_rebuilt_when_damaged(tmp_path):
    runner = CountingRunner()
    library = KernelCache(tmp_path / "a", run=runner).host_library(HOST_SOURCE)
    assert library.add_one(41) == 42 and len(runner.calls) == 1
    assert "--shared" in runner.calls[0]
    kept = list((tmp_path / "a" / "host").glob("*.so"))
    assert len(kept) == 1
    # Another process's cache on the same folder loads it without nvcc.
    assert KernelCache(tmp_path / "a", run=runner).host_library(HOST_SOURCE).add_one(1) == 2
    assert len(runner.calls) == 1
    # A damaged entry (in a folder this process has not loaded from: a loaded path is
    # reused by the dynamic loader) is built again and replaced.
    damaged = tmp_path / "b" / "host" / kept[0].name
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"not a library")
    assert KernelCache(tmp_path / "b", run=runner).host_library(HOST_SOURCE).add_one(2) == 3
    assert len(runner.calls) == 2 and damaged.read_bytes()[:4] == b"\x7fELF"


@needs_nvcc
def test_threads_asking_for_a_host_library_at_once_build_it_once(tmp_path):
    runner = CountingRunner(delay=0.3)
    caches = [KernelCache(tmp_path, run=runner) for _ in range(4)]
    results = [None] * len(caches)

    def load(i):
        results[i] = caches[i].host_library(HOST_SOURCE).add_one(i)
    threads = [threading.Thread(target=load, args=(i,)) for i in range(len(caches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [1, 2, 3, 4] and len(runner.calls) == 1


@needs_nvcc
def test_a_host_library_that_does_not_compile_names_the_file(tmp_path):
    bad = tmp_path / "bad_host.cu"
    bad.write_text('extern "C" int f(int x) {\n  x = ;\n  return x;\n}\n')
    with pytest.raises(KernelCompileError, match=f"nvcc failed on {bad}, line 2"):
        KernelCache(tmp_path / "cache").host_library(bad)
    assert not any((tmp_path / "cache").rglob("*.so"))


@needs_nvcc
def test_build_host_libraries_says_compiled_then_cached_and_names_a_failure(tmp_path):
    bad = tmp_path / "bad_host.cu"
    bad.write_text('extern "C" int f(int x) {\n  x = ;\n  return x;\n}\n')
    cache = KernelCache(tmp_path / "cache")
    first = cache.build_host_libraries((HOST_SOURCE, bad))
    assert [(source, outcome) for source, outcome, _ in first] == \
        [(HOST_SOURCE, "compiled"), (bad, "failed")]
    assert f"nvcc failed on {bad}, line 2" in str(first[1][2])
    again = KernelCache(tmp_path / "cache").build_host_libraries((HOST_SOURCE,))
    assert [(outcome, error) for _, outcome, error in again] == [("cached", None)]


def test_a_host_library_without_nvcc_says_so(tmp_path):
    with pytest.raises(BackendUnavailableError, match="cannot build host.cu for the host"):
        KernelCache(tmp_path, nvcc="").host_library(HOST_SOURCE)
