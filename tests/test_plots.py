"""gdnflow.plots: figures that need no display, rendered to RGB PNG bytes."""
import io
import subprocess
import sys

from PIL import Image

from gdnflow import plots


def test_a_figure_renders_to_an_rgb_png_of_its_size():
    figure = plots.new_figure(4, 3, dpi=50)
    axes = figure.add_subplot(1, 1, 1)
    axes.plot([0, 1, 2], [1, 0, 1], color="red", linewidth=5)
    with Image.open(io.BytesIO(plots.png_bytes(figure))) as image:
        assert image.format == "PNG" and image.mode == "RGB" and image.size == (200, 150)
        colours = {colour for _, colour in image.getcolors(maxcolors=200 * 150)}
    assert (255, 255, 255) in colours                       # the background
    assert any(r > 200 and g < 60 and b < 60 for r, g, b in colours)    # the red line


def test_matplotlib_is_loaded_by_the_first_figure_only_and_leaves_the_backend_alone():
    probe = ("import sys, gdnflow.plots as p, gdnflow.train.plots, gdnflow.codec.eval_report\n"
             "assert 'matplotlib' not in sys.modules\n"
             "p.png_bytes(p.new_figure(1, 1))\n"
             "assert 'matplotlib.pyplot' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
