"""``tensorflow.contrib.training.HParams`` of TensorFlow 1.x, as far as GPT-2's ``model.py`` and ``sample.py`` use it:
built from keyword arguments (``HParams(n_vocab=0, n_ctx=1024, ...)``), read as attributes (``hparams.n_ctx``),
overridden from the model's ``hparams.json`` with ``override_from_dict``.

As in TensorFlow 1.x: each hyperparameter keeps the type it was declared with (an int may be given for a float,
nothing else is converted), setting one that was never declared raises ``KeyError``, and ``override_from_dict``
returns the object. Not the parsing (``parse``, ``parse_json``), the lists or the serialisation of the original.
"""

from __future__ import annotations

from typing import Any


class HParams:
    def __init__(self, **kwargs: Any) -> None:
        self._hparam_types: dict[str, type] = {}
        for name, value in kwargs.items():
            self.add_hparam(name, value)

    def add_hparam(self, name: str, value: Any) -> None:
        if getattr(self, name, None) is not None:
            raise ValueError(f"Hyperparameter name is reserved: {name}")
        self._hparam_types[name] = type(value)
        setattr(self, name, value)

    def set_hparam(self, name: str, value: Any) -> None:
        declared = self._hparam_types[name]  # KeyError for an undeclared name, as in TensorFlow 1.x
        if isinstance(value, declared) and not (declared is int and isinstance(value, bool)):
            setattr(self, name, value)
        elif declared is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(self, name, float(value))
        else:
            raise ValueError(f"Could not cast hparam '{name}' of type '{declared}' from value {value!r}")

    def override_from_dict(self, values_dict: dict[str, Any]) -> HParams:
        for name, value in values_dict.items():
            self.set_hparam(name, value)
        return self

    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._hparam_types}

    def __contains__(self, name: str) -> bool:
        return name in self._hparam_types

    def __repr__(self) -> str:
        return f"HParams({self.values()!r})"
