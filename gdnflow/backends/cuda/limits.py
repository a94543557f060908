"""What the CUDA backend can allocate and index, and the errors that say so.

gdnflow's kernels take sizes and indices as 32-bit ints (``int`` in
``cuda_src/*.cu``, ``i`` in a kernel's argument types), so no device array
may hold more than :data:`MAX_ELEMENTS` elements. The runtime refuses such an
array before allocating it (:func:`check_elements`: one comparison), and a
kernel launch whose packed arguments do not fit their C types is explained by
:func:`argument_overflow` instead of surfacing as ``struct.error``. Pure
Python, no PyCUDA: the checks are tested without a GPU.
"""
import re
import struct

from gdnflow.errors import DeviceMemoryError, TensorTooLargeError

#: The most elements one device array may hold: 2^31 - 2^24. Not the largest
#: 32-bit int: a grid-stride loop (``GRID_STRIDE_LOOP``) steps its int index
#: up to gridDim x blockDim (under 2^24 threads on any GPU, as launch_grid caps
#: the grid) past the end before it stops, and that step must not overflow.
#: An array of exactly 2^31 - 1 elements made such a loop read out of bounds.
MAX_ELEMENTS = 2 ** 31 - 2 ** 24

#: The most blocks a grid may have along y or along z (CUDA's limit; x allows 2^31 - 1).
MAX_GRID_YZ = 65535


def check_elements(n, what):
    """Raise :class:`TensorTooLargeError` if ``n`` elements are more than kernels can index.

    ``what`` names the array in the message (its shape, or a workspace).
    """
    if n > MAX_ELEMENTS:
        raise TensorTooLargeError(
            f"{what} has {n} elements, past the {MAX_ELEMENTS} (2^31 - 2^24) that gdnflow's CUDA "
            "kernels index with 32-bit ints; use a smaller batch or split the input")


def division_constants(divisor):
    """(magic, shift) such that q = (umulhi(n, magic) + n) >> shift is n // divisor for every
    0 <= n < 2^31 (``quotient_of`` in cuda_src/gdnflow_common.cuh: the kernels' index
    split by a run-time divisor; 1 <= divisor < 2^31)."""
    shift = (divisor - 1).bit_length()
    magic = ((1 << 32) * ((1 << shift) - divisor)) // divisor + 1
    return magic, shift


def out_of_memory(nbytes, what):
    """The :class:`DeviceMemoryError` for a failed allocation of ``nbytes`` bytes for ``what``."""
    return DeviceMemoryError(
        f"out of GPU memory allocating {nbytes} bytes ({nbytes / 2 ** 30:.2f} GiB) for {what}; "
        "free tensors you no longer need, or use a smaller batch or input")


# struct codes of integer kernel arguments -> (C type, whether signed)
_INTEGER_CODES = {"b": ("signed char", True), "B": ("unsigned char", False),
                  "h": ("short", True), "H": ("unsigned short", False),
                  "i": ("int", True), "I": ("unsigned int", False),
                  "l": ("long", True), "L": ("unsigned long", False),
                  "q": ("long long", True), "Q": ("unsigned long long", False),
                  "n": ("ssize_t", True), "N": ("size_t", False),
                  "P": ("pointer", False)}


def format_codes(arg_format):
    """The codes of a struct format, one per argument: repeat counts expanded ("2iP" -> i, i,
    P), a byte string kept whole ("392s": one argument of 392 bytes, a struct by value)."""
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", arg_format):
        if code == "s":
            yield f"{count or 1}s"
        else:
            yield from code * int(count or 1)


def argument_overflow(kernel_name, arg_format, args):
    """The :class:`TensorTooLargeError` for the first integer argument outside its C type, or None.

    Called after packing ``args`` by ``arg_format`` failed (never on the launch
    path itself): None means the failure was something else.
    """
    for index, (code, value) in enumerate(zip(format_codes(arg_format), args)):
        if code not in _INTEGER_CODES or not hasattr(value, "__index__"):
            continue
        value, (ctype, signed) = int(value), _INTEGER_CODES[code]
        bits = 8 * struct.calcsize(code)
        low, high = (-2 ** (bits - 1), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
        if not low <= value <= high:
            return TensorTooLargeError(
                f"kernel {kernel_name}: argument {index} is {value}, outside the range of its C "
                f"type {ctype} [{low}, {high}]; gdnflow's CUDA kernels index with 32-bit ints, "
                f"so no tensor may pass {MAX_ELEMENTS} elements: use a smaller batch or split "
                "the input")
    return None
