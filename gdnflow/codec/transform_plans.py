"""A GPU codec's transforms replayed as inference plans (CUDA graphs).

A GPU codec runs its model's transforms (the analysis g_a, the synthesis g_s, the
hyperprior's h_a) on an image of one tile through :class:`TransformPlans`: for images up
to :data:`PLAN_PIXELS`, a transform gets an inference plan for a shape the second time it
runs on that shape (``gdnflow.compile(..., eager_calls=1)``; the first runs eagerly: a
build of g_s took 44 ms at 768x512 on an H200, where a decode took 7) and replays it
from then on. Each plan keeps its activations' memory (at 768x512: g_a's and g_s's
arenas 195 MiB each plus 39 MiB of filter transforms, h_a's 9 MiB in all), so
:data:`PLANS_PER_TRANSFORM` shapes are kept per transform. Replays took the factorized
prior's decode at 768x512 from 10 to 9 ms/MP and the encodes 15-25% faster; at
2048x1536 (1.7 GiB of buffers) the synthesis gained nothing measurable, hence the bound
(benchmarks/results/codec_speed_h200.md).

The replayed g_a and h_a compute y and z bit for bit as the eager ones (GPU tests on the
test models and the shipped ones), so a file does not depend on how many images of its
size the codec compressed before; the replayed g_s may round differently from the eager
one (decoded pixels within a level, as across devices). A plan's result is its own
buffer, which the next call of that transform and shape overwrites.
"""
from gdnflow.errors import DeviceMemoryError
from gdnflow.inference import PlanError, compile as compile_plans

#: Shapes per transform whose plans a codec keeps (the least recently used goes first).
PLANS_PER_TRANSFORM = 2
#: Images of more pixels than this run their transforms eagerly.
PLAN_PIXELS = 1 << 20


class TransformPlans:
    """The plans of one model's transforms, by name ("g_a", "g_s", "h_a").

    ``plans(name, x, pixels)`` is the transform ``name`` of the model applied to the cuda
    Tensor ``x``, for an image of ``pixels`` pixels in one tile (module docstring).
    ``compiled[name]`` is that transform's CompiledModel once made, or False once a plan of
    it could not be built (too little device memory, the model put back in training mode):
    that transform then stays eager, the others are unaffected.
    """

    def __init__(self, model):
        self.model = model
        self.compiled = {}

    def __call__(self, name, x, pixels):
        module = getattr(self.model, name)
        plans = self.compiled.get(name)
        if pixels > PLAN_PIXELS or plans is False:
            return module(x)
        try:
            if plans is None:
                # compile itself refuses a model in training mode (PlanError).
                plans = self.compiled[name] = compile_plans(
                    module, device="cuda", eager_calls=1, max_plans=PLANS_PER_TRANSFORM)
            return plans(x)
        except (PlanError, DeviceMemoryError):
            if plans is not None:
                plans.close()
            self.compiled[name] = False
            return module(x)

    def close(self):
        """Drop every transform's plans and their buffers; plans are built again from the
        next calls on (a transform that could not be planned stays eager)."""
        for plans in self.compiled.values():
            if plans:
                plans.close()
