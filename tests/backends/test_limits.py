"""The CUDA backend's size limit and out-of-memory errors: the checks on the host,
the operator call naming them, and (on a GPU) real refusals before any big allocation."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow.autograd import Operator
from gdnflow.backends.cuda import limits
from gdnflow.errors import DeviceMemoryError, GdnflowError, TensorTooLargeError

LIMIT = 2 ** 31 - 2 ** 24


def test_the_limit_leaves_a_grid_strides_room_below_2_31_and_is_inclusive():
    # A grid-stride loop's int index may step up to gridDim x blockDim past the
    # array's end: 2^24 threads (more than any GPU launches in one grid-stride
    # loop: launch_grid caps the grid) must still fit below 2^31.
    assert limits.MAX_ELEMENTS == LIMIT and LIMIT + 2 ** 24 - 1 <= 2 ** 31 - 1
    limits.check_elements(LIMIT, "an array")
    with pytest.raises(TensorTooLargeError, match=r"^a workspace has 2130706433 elements, past "
                                                  r"the 2130706432 \(2\^31 - 2\^24\)"):
        limits.check_elements(LIMIT + 1, "a workspace")


def test_errors_are_gdnflow_errors_and_the_builtins_callers_catch():
    assert issubclass(TensorTooLargeError, (GdnflowError)) and issubclass(TensorTooLargeError, ValueError)
    error = limits.out_of_memory(200 * 10 ** 9, "an array of shape (50000000000,)")
    assert isinstance(error, DeviceMemoryError) and isinstance(error, MemoryError)
    assert isinstance(error, GdnflowError)
    assert "200000000000 bytes (186.26 GiB) for an array of shape (50000000000,)" in str(error)


@pytest.mark.parametrize("arg_format, args, index, value", [
    ("PPi", (1, 2, 2 ** 31), 2, 2 ** 31),
    ("PPi", (1, 2, -2 ** 31 - 1), 2, -2 ** 31 - 1),
    ("PPii", (1, 2, 3, np.int64(5_000_000_000)), 3, 5_000_000_000),
    ("P2iI", (1, 7, 7, -1), 3, -1),             # repeat counts expand; unsigned refuses -1
])
def test_a_kernel_argument_outside_its_c_type_is_named(arg_format, args, index, value):
    error = limits.argument_overflow("relu_forward", arg_format, args)
    assert isinstance(error, TensorTooLargeError)
    assert str(error).startswith(f"kernel relu_forward: argument {index} is {value}, outside")


@pytest.mark.parametrize("arg_format, args", [
    ("PPi", (2 ** 40, 2 ** 40, LIMIT)),         # pointers are 64-bit
    ("PPqf", (1, 2, 2 ** 40, 1e30)),             # int64 holds it; floats are not checked
    ("PPi", (1, 2, "not an int")),               # another kind of failure: not an overflow
])
def test_arguments_that_fit_are_no_overflow(arg_format, args):
    assert limits.argument_overflow("k", arg_format, args) is None


class _Refusing(Operator):
    """Refuses its output like the runtime does for a shape past the limit."""

    def forward_numpy(self, x):
        limits.check_elements(2 ** 32, "a device array of shape (65536, 65536)")


class _Nested(Operator):
    def forward_numpy(self, x):
        return _Refusing()(self.wrap(x)).data


class _RefusingBackward(Operator):
    def forward_numpy(self, x):
        return x * 2

    def backward(self, grad_output):
        raise limits.out_of_memory(4 * 2 ** 32, "an array of shape (65536, 65536)")


def test_the_operator_call_names_the_operator_and_its_input_shapes():
    x = gf.tensor(np.ones((2, 3)), device="numpy")
    with pytest.raises(TensorTooLargeError, match=r"^_Refusing on inputs of shape \(2, 3\): a "
                                                  r"device array of shape \(65536, 65536\) has"):
        _Refusing()(x)
    # A composite operator: the innermost operator is named, once.
    with pytest.raises(TensorTooLargeError) as caught:
        _Nested()(x)
    assert str(caught.value).startswith("_Refusing on inputs of shape (2, 3): a device array")
    assert str(caught.value).count("on inputs of shape") == 1


def test_the_backward_names_the_operator_it_runs():
    x = gf.tensor(np.ones((2, 3)), device="numpy", requires_grad=True)
    y = _RefusingBackward()(x).sum()
    with pytest.raises(DeviceMemoryError, match=r"^the backward of _RefusingBackward on inputs "
                                                r"of shape \(2, 3\): out of GPU memory "
                                                r"allocating 17179869184 bytes"):
        y.backward()


# ------------------------------------------------------------------- GPU --
def _free_device_bytes():
    import pycuda.driver as drv
    gf.backends.get_backend("cuda").synchronize()
    return drv.mem_get_info()[0]


@pytest.mark.gpu
def test_an_elementwise_result_past_the_limit_is_refused_before_allocating():
    a = gf.tensor(np.ones((65536, 1), np.float32), device="cuda")
    b = gf.tensor(np.ones((1, 65536), np.float32), device="cuda")
    free = _free_device_bytes()
    with pytest.raises(TensorTooLargeError, match=r"^add on inputs of shape \(65536, 1\), "
                                                  r"\(1, 65536\): a device array of shape "
                                                  r"\(65536, 65536\) has 4294967296 elements"):
        a + b
    assert abs(_free_device_bytes() - free) < 64 * 2 ** 20
    small = gf.tensor(np.ones((1, 4), np.float32), device="cuda")      # the process goes on
    np.testing.assert_array_equal((a + small).numpy()[:2], [[2.0] * 4] * 2)


@pytest.mark.gpu
def test_a_convolution_output_past_the_limit_is_refused_before_allocating():
    x = gf.tensor(np.ones((1, 1, 2048, 2048), np.float32), device="cuda")     # 16 MiB
    w = gf.tensor(np.ones((1024, 1, 1, 1), np.float32), device="cuda")
    free = _free_device_bytes()
    with pytest.raises(TensorTooLargeError, match=r"^conv2d on inputs of shape \(1, 1, 2048, "
                                                  r"2048\), \(1024, 1, 1, 1\): .*4294967296 "
                                                  r"elements, past the 2130706432"):
        gf.ops.conv2d(x, w)
    assert abs(_free_device_bytes() - free) < 64 * 2 ** 20


@pytest.mark.gpu
def test_an_inference_plan_past_the_limit_fails_cleanly_at_build():
    from gdnflow import inference, nn
    model = nn.Conv2d(1, 1024, 1, bias=False, device="cuda").eval()
    with pytest.raises(TensorTooLargeError, match=r"conv2d on inputs of shape \(1, 1, 2048, "
                                                  r"2048\), \(1024, 1, 1, 1\)"):
        inference.compile(model, (1, 1, 2048, 2048), device="cuda")
    small = inference.compile(model, (1, 1, 8, 8), device="cuda")      # the process goes on
    assert small(gf.tensor(np.ones((1, 1, 8, 8), np.float32), device="cuda")).shape == (1, 1024, 8, 8)


@pytest.mark.gpu
def test_out_of_device_memory_names_the_bytes_and_the_process_stays_usable():
    from gdnflow.backends import cuda
    runtime = cuda.get_runtime()
    with pytest.raises(DeviceMemoryError, match=r"out of GPU memory allocating 200000000000 "
                                                r"bytes \(186\.26 GiB\) for a test block"):
        runtime.allocate(200 * 10 ** 9, "a test block")
    held = []
    with pytest.raises(DeviceMemoryError, match=r"^out of GPU memory allocating 8522825728 bytes"):
        for _ in range(64):                     # 8 GiB each: no GPU holds 64
            held.append(gf.zeros((LIMIT,), device="cuda"))
    # The GPU is full to within 8 GiB: an operator asking for 8 GiB more is named.
    with pytest.raises(DeviceMemoryError, match=r"^affine on inputs of shape \(2130706432,\): "
                                                r"out of GPU memory allocating 8522825728 bytes"):
        held[0] * 2.0
    del held
    runtime.pool.free_held()
    x = gf.tensor(np.ones(4, np.float32), device="cuda")
    np.testing.assert_array_equal((x + 1).numpy(), [2.0] * 4)
    assert (gf.zeros((LIMIT,), device="cuda") * 2.0).shape == (LIMIT,)    # big ones fit again
