"""Hostile and damaged files given to ``gdnflow compress`` and ``gdnflow decompress``: a
header claiming a huge image, flipped bits, another model's file, a PNG decompression
bomb, a truncated image among several inputs; each refused in one line naming the file,
nothing the user had changed."""
import dataclasses
import struct
import zlib

import pytest

from fault_kit import USAGE_ERROR, assert_one_line_error, fingerprint
from gdnflow.codec import format as F
from gdnflow.io.checkpoint import save_checkpoint
from gdnflow.models.factorized_prior import FactorizedPrior


def png_header_only(path, width, height):
    """A PNG of a few dozen bytes whose IHDR claims width x height RGB, with a short IDAT."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    path.write_bytes(b"\x89PNG\r\n\x1a\n"
                     + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(bytes(64))) + chunk(b"IEND", b""))
    return path


@pytest.fixture
def coded(cli, codec_checkpoint, photo, tmp_path):
    """photo.gdn, compressed from the photo with the fixture checkpoint."""
    result = cli("compress", photo, "-o", "photo.gdn", "--checkpoint", codec_checkpoint)
    assert result.returncode == 0, result.stderr
    return tmp_path / "photo.gdn"


def flipped(path, bit):
    """A copy of ``path`` (same folder, ``flip<bit>.gdn``) with one bit inverted."""
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 0x80 >> (bit % 8)
    target = path.with_name(f"flip{bit}.gdn")
    target.write_bytes(bytes(data))
    return target


def test_a_header_bomb_is_refused_naming_the_file_and_the_limit(cli, codec_checkpoint, coded,
                                                                tmp_path):
    header, [(payload, escapes)] = F.unpack(coded.read_bytes())
    bomb = tmp_path / "bomb.gdn"
    bomb.write_bytes(F.pack(dataclasses.replace(header, height=65536, width=65536,
                                                latent_height=4096, latent_width=4096),
                            [(payload + bytes(4096), escapes)]))
    assert len(bomb.read_bytes()) < 5000
    before = fingerprint(tmp_path)
    result = cli("decompress", bomb, "-o", "bomb.png", "--checkpoint", codec_checkpoint)
    assert_one_line_error(result, "decompress", "bomb.gdn", "65536x65536", F.MAX_PIXELS)
    assert fingerprint(tmp_path) == before


@pytest.mark.parametrize("where", ["model id", "payload"])
def test_a_flipped_bit_is_called_corrupted(cli, codec_checkpoint, coded, tmp_path, where):
    bit = 8 * 7 + 3 if where == "model id" else 8 * (len(coded.read_bytes()) - 9) + 6
    damaged = flipped(coded, bit)
    before = fingerprint(tmp_path)
    result = cli("decompress", damaged, "-o", "out.png", "--checkpoint", codec_checkpoint)
    assert_one_line_error(result, "decompress", damaged.name, "corrupted (checksum mismatch)")
    assert fingerprint(tmp_path) == before


def test_another_model_s_file_names_both_model_ids(cli, coded, tmp_path):
    other = tmp_path / "other.h5"
    save_checkpoint(other, FactorizedPrior(8, 12, seed=1, device="numpy").eval())
    before = fingerprint(tmp_path)
    result = cli("decompress", coded, "-o", "out.png", "--checkpoint", other)
    line = assert_one_line_error(result, "decompress", "photo.gdn", "coded by another model",
                                 F.unpack(coded.read_bytes())[0].model_id.hex())
    assert "corrupted" not in line
    assert fingerprint(tmp_path) == before


def test_a_png_bomb_is_refused_with_its_size_and_how_to_raise_the_limit(cli, codec_checkpoint,
                                                                       tmp_path):
    bomb = png_header_only(tmp_path / "bomb.png", 100000, 100000)
    before = fingerprint(tmp_path)
    result = cli("compress", bomb, "--checkpoint", codec_checkpoint)
    assert_one_line_error(result, "compress", "bomb.png", "100000x100000", "10000000000",
                          "178956970", "--max-pixels")
    assert fingerprint(tmp_path) == before


def test_between_pillow_s_warning_and_error_limits_there_is_no_warning(cli, codec_checkpoint,
                                                                       tmp_path):
    """A header of 10000x10000 (Pillow warns above 89 million pixels): within gdnflow's
    limit, so it is decoded, and its missing pixels are the one error, naming the file."""
    image = png_header_only(tmp_path / "huge.png", 10000, 10000)
    result = cli("compress", image, "--checkpoint", codec_checkpoint)
    assert_one_line_error(result, "compress", "huge.png", "truncated")
    assert "DecompressionBomb" not in result.stderr


def test_a_truncated_image_among_several_is_named(cli, codec_checkpoint, photo, tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.png").write_bytes(photo.read_bytes())
    data = photo.read_bytes()
    (inputs / "b.png").write_bytes(data[:len(data) // 2])
    before = fingerprint(inputs, codec_checkpoint)
    result = cli("compress", inputs / "a.png", inputs / "b.png", "-o", "out",
                 "--checkpoint", codec_checkpoint)
    assert_one_line_error(result, "compress", "b.png", "truncated")
    assert fingerprint(inputs, codec_checkpoint) == before
    assert not (tmp_path / "out" / "b.gdn").exists()


def test_max_pixels_sets_the_limit(cli, codec_checkpoint, photo, tmp_path):
    pixels = 70 * 53
    before = fingerprint(photo)
    refused = cli("compress", photo, "--checkpoint", codec_checkpoint, "--max-pixels", pixels - 1)
    assert_one_line_error(refused, "compress", "photo.png", f"limit of {pixels - 1}")
    assert not (tmp_path / "photo.gdn").exists()
    accepted = cli("compress", photo, "--checkpoint", codec_checkpoint, "--max-pixels", pixels)
    assert accepted.returncode == 0, accepted.stderr
    assert (tmp_path / "photo.gdn").exists() and fingerprint(photo) == before
    bad = cli("compress", photo, "--checkpoint", codec_checkpoint, "--max-pixels", "-5")
    # argparse's usage error; its one-line form comes with the CLI's error handling.
    assert bad.returncode == USAGE_ERROR and "--max-pixels" in bad.stderr and "'-5'" in bad.stderr


def test_an_image_past_the_format_s_limit_is_refused_by_name(cli, codec_checkpoint, tmp_path):
    image = png_header_only(tmp_path / "wide.png", 20000, 20000)
    result = cli("compress", image, "--checkpoint", codec_checkpoint, "--max-pixels", 10 ** 9)
    assert_one_line_error(result, "compress", "wide.png", "20000x20000", F.MAX_PIXELS)
    assert not (tmp_path / "wide.gdn").exists()
