"""Operator registry: one name, one class, for built-ins and plugins alike.

Built-in operators register with the same decorator a plugin uses::

    @register("relu")
    class ReLUOp(UnaryOp): ...

A second registration under a taken name is an error unless ``replace=True``
is passed, so a plugin cannot silently shadow a built-in.

Importing gdnflow loads no plugin. :func:`get`, asked for a name nothing has
registered, asks the hooks given to :func:`on_unknown_name` (gdnflow's plugin
layer installs one that loads the installed plugins) and looks again.
"""
_operators = {}
_unknown_name_hooks = []


def on_unknown_name(hook):
    """Call ``hook()`` when :func:`get` is asked for a name nothing has registered.

    The hook may register operators (load plugins); it returns a string to add
    to the KeyError if the name is still missing (why something failed to
    load), or an empty string / None. Returns ``hook``, so it can decorate.
    """
    if hook not in _unknown_name_hooks:
        _unknown_name_hooks.append(hook)
    return hook


def register(name, *, replace=False):
    """Class decorator: make an :class:`~gdnflow.autograd.Operator` findable by ``name``."""
    def decorate(cls):
        if name in _operators and _operators[name] is not cls and not replace:
            old = _operators[name]
            raise ValueError(
                f"operator name {name!r} is taken by {old.__module__}.{old.__qualname__}; "
                f"pass replace=True to register {cls.__module__}.{cls.__qualname__} in its place")
        _operators[name] = cls
        cls.op_name = name
        return cls
    return decorate


def get(name):
    """The operator class registered as ``name`` (KeyError listing the names if absent).

    A name not registered yet runs the :func:`on_unknown_name` hooks first:
    an operator from an installed plugin is found by name without importing
    the plugin.
    """
    if name in _operators:
        return _operators[name]
    notes = []
    for hook in _unknown_name_hooks:       # in the order given, until one registers the name
        notes.append(hook())
        if name in _operators:
            return _operators[name]
    explained = "".join(note for note in notes if note)
    raise KeyError(f"no operator named {name!r}; registered: {sorted(_operators)}{explained}")


def unregister(name):
    """Forget the operator registered as ``name`` (a plugin whose import failed halfway)."""
    cls = _operators.pop(name)
    cls.op_name = None


def names():
    """All registered operator names, sorted."""
    return sorted(_operators)
