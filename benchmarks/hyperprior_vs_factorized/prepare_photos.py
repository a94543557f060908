"""Training and held-out photos for the hyperprior-vs-factorized comparison.

    apt-get download mate-backgrounds ukui-wallpapers
    dpkg -x mate-backgrounds_*.deb pkgs; dpkg -x ukui-wallpapers_*.deb pkgs
    python benchmarks/hyperprior_vs_factorized/prepare_photos.py pkgs OUT

Sources (Debian packages; licences as their copyright files state them):
``mate-backgrounds`` 1.26, ``usr/share/backgrounds/mate/nature/*.jpg``: twelve
nature photographs, GPL-2+; ``ukui-wallpapers`` 20.04.3,
``usr/share/backgrounds/{calla,goldfish}.png``: two photographs, CC-BY-SA-3.0.

``OUT/train``: nine of the nature photos, each at its own size (1280 to 2560
pixels wide) and at half of it (JPEG, quality 95): 18 images.
``OUT/heldout``: the other three nature photos and the two ukui ones, never
trained on, each scaled to 768 pixels on its long side (PNG, as Kodak's are
768x512). The photos are not in the repository; this script is.
"""
import argparse
from pathlib import Path

from PIL import Image

HELD_OUT_NATURE = ("GreenMeadow.jpg", "Storm.jpg", "Wood.jpg")
HELD_OUT_UKUI = ("calla.png", "goldfish.png")
HELD_OUT_SIDE = 768


def scaled(image, factor):
    """``image`` resized by ``factor`` (Lanczos)."""
    size = (round(image.width * factor), round(image.height * factor))
    return image.resize(size, Image.LANCZOS)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", type=Path, help="folder the two .deb files were unpacked into")
    parser.add_argument("out", type=Path, help="folder to write train/ and heldout/ into")
    args = parser.parse_args()
    backgrounds = args.packages / "usr/share/backgrounds"
    nature = sorted((backgrounds / "mate/nature").glob("*.jpg"))
    if len(nature) != 12:
        raise SystemExit(f"expected 12 photos in {backgrounds / 'mate/nature'}, found {len(nature)}")
    (args.out / "train").mkdir(parents=True, exist_ok=True)
    (args.out / "heldout").mkdir(parents=True, exist_ok=True)
    for path in nature:
        image = Image.open(path).convert("RGB")
        if path.name in HELD_OUT_NATURE:
            continue
        image.save(args.out / "train" / f"{path.stem}.jpg", quality=95)
        scaled(image, 0.5).save(args.out / "train" / f"{path.stem}_half.jpg", quality=95)
    held_out = [backgrounds / "mate/nature" / name for name in HELD_OUT_NATURE] + \
        [backgrounds / name for name in HELD_OUT_UKUI]
    for path in held_out:
        image = Image.open(path).convert("RGB")
        image = scaled(image, HELD_OUT_SIDE / max(image.size))
        image.save(args.out / "heldout" / f"{path.stem}.png")
    print(f"{len(list((args.out / 'train').iterdir()))} training and "
          f"{len(list((args.out / 'heldout').iterdir()))} held-out images in {args.out}")


if __name__ == "__main__":
    main()
