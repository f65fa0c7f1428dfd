"""The parameters the job trains, as records: captured at the gradient hooks, ``params_initial`` and ``params_final``.

Their final values are the job's result (compared between modes); their first values tell whether the
script seeds itself. Each variable is read as :mod:`memdiag.agent.parameters` reads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from memdiag.agent import parameters
from memdiag.agent.failures import Failures
from memdiag.agent.parameters import ParameterCapture
from memdiag.format.records import ParamsFinalRecord, ParamsInitialRecord


class ParameterRecords:
    """The trainable variables the gradient hooks saw, by name, and their records; what cannot be read
    is left out and counted, never raised."""

    def __init__(self, tracer: Any, initial_path: str | None, failures: Failures) -> None:
        self.tracer = tracer
        self.initial_path = initial_path  # where to save the parameters before the first update
        self.failures = failures  # memdiag's own, shared with the hooks: counted, never raised
        # the trainable variables the gradient hooks saw, by name; read where they can be read
        self.variables = ParameterCapture(failures.failed)
        self.initial_recorded = False

    def capture(self, name: str, var: Any) -> None:
        """Keep the trainable variables the job reduces gradients for: their final values are the
        job's result (compared between modes), their first values tell whether the script seeds."""
        self.variables.add(name, var)

    def before_first_update(self) -> None:
        """The ``params_initial`` record, once, when the first gradients have been captured."""
        if not self.initial_recorded and self.variables:
            self.initial_recorded = True
            self.failures.guard("read the initial parameters", self.record_initial)

    def record_initial(self) -> None:
        """Before the first update: equal between two runs only if the script seeds itself."""
        def record(values: Iterator[tuple[str, np.ndarray[Any, Any]]]) -> None:
            def write() -> None:
                digest, count = parameters.digest_and_save(self.initial_path or None, values)
                self.tracer.writer.add(ParamsInitialRecord(type="params_initial", step=self.tracer.step,
                                                           digest=digest, variables=count))

            self.failures.guard("save the initial parameters", write)

        self.variables.initial(record, span=lambda: self.tracer.own_work("read and save the initial parameters"))

    def record_final(self, path: str | None) -> None:
        """A ``params_final`` record of the captured variables' last values, and (``path``) the values
        saved there; what cannot be read is left out and counted, never raised. One variable is read,
        hashed and written at a time (:func:`memdiag.agent.parameters.digest_and_save`)."""
        def write() -> None:
            if not self.variables:
                return
            with self.tracer.own_work("read and save the final parameters"):
                digest, count = parameters.digest_and_save(path, self.variables.final_items())
                self.tracer.writer.write_now(ParamsFinalRecord(type="params_final", digest=digest,
                                                               variables=count, captured=len(self.variables)))

        self.failures.guard("save the final parameters", write)
