"""Every tuning knob of gdnflow in one object: :data:`settings`.

Code reads a knob where it uses it (``settings.gdn_fused``), so a change takes
effect on the next call. Change knobs for a block with :func:`override`, which
restores the previous values on the way out, also after an exception::

    import gdnflow as gf
    with gf.config.override(gdn_fused=False, conv_workspace_bytes=64 << 20):
        ...

Assigning ``settings.<knob> = value`` changes it for the rest of the process.
A name that is not a knob is refused (no typo passes silently).

The defaults are what gdnflow ships: results do not depend on them (every
setting computes the same values, up to float32 summation order), only speed
and memory do, with two exceptions: ``matmul_precision`` (set it with
:func:`set_matmul_precision`) trades float32 exactness for tensor-core speed,
and ``noise_sample_offset`` says which slice of a data-parallel batch this
process's training noise is for.
Tests and benchmarks switch them only through :func:`override`.
"""
import contextlib
import dataclasses


@dataclasses.dataclass(slots=True)
class Config:
    """gdnflow's settings; the fields are grouped by the part of gdnflow that reads them."""

    # --- convolution (gdnflow.ops.conv) ---------------------------------------
    #: Bytes of device scratch memory one convolution call may use for lowered
    #: columns or Winograd transforms; larger batches are processed in chunks.
    conv_workspace_bytes: int = 256 << 20
    #: None: the convolution planner chooses each call's algorithm. Otherwise an
    #: object with the planner's interface that chooses instead (tests and
    #: benchmarks force one algorithm this way).
    conv_planner: object = None
    #: None: the direct 1x1 kernel's tiling comes from its cost model. Otherwise
    #: a function ``(m, k, hw, columns, vec_x, sm_count) -> PointwiseConfig``.
    pointwise_config_chooser: object = None
    #: 16-bit convolution forwards run as gdnflow's tensor-core implicit GEMM with
    #: the epilogue fused where it is preferred (stride 1, wider than 1x1, one
    #: group, at least 16 input channels, enough blocks, compute capability 8.0;
    #: docs/conv.md). False: im2col + cuBLAS GemmEx, then an epilogue pass.
    half_conv_tensor_cores: bool = True
    #: On compute capability 9.0 the implicit GEMM multiplies by Hopper's warpgroup
    #: MMAs (wgmma, an sm_90a build). False: mma.sync there too (for A/B runs).
    half_conv_wgmma: bool = True

    # --- GDN (gdnflow.ops.gdn) ------------------------------------------------
    #: The fused GEMM kernels where the shape allows (False: cuBLAS products with
    #: elementwise kernels around them).
    gdn_fused: bool = True
    #: 16-byte accesses in the elementwise GDN kernels where H*W % 4 == 0.
    gdn_vectorize: bool = True
    #: dL/dbeta from segment sums of the backward's U where possible (False:
    #: always a product with a ones row).
    gdn_beta_sums: bool = True
    #: How the parameter-gradient GEMM's pixel sum is cut: "auto" or a chunk
    #: count to aim at (1: one GEMM over all pixels).
    gdn_param_gemm_chunks: object = "auto"

    # --- sparse convolution (gdnflow.sparse) ----------------------------------
    #: Resident blocks per SM the sparse kernels' grids are sized for.
    sparse_blocks_per_sm: int = 4
    #: Which convolution a SparseConv2d runs: "auto" (per layer, the faster on
    #: the GPU, dense on NumPy), "sparse" or "dense" everywhere. None: the
    #: environment variable GDNFLOW_SPARSE, else "auto".
    sparse_policy: str = None

    # --- precision (gdnflow.backends.cuda.blas) -------------------------------
    #: How the GPU's float32 matrix products run: "fp32" (float32 FMA, results
    #: match the NumPy reference to 1e-4) or "tf32" (tensor cores: inputs rounded
    #: to TF32's 10-bit mantissa, products accumulated in float32; several times
    #: faster on compute-bound products, about 1e-3 relative error). It applies
    #: to the cuBLAS products: im2col and Winograd convolutions, linear and
    #: matmul, GDN's unfused products; gdnflow's own kernels stay float32.
    matmul_precision: str = "fp32"

    # --- CUDA runtime (gdnflow.backends.cuda.runtime) -------------------------
    #: The GPU (CUDA device index) the process's runtime opens on first use;
    #: ``gdnflow.distributed.init()`` sets it to the process's local rank.
    #: Changing it once the runtime exists has no effect.
    cuda_device: int = 0

    # --- images (gdnflow.data.images) -----------------------------------------
    #: The most pixels (height x width, read from the file's header before decoding)
    #: an image file may have: larger ones are refused as possible decompression
    #: bombs. Default: Pillow's own error limit, 2 x PIL.Image.MAX_IMAGE_PIXELS.
    #: ``--max-pixels N`` of compress, eval and train sets it for that command.
    max_image_pixels: int = 2 * 89_478_485

    # --- training noise (gdnflow.ops.entropy) ---------------------------------
    #: Where this process's batch starts in the whole batch, in samples: a
    #: data-parallel rank holding samples s, s + 1, ... of each step's batch
    #: draws their quantisation noise (gdnflow.train.distributed_run sets it),
    #: so that all ranks together draw the one-process batch's noise. 0 alone.
    noise_sample_offset: int = 0

    def override(self, **changes):
        """Context manager: the given knobs take the given values within the block."""
        return _override(self, changes)


@contextlib.contextmanager
def _override(config, changes):
    known = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TypeError(f"gdnflow.config.override: no knob named {', '.join(map(repr, unknown))}; "
                        f"the knobs are {sorted(known)}")
    previous = {name: getattr(config, name) for name in changes}
    for name, value in changes.items():
        setattr(config, name, value)
    try:
        yield config
    finally:
        for name, value in previous.items():
            setattr(config, name, value)


#: The process's settings, read by the code that each knob tunes.
settings = Config()

#: The values of ``settings.matmul_precision``.
MATMUL_PRECISIONS = ("fp32", "tf32")


def check_matmul_precision(precision):
    """``precision`` if it is one of :data:`MATMUL_PRECISIONS`, else a ValueError naming them."""
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul precision {precision!r}: expected one of "
                         f"{', '.join(MATMUL_PRECISIONS)}")
    return precision


def set_matmul_precision(precision):
    """Run the GPU's float32 matrix products in ``precision``: "fp32" (default) or "tf32".

    The setting holds for the rest of the process (``with override(
    matmul_precision="tf32"):`` for a block). Inference plans keep the
    precision they were built with: ``gdnflow.compile`` builds one plan per
    input shape and precision.
    """
    settings.matmul_precision = check_matmul_precision(precision)


def override(**changes):
    """``with override(knob=value, ...):`` sets knobs of :data:`settings` for the block."""
    return settings.override(**changes)
