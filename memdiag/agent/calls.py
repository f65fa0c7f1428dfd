"""Calls through memdiag's wrappers of Horovod's functions: autograph's view of a wrapper, and a call's arguments by name.

A wrapper takes whatever arguments the installed Horovod's function takes (``*args, **kwargs``); it
reads them by name from that function's signature, defaults included, and can call it again with some
of them changed (the gradient reduction, called with ``sparse_as_dense=False``).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf


def as_called(wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
              original: Callable[..., Any]) -> Callable[..., Any]:
    """``wrap(original)``, a memdiag wrapper around Horovod's ``original``, made so that autograph treats
    each as plain Horovod would be treated.

    memdiag's own code is never converted by autograph when a script's ``tf.function`` calls it: it
    builds the same graph as plain Python, and converting its closures is neither needed nor reliable
    (a converted method once got its arguments twice). Horovod's function, though, runs as autograph
    would have run it at the wrapper's call site: converted where the script's converted code calls
    it (inside a ``tf.function``), as it is everywhere else. Plain Horovod is converted there, and
    the conversion is a large part of the job's first step (measured:
    docs/notes/transparency.md#autograph-and-the-first-step): left out, memdiag made the job's first
    step faster than the job."""
    from tensorflow.python.autograph.core import ag_ctx
    from tensorflow.python.autograph.impl.api import _call_unconverted, autograph_artifact

    caller = threading.local()  # the autograph status where the wrapper was called

    @functools.wraps(original)
    def original_as_called(*args: Any, **kwargs: Any) -> Any:
        ctx = getattr(caller, "ctx", None)
        if ctx is None or ctx.status != ag_ctx.Status.ENABLED:
            return original(*args, **kwargs)
        # in the caller's status again (memdiag's wrapper ran with autograph off): a function autograph
        # converted already (a closure made by converted code) runs its conversions only then
        with ag_ctx.ControlStatusCtx(status=ctx.status, options=ctx.options):
            return tf.__internal__.autograph.tf_convert(original, ctx)(*args, **kwargs)

    inner = tf.autograph.experimental.do_not_convert(wrap(original_as_called))

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous = getattr(caller, "ctx", None)
        # autograph converts what converted code calls (through converted_call, which calls an artifact
        # as it is), not what plain code calls while the status says enabled (a constructor's body)
        through_autograph = sys._getframe(1).f_code is _call_unconverted.__code__
        caller.ctx = tf.__internal__.autograph.control_status_ctx() if through_autograph else None
        try:
            return inner(*args, **kwargs)
        finally:
            caller.ctx = previous

    # an autograph artifact: called unconverted, in the caller's status (do_not_convert would hide it)
    artifact: Callable[..., Any] = autograph_artifact(wrapper)
    return artifact


def signature(function: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def bind(signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, defaults included (empty if they do not fit the signature)."""
    if signature is None:
        return dict(kwargs)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return dict(kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def rebind(signature: inspect.Signature | None, arguments: dict[str, Any], **changes: Any) -> list[Any]:
    """Positional arguments for the same call with ``changes`` applied."""
    assert signature is not None, "Horovod's _make_allreduce_grads_fn has a Python signature"
    values = {**arguments, **changes}
    return [values[name] for name in signature.parameters if name in values]
