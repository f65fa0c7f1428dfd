"""``azureml.core.run.Run``: ``Run.get_context()`` outside Azure ML gives an offline run whose ``log``
records nothing remote. This stand-in prints each logged value to stdout instead, so a run's log shows it."""

from __future__ import annotations

from typing import Any


class Run:
    """The offline run the real SDK returns when a script runs outside Azure ML."""

    @classmethod
    def get_context(cls) -> Run:
        return cls()

    def log(self, name: str, value: Any, description: str = "") -> None:
        print(f"azureml-stub: log {name} = {value}", flush=True)
