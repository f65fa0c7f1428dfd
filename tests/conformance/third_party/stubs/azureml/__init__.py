"""A stand-in for the Azure Machine Learning SDK, only as much of it as the vendored scripts call.

Put on ``sys.path`` by ``tests/conformance/third_party/launch.py`` for the scripts that import it; never
installed, never on the path of anything else.
"""
