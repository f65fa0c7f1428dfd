"""A stand-in for ``tensorflow.contrib`` (TensorFlow 1.x; gone in TensorFlow 2), only as much of it as the vendored
scripts import: ``tensorflow.contrib.training.HParams`` (GPT-2's ``model.py``).

``tests/conformance/third_party/launch.py`` puts ``stubs/`` on ``sys.path`` and registers this package as
``sys.modules["tensorflow.contrib"]`` and its ``training`` as ``sys.modules["tensorflow.contrib.training"]``, for
the scripts that import it only; it is never installed, never on the path of anything else, and nothing in the
real ``tensorflow`` package changes.
"""
