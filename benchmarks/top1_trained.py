"""Top-1 agreement of the 16-bit inference plans with the float32 plan on a *trained*
classifier (issue #18): random weights give logits with no margins, so only a trained
network says whether bf16/fp16 plans change the answers users get.

    python benchmarks/top1_trained.py --photos TRAIN_DIR --other OTHER_DIR --out table.md

No trained ImageNet file can be fetched on the GPU machine, so the script trains one
there, with PyTorch (the baseline, never a gdnflow dependency):

1. **Task**: which photo a crop comes from. Every image in ``--photos`` is a class
   (its shorter side resized to 768). The top 70% of each photo's rows is its
   training area; 224x224 crops of the bottom 30% (never seen in training) are the
   labelled test inputs.
2. **Training**: torchvision's MobileNetV2 (width 1.0, ``num_classes`` = the number
   of photos, seeded initialisation) on random crops of the training areas (side
   224-448 px resized to 224, random flips), AdamW with a cosine schedule, bf16
   autocast, batch 64.
3. **The file**: exported to ONNX (opset 17, TorchScript exporter) and read by
   ``gdnflow.io.onnx.load`` on cuda, then compiled at batch 64 as a float32, a
   bf16 and an fp16 plan (``gdnflow.compile(..., dtype=...)``).
4. **Inputs**: 512 crops of the test areas (labels known) and 512 crops of the
   photos in ``--other`` (photos the network never saw: no labels, smaller margins,
   the harder case for agreement).

The table gives each side's accuracy, the 16-bit plans' top-1 agreement with the
float32 plan, the plans' largest logit error against it, and the float32 plan's
agreement with PyTorch's float32 forward of the same weights. PyTorch's forward under
``torch.autocast`` (bf16, fp16) is measured the same way: what 16 bits cost there.
"""
import argparse
import os
import tempfile

import numpy as np

import gdnflow as gf
from gdnflow import benchmarking as harness
from gdnflow.io import onnx as gdnflow_onnx
from gdnflow.testing import relative_error

SHORT_SIDE = 768
TRAIN_ROWS = 0.7
CROP = 224
BATCH = 64
INPUTS = 512
SEED = 0
MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)


def read_photos(folder):
    """Every image in ``folder`` (sorted by name) as uint8 [H, W, 3], shorter side SHORT_SIDE."""
    from PIL import Image     # local import: Pillow, the [data] extra
    photos = []
    for name in sorted(os.listdir(folder)):
        with Image.open(os.path.join(folder, name)) as image:
            image = image.convert("RGB")
            scale = SHORT_SIDE / min(image.size)
            size = (round(image.size[0] * scale), round(image.size[1] * scale))
            photos.append(np.array(image.resize(size, Image.LANCZOS)))
    if not photos:
        raise SystemExit(f"{folder}: no images")
    return photos


def crops(photos, count, rng, first_row=0.0, last_row=1.0):
    """``count`` normalised float32 [3, CROP, CROP] crops between the rows' fractions,
    photos taken in turn; returns (crops [count, 3, CROP, CROP], photo index of each)."""
    out = np.empty((count, 3, CROP, CROP), np.float32)
    labels = np.arange(count) % len(photos)
    for i, label in enumerate(labels):
        photo = photos[label]
        top = int(photo.shape[0] * first_row)
        bottom = int(photo.shape[0] * last_row)
        row = rng.integers(top, bottom - CROP + 1)
        column = rng.integers(0, photo.shape[1] - CROP + 1)
        out[i] = photo[row:row + CROP, column:column + CROP].transpose(2, 0, 1) / 255.0
    return (out - MEAN) / STD, labels


def train(torch, photos, steps, log):
    """torchvision's MobileNetV2 trained on crops of the photos' training areas."""
    import torchvision
    functional = torch.nn.functional
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    device = torch.device("cuda")
    model = torchvision.models.mobilenet_v2(num_classes=len(photos)).to(device)
    model = model.to(memory_format=torch.channels_last).train()
    gpu_photos = [torch.from_numpy(p).to(device).permute(2, 0, 1) for p in photos]
    mean = torch.from_numpy(MEAN).to(device)
    std = torch.from_numpy(STD).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=2e-3, total_steps=steps,
                                                   pct_start=0.1)

    def batch():
        labels = torch.randint(len(photos), (BATCH,), generator=generator)
        images = []
        for label in labels.tolist():
            photo = gpu_photos[label]
            rows = int(photo.shape[1] * TRAIN_ROWS)
            side = int(torch.randint(CROP, min(2 * CROP, rows) + 1, (1,), generator=generator))
            row = int(torch.randint(0, rows - side + 1, (1,), generator=generator))
            column = int(torch.randint(0, photo.shape[2] - side + 1, (1,), generator=generator))
            crop = photo[None, :, row:row + side, column:column + side].float() / 255.0
            crop = functional.interpolate(crop, size=(CROP, CROP), mode="bilinear",
                                          antialias=True, align_corners=False)
            if torch.rand((), generator=generator) < 0.5:
                crop = crop.flip(3)
            images.append(crop)
        x = (torch.cat(images) - mean) / std
        return x.contiguous(memory_format=torch.channels_last), labels.to(device)

    for step in range(1, steps + 1):
        x, labels = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = functional.cross_entropy(model(x), labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        schedule.step()
        if step % 250 == 0 or step == steps:
            log(f"step {step}/{steps}: loss {loss.item():.4f}")
    return model.eval().to(memory_format=torch.contiguous_format)


def torch_logits(torch, model, inputs, autocast=None):
    """PyTorch's forward, batch by batch: float32 (TF32 off), or under ``torch.autocast`` of
    the torch dtype ``autocast`` (the 16-bit baseline users compare with)."""
    outputs = []
    with torch.no_grad(), torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
        for first in range(0, len(inputs), BATCH):
            x = torch.from_numpy(inputs[first:first + BATCH]).cuda()
            outputs.append(model(x).float().cpu().numpy())
    return np.concatenate(outputs)


def plan_logits(compiled, inputs):
    """A compiled plan's logits, batch by batch (float32 out, whatever the plan's dtype)."""
    return np.concatenate([compiled(gf.tensor(inputs[first:first + BATCH], device="cuda")).numpy()
                           for first in range(0, len(inputs), BATCH)])


def compare(name, logits, labels, rows):
    """One table row per side (PyTorch fp32 and autocast, each plan): accuracy, agreement with
    the float32 plan, logit error."""
    reference = logits["gdnflow fp32 plan"].argmax(1)
    torch_top1 = logits["PyTorch fp32"].argmax(1)
    for side, values in logits.items():
        top1 = values.argmax(1)
        accuracy = f"{np.mean(top1 == labels):.2%}" if labels is not None else "-"
        rows.append([name, side, accuracy,
                     f"{np.sum(top1 == reference)}/{len(top1)} ({np.mean(top1 == reference):.2%})",
                     f"{np.mean(top1 == torch_top1):.2%}",
                     f"{relative_error(values, logits['gdnflow fp32 plan']):.1e}"])


def margins(logits):
    """Median gap between the two largest logits (how close calls are)."""
    top2 = np.sort(logits, axis=1)[:, -2:]
    return float(np.median(top2[:, 1] - top2[:, 0]))


def main():
    """Train, export, compile, compare; print (and write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", required=True, help="folder of photos: one class each")
    parser.add_argument("--other", required=True, help="folder of photos never trained on")
    parser.add_argument("--steps", type=int, default=2000, help="training steps")
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--save-onnx", help="keep the exported ONNX file here")
    args = parser.parse_args()
    torch = harness.torch_or_none(need_torchvision=True)
    if torch is None:
        raise SystemExit("this benchmark trains its classifier with PyTorch on a CUDA GPU")
    photos = read_photos(args.photos)
    others = read_photos(args.other)
    rng = np.random.default_rng(SEED)
    test_inputs, test_labels = crops(photos, INPUTS, rng, first_row=TRAIN_ROWS)
    other_inputs, _ = crops(others, INPUTS, rng)

    model = train(torch, photos, args.steps, print)
    path = args.save_onnx or os.path.join(tempfile.mkdtemp(), "mobilenet_v2_photos.onnx")
    torch.onnx.export(model, (torch.zeros(BATCH, 3, CROP, CROP, device="cuda"),), path,
                      opset_version=17, input_names=["input"], output_names=["output"],
                      dynamo=False)
    imported = gdnflow_onnx.load(path, device="cuda").eval()
    plans = {f"gdnflow {dtype} plan": gf.compile(imported, (BATCH, 3, CROP, CROP), dtype=dtype)
             for dtype in ("fp32", "bf16", "fp16")}

    rows, notes = [], []
    for name, inputs, labels in (("test areas of the training photos", test_inputs, test_labels),
                                 ("photos never trained on", other_inputs, None)):
        logits = {"PyTorch fp32": torch_logits(torch, model, inputs),
                  "PyTorch bf16 autocast": torch_logits(torch, model, inputs, torch.bfloat16),
                  "PyTorch fp16 autocast": torch_logits(torch, model, inputs, torch.float16)}
        logits.update({side: plan_logits(plan, inputs) for side, plan in plans.items()})
        compare(name, logits, labels, rows)
        notes.append(f"{name}: median gap between the two largest fp32 logits "
                     f"{margins(logits['gdnflow fp32 plan']):.2f}")
    for plan in plans.values():
        plan.close()
    notes += [f"MobileNetV2 (torchvision {__import__('torchvision').__version__}, width 1.0, "
              f"{len(photos)} classes: one per photo) trained by PyTorch {torch.__version__} "
              f"for {args.steps} steps (batch {BATCH}, AdamW, bf16 autocast, seed {SEED}); "
              "exported to ONNX opset 17, read by gdnflow.io.onnx.load",
              f"{INPUTS} inputs per set, {CROP}x{CROP}, ImageNet normalisation; plans at batch "
              f"{BATCH} (gdnflow.compile(..., dtype=)); PyTorch fp32 with TF32 off",
              "agreement: top-1 equal to the gdnflow fp32 plan's; logit error: max |y - y_fp32| / "
              "max |y_fp32|",
              f"command: python benchmarks/top1_trained.py --photos {args.photos} "
              f"--other {args.other} --steps {args.steps}"]
    table = harness.markdown_table(
        "Top-1 of the 16-bit plans on a trained MobileNetV2",
        ["inputs", "side", "accuracy", "top-1 = fp32 plan", "top-1 = PyTorch fp32",
         "logit error vs fp32 plan"], rows, notes)
    harness.emit(table, args.out)


if __name__ == "__main__":
    main()
