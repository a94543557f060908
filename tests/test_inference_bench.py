"""The inference benchmark's code (gdnflow.inference_bench) on NumPy, with stand-in timers."""
import argparse

from gdnflow import inference_bench


def run_with_stand_in_timers(**options):
    """(rows, notes, calls) of the bench on NumPy, each timer calling its function once."""
    calls = []

    def timer(fn, warmup, repeats):
        fn()
        calls.append(fn)
        return 1.0
    rows, notes = inference_bench.run(["mobilenet_v2"], [2], 0, 1, torch=None,
                                      timers=(timer, timer), log=lambda line: None,
                                      device="numpy", image_size=32, **options)
    return rows, notes, calls


def test_bench_code_runs_on_numpy_with_stand_in_timers():
    rows, notes, calls = run_with_stand_in_timers()
    assert len(calls) == 3 and len(rows) == 1 and len(rows[0]) == len(inference_bench.HEADERS)
    assert rows[0][:2] == ["mobilenet_v2", 2] and rows[0][6] == "1.000"
    assert "52 batch norms folded" in notes[0]


def test_bench_code_builds_16_bit_plans_with_dtype():
    rows, notes, calls = run_with_stand_in_timers(dtype="fp16")
    assert len(calls) == 3 and rows[0][:2] == ["mobilenet_v2", 2]
    assert "52 batch norms folded" in notes[0]


def test_bench_command_parses_its_options():
    parser = argparse.ArgumentParser()
    inference_bench.add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--models", "vgg16", "--batches", "1", "--no-torch",
                              "--dtype", "bf16"])
    assert args.models == ["vgg16"] and args.batches == [1] and args.no_torch
    assert args.dtype == "bf16"
    assert args.run is inference_bench.cmd_bench
