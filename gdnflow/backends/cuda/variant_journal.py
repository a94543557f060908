"""Journals of the per-shape module variants gdnflow's operators load, for the first-run prefetch.

Pure Python (no PyCUDA). Some operators build their module for a layer's
shape (a depthwise convolution's tiling, a 1x1 convolution's tile), so the
variants a model needs are known only once its layers run, one at a time.
To compile them ahead (in parallel, at a process's first cache miss) they
are remembered in two places, per GPU architecture and SM count (the
depthwise plans depend on the SM count):

- the **user's journal**, ``<cache>/<arch>/variants-<sm_count>.jsonl`` in
  the kernel cache: one JSON line per variant of gdnflow's own ``cuda_src``
  that a process compiled because it asked for it (not the modules the
  prefetch already knows). Each line is appended with ``O_APPEND`` in one
  write, so concurrent processes keep whole lines; a line that does not
  parse (a crash mid-write, a hand edit) is skipped.
- the **shipped journal**, :data:`SHIPPED` (``known_variants.json``, package
  data): the variants of the bundled workloads (MobileNetV2, VGG16, the
  codec, the codec's training step), recorded on a GPU by
  ``benchmarks/record_variants.py``.

A variant is a (file name, defines) pair, defines a tuple of (NAME, value)
pairs sorted by name, as the kernel loader keys its modules.
"""
import json
import os
from pathlib import Path

from gdnflow.backends.cuda.sources import InlineSource, resolve, source_dir

#: The journal of variants shipped with gdnflow (written by benchmarks/record_variants.py).
SHIPPED = Path(__file__).with_name("known_variants.json")
#: Version of the shipped journal's layout.
SHIPPED_FORMAT = 1
_SCALARS = (int, float, str, bool)


def journal_path(folder, arch, sm_count):
    """The user's journal of ``arch`` at ``sm_count`` SMs in the kernel cache ``folder``."""
    return Path(folder) / arch / f"variants-{sm_count}.jsonl"


def shipped_key(arch, sm_count):
    """The key of (``arch``, ``sm_count``) in the shipped journal: ``"sm_90/132"``."""
    return f"{arch}/{sm_count}"


def own_source_name(file):
    """``file``'s name if it names one of gdnflow's own ``cuda_src`` files, else None
    (a plugin's path, an :class:`InlineSource`)."""
    if isinstance(file, InlineSource) or not isinstance(file, str) or Path(file).name != file:
        return None
    path = resolve(file)
    return file if path == source_dir() / file and path.is_file() else None


def entry(file, defines):
    """The JSON object of a variant (a journal line, an item of the shipped list)."""
    return {"file": file, "defines": [[name, value] for name, value in defines]}


def variant(item):
    """The (file, defines) of a journal object, or None if it is not a variant of one of
    gdnflow's own sources (malformed, or a file this version does not ship)."""
    if not isinstance(item, dict) or own_source_name(item.get("file")) is None:
        return None
    pairs = item.get("defines")
    if not isinstance(pairs, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
            and isinstance(pair[1], _SCALARS) for pair in pairs):
        return None
    return item["file"], tuple(sorted((tuple(pair) for pair in pairs), key=lambda p: p[0]))


def append(path, file, defines):
    """Append the variant as one line of the journal ``path`` (created with its folder);
    False if it cannot be written (the kernel cache reports an unwritable folder)."""
    line = (json.dumps(entry(file, defines), separators=(",", ":")) + "\n").encode()
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(handle, line)      # one write: concurrent appenders keep whole lines
        finally:
            os.close(handle)
    except OSError:
        return False
    return True


def read(path):
    """The variants of the journal ``path`` in order (none if it is missing); lines that do
    not parse as a variant are skipped."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            parsed = variant(json.loads(line))
        except ValueError:
            parsed = None
        if parsed is not None:
            found.append(parsed)
    return found


def read_shipped(arch, sm_count=None, path=SHIPPED):
    """The shipped variants for ``arch`` at ``sm_count`` SMs (None: at every SM count
    recorded for ``arch``); none if the file is missing or not a shipped journal."""
    recorded = load_shipped(path).get("recorded", {})
    keys = ([shipped_key(arch, sm_count)] if sm_count is not None
            else sorted(k for k in recorded if k.split("/")[0] == arch))
    found = []
    for key in keys:
        block = recorded.get(key)
        items = block.get("variants", []) if isinstance(block, dict) else []
        found += [v for v in map(variant, items if isinstance(items, list) else []) if v]
    return found


def load_shipped(path=SHIPPED):
    """The shipped journal ``path`` as a dict (empty if missing, unreadable or malformed)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("format") == SHIPPED_FORMAT else {}


def journaled_variants(folder, arch, sm_count=None, shipped=SHIPPED):
    """The variants journaled for ``arch`` at ``sm_count`` SMs: the user's journal in the
    kernel cache ``folder``, then the shipped one; duplicates dropped.

    ``sm_count`` None takes every SM count journaled for ``arch`` (``gdnflow
    build-kernels`` without a GPU).
    """
    if sm_count is None:
        users = sorted((Path(folder) / arch).glob("variants-*.jsonl"))
    else:
        users = [journal_path(folder, arch, sm_count)]
    found = [v for path in users for v in read(path)] + read_shipped(arch, sm_count, shipped)
    return list(dict.fromkeys(found))
