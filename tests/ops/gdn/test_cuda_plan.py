"""The GDN operator's CUDA plan: how the pixels are cut into chunks
(choose_chunks, beta_segments) and what a plan built on the GPU holds.
That every path computes what NumPy does: test_operator.py."""
import pytest

from gdnflow.ops.gdn.cuda_plan import MIN_CHUNK_PIXELS, beta_segments, choose_chunks, cuda_plan


@pytest.mark.parametrize("pixels", [1, 3, 35, 97, 640, 4096, 32768, 262144, 2 * 3 * 5 * 7 * 11])
@pytest.mark.parametrize("channels", [1, 7, 128, 192])
@pytest.mark.parametrize("granule", [1, 4])
def test_chunks_divide_the_pixels_in_granules(pixels, channels, granule):
    for request in ("auto", 1, 3, 64, 10 ** 6):
        chunks = choose_chunks(pixels, channels, 132, granule, request)
        assert chunks >= 1 and pixels % chunks == 0
        assert chunks == 1 or (pixels // chunks) % granule == 0
        if request == "auto":
            assert chunks == 1 or pixels // chunks >= MIN_CHUNK_PIXELS


def test_beta_segments_need_whole_warps_in_one_row():
    # 32 threads x 4 floats = 128 pixels per warp at 64 x 64: 32 segments per row.
    assert beta_segments(64 * 64, 4) == 32
    assert beta_segments(16 * 16, 1) == 8
    # A warp would straddle two rows: the ones row instead.
    assert beta_segments(8 * 8, 4) == 0
    assert beta_segments(17 * 19, 1) == 0


def test_auto_chunks_give_about_two_ctas_per_sm():
    # 4 output tiles of 128 x 128 at C = 192: 64 chunks of 512 pixels -> 256 CTAs.
    assert choose_chunks(8 * 64 * 64, 192, 132, 4) == 64
    # 2 tiles at C = 128: 128 chunks of 2048 pixels.
    assert choose_chunks(16 * 128 * 128, 128, 132, 4) == 128
    # Too few pixels to cut: one GEMM; a prime count cannot be cut at all.
    assert choose_chunks(323, 192, 132, 1) == 1
    assert choose_chunks(7919, 7, 132, 1, request=8) == 1
    # An explicit request takes the nearest qualifying divisor.
    assert choose_chunks(35, 3, 132, 1, request=4) == 5
    assert choose_chunks(1, 3, 132, 1, request=4) == 1


@pytest.mark.gpu
def test_cuda_plan_cuts_as_asked():
    # H*W % 8 == 0: K a multiple of 8 (the 16-bit kernels'), so 3 chunks of 16, not 4 of 12.
    plan = cuda_plan("gdn", (3, 5, 4, 4), 4)
    assert (plan.chunks, plan.chunk, plan.can_vectorize) == (3, 16, True)
    plan = cuda_plan("gdn", (3, 5, 2, 2), 4)
    assert (plan.chunks, plan.chunk, plan.can_vectorize) == (3, 4, True)
    plan = cuda_plan("gdn", (3, 7, 9, 11), 9)
    assert (plan.chunks, plan.chunk, plan.can_vectorize) == (9, 33, False)
    plan = cuda_plan("gdn", (2, 6, 6, 6), 4)
    assert (plan.chunks, plan.chunk, plan.can_vectorize) == (3, 24, True)

