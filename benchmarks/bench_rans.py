"""The rANS lanes' speed on the GPU and on the host's threads (:mod:`gdnflow.codec.host_lanes`)
beside constriction's range coder on the host (what the range-coded versions use), the
same symbols and tables.

    python benchmarks/bench_rans.py [--lanes 4,19,64,256] [--symbols 8192] [--out FILE]

Synthetic lanes: each of ``--symbols`` values, runs of 1536 values (a 768x512
photo's channel) with one of 64 peaked tables, some values beyond the supports.
Times are wall times of the whole call (uploads, kernel, downloads; the host
coder's Python calls), medians of 5 after a warm-up.
"""
import argparse
import os

import numpy as np

from gdnflow.benchmarking import emit, gpu_name, markdown_table, median_wall_ms
from gdnflow.codec.host_lanes import decode_host, encode_host
from gdnflow.codec.rans import ESCAPE_MARK, Lanes, RansTables, decode_cuda, encode_cuda, symbols_of
from gdnflow.codec.substreams import categorical_model, range_decoder, range_encoder
from gdnflow.backends import cuda

RUN = 1536


def tables_like_a_codec(rng, count=64):
    """``count`` tables of 16-bit frequencies, Laplace-shaped of various widths."""
    cdfs, lows = [], []
    for k in range(count):
        size = 3 + 2 * (k % 20)
        masses = np.exp(-np.abs(np.arange(size) - size // 2) / (0.3 + 0.2 * (k % 20))) + 1e-5
        frequencies = np.floor(masses / masses.sum() * (65536 - size)).astype(np.int64) + 1
        frequencies[size // 2] += 65536 - frequencies.sum()
        cdfs.append(np.concatenate([[0], np.cumsum(frequencies)]))
        lows.append(-(size // 2))
    return RansTables.of(cdfs, lows, 16), cdfs


def case(rng, lanes, symbols, tables):
    """(Lanes, latents): each lane ``symbols`` values in runs of RUN, one table a run."""
    runs = -(-symbols // RUN)
    lane_runs = [[(int(rng.integers(0, len(tables.size))), min(RUN, symbols - i * RUN),
                   (lane * symbols) + i * RUN) for i in range(runs)] for lane in range(lanes)]
    latents = np.round(rng.laplace(0, 1.2, lanes * symbols)).astype(np.int32)
    return Lanes.of(lane_runs), latents


def host_range_coder(lanes, tables, cdfs, latents):
    """(encode, decode) closures coding each lane's runs with constriction, as version 11."""
    models = [categorical_model(np.diff(c) / 65536.0) for c in cdfs]
    blocks = [[(int(lanes.table[r]), symbols_of(
        latents[lanes.dest[r]:lanes.dest[r] + lanes.count[r]], tables,
        np.full(lanes.count[r], lanes.table[r])).astype(np.int32))
        for r in range(lanes.runs[j], lanes.runs[j + 1])] for j in range(lanes.lanes)]
    payloads = []

    def encode():
        payloads.clear()
        for runs in blocks:
            encoder = range_encoder()
            for k, symbols in runs:
                encoder.encode(symbols, models[k])
            payloads.append(encoder.get_compressed().astype("<u4").tobytes())

    def decode():
        for runs, payload in zip(blocks, payloads):
            decoder = range_decoder(payload, "bench")
            for k, symbols in runs:
                decoder.decode(models[k], len(symbols))

    return encode, decode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", default="4,19,64,256")
    parser.add_argument("--symbols", type=int, default=8192)
    parser.add_argument("--out")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    tables, cdfs = tables_like_a_codec(rng)
    runtime = cuda.get_runtime()
    rows = []
    for lanes_count in (int(v) for v in args.lanes.split(",")):
        lanes, latents = case(rng, lanes_count, args.symbols, tables)
        device_latents = runtime.from_numpy(latents)
        streams = encode_cuda(lanes, tables, device_latents)
        out = runtime.from_numpy(np.zeros_like(latents))
        status, _ = decode_cuda(lanes, tables, streams, out)
        decoded = runtime.to_numpy(out)
        coded = decoded != ESCAPE_MARK
        assert (status == 0).all() and coded.mean() > 0.9
        assert np.array_equal(decoded[coded], latents[coded])
        gpu_encode = median_wall_ms(lambda: encode_cuda(lanes, tables, device_latents), 5)
        gpu_decode = median_wall_ms(lambda: decode_cuda(lanes, tables, streams, out), 5)
        assert all(np.array_equal(a, b) for a, b in
                   zip(encode_host(lanes, tables, latents)[0], streams))
        host_out = np.zeros_like(latents)
        decode_host(lanes, tables, streams, host_out)
        assert np.array_equal(host_out, decoded)
        threads_encode = median_wall_ms(lambda: encode_host(lanes, tables, latents), 5)
        threads_decode = median_wall_ms(lambda: decode_host(lanes, tables, streams, host_out), 5)
        host_encode, host_decode = host_range_coder(lanes, tables, cdfs, latents)
        host_encode()
        cpu_encode = median_wall_ms(host_encode, 5)
        cpu_decode = median_wall_ms(host_decode, 5)
        total = lanes_count * args.symbols
        rows.append([str(lanes_count), str(total),
                     f"{gpu_encode:.2f}", f"{gpu_decode:.2f}", f"{threads_encode:.2f}",
                     f"{threads_decode:.2f}", f"{cpu_encode:.2f}",
                     f"{cpu_decode:.2f}", f"{1e6 * gpu_decode / args.symbols:.0f}",
                     f"{cpu_decode / gpu_decode:.2f}x", f"{cpu_decode / threads_decode:.2f}x"])
    emit(markdown_table(
        f"rANS lanes on the GPU and on the host's threads against constriction's range coder "
        f"on the host, {args.symbols} symbols a lane",
        ["lanes", "symbols", "GPU encode ms", "GPU decode ms", "host lanes encode ms",
         "host lanes decode ms", "range coder encode ms", "range coder decode ms",
         "GPU decode ns per symbol of a lane", "decode: range coder / GPU",
         "decode: range coder / host lanes"], rows,
        notes=["wall time of a whole call, medians of 5; range coder: one thread, one "
               "constriction call per run as in version 11; host lanes: "
               f"OpenMP threads, {os.cpu_count()} cores"], gpu=gpu_name()), args.out)


if __name__ == "__main__":
    main()
