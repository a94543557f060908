"""Operator registry: one name, one class, for built-ins and plugins alike.

Built-in operators register with the same decorator a plugin uses::

    @register("relu")
    class ReLU(UnaryOperator): ...

A second registration under a taken name is an error unless ``replace=True``
is passed, so a plugin cannot silently shadow a built-in.

Importing gdnflow loads no plugin; :func:`get`, asked for a name nothing has
registered, loads the installed plugins (:func:`gdnflow.plugins.load_installed`)
and looks again.
"""
_operators = {}


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

    A name not registered yet makes the installed plugins load first: an
    operator from a plugin is found by name without importing the plugin.
    """
    if name in _operators:
        return _operators[name]
    from gdnflow import plugins
    plugins.load_installed()
    if name in _operators:
        return _operators[name]
    failed = "".join(f"; plugin {p.name!r} failed to load: {p.error}"
                     for p in plugins.loaded() if not p.loaded)
    raise KeyError(f"no operator named {name!r}; registered: {sorted(_operators)}{failed}")


def unregister(name):
    """Forget the operator registered as ``name`` (a plugin whose import failed halfway)."""
    cls = _operators.pop(name)
    cls.op_name = None


def names():
    """All registered operator names, sorted."""
    return sorted(_operators)
