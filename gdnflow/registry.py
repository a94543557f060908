"""Operator registry: one name, one class, for built-ins and plugins alike.

Built-in operators register with the same decorator a plugin uses::

    @register("relu")
    class ReLU(UnaryOperator): ...

A second registration under a taken name is an error unless ``replace=True``
is passed, so a plugin cannot silently shadow a built-in.
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
    """The operator class registered as ``name`` (KeyError listing the names if absent)."""
    try:
        return _operators[name]
    except KeyError:
        raise KeyError(f"no operator named {name!r}; registered: {sorted(_operators)}") from None


def names():
    """All registered operator names, sorted."""
    return sorted(_operators)
