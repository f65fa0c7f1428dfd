"""`memdiag doctor` in a user's own environment: a Horovod built against another TensorFlow, a Keras
that does not go with TensorFlow, Horovod and mpirun from two MPIs, and fixes that fit where memdiag
was installed (its checkout's `make setup`, or pip into the user's environment)."""

from __future__ import annotations

import pytest

from memdiag import doctor

# The real checks import TensorFlow and Horovod, and TensorFlow sets variables in the environment when
# imported (tests/conftest.py fails a test for that): imported here, before any test
try:
    import horovod.tensorflow  # noqa: F401
except Exception:  # noqa: BLE001 - an environment without Horovod: the machine's checks are skipped
    HOROVOD = False
else:
    HOROVOD = True

# `ldd` of Horovod's TensorFlow library, as glibc's ldd prints it (the machine's Open MPI, and an MPICH)
LDD_OPEN_MPI = """\
\tlinux-vdso.so.1 (0x00007ffd1e7f2000)
\tlibmpi_cxx.so.40 => /lib/x86_64-linux-gnu/libmpi_cxx.so.40 (0x00007f7608397000)
\tlibmpi.so.40 => /lib/x86_64-linux-gnu/libmpi.so.40 (0x00007f75fe8c1000)
\tlibtensorflow_framework.so.2 => not found
"""
LDD_MPICH = """\
\tlibmpi.so.12 => /opt/mpich/lib/libmpi.so.12 (0x00007f2a1c000000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2a1be00000)
"""


def test_the_mpi_a_library_links_is_named_by_its_soname_with_its_path():
    assert doctor.linked_mpi(LDD_OPEN_MPI) == (doctor.OPEN_MPI, "/lib/x86_64-linux-gnu/libmpi.so.40")
    assert doctor.linked_mpi(LDD_MPICH) == (doctor.MPICH_ABI, "/opt/mpich/lib/libmpi.so.12")
    assert doctor.linked_mpi("\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)\n") is None


@pytest.mark.parametrize("text, family", [
    ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n", "Open MPI"),
    ("HYDRA build details:\n    Version:                                 4.0.2\n", "MPICH"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619\n", "MPICH"),
    ("something else 1.0\n", None),
])
def test_mpirun_s_family_is_read_from_its_version_text(text, family):
    found = doctor.mpirun_family(text)
    assert found == family if family is None else found is not None and found.startswith(family)


@pytest.mark.parametrize("tensorflow, keras, wrong", [
    ("2.15.1", "2.15.0", False),
    ("2.15.1", "3.3.3", True),  # Keras 3 installed over TensorFlow 2.15: tf.keras breaks
    ("2.14.0", "2.15.0", True),
    ("2.21.0", "3.11.0", False),  # from 2.16 on TensorFlow uses Keras 3
    ("2.15.1", None, False),
])
def test_keras_goes_with_the_tensorflow_of_its_own_minor_version_up_to_2_15(tensorflow, keras, wrong):
    problem = doctor.keras_mismatch(tensorflow, keras)
    assert (problem is not None) == wrong
    if wrong:
        assert "pip install keras==" + ".".join(tensorflow.split(".")[:2]) in problem


def test_a_horovod_built_against_another_tensorflow_is_named_and_the_fix_is_to_rebuild_against_this_one():
    # TensorFlow's load_op_library raises NotFoundError (not an ImportError) for a library built against
    # another TensorFlow's ABI; this is its message's form
    exc = RuntimeError("/env/lib/python3.11/site-packages/horovod/tensorflow/mpi_lib.cpython-311-x86_64-linux-gnu.so: "
                       "undefined symbol: _ZN10tensorflow8OpKernel11TraceStringB5cxx11ERKNS_15OpKernelContextEb")
    check = doctor.horovod_failure(exc, checkout=False)
    assert check.status == "fail" and "undefined symbol" in check.finding
    assert "another TensorFlow" in check.fix and "--no-build-isolation horovod==0.28.1" in check.fix
    assert "make setup" not in check.fix  # installed with pip: no checkout to run make in


def test_fixes_name_make_setup_only_in_the_checkout():
    missing = ModuleNotFoundError("No module named 'horovod'", name="horovod")
    in_checkout, installed = doctor.horovod_failure(missing, checkout=True), doctor.horovod_failure(missing, checkout=False)
    assert in_checkout.finding == installed.finding == "not installed"
    assert "make setup" in in_checkout.fix and "make setup" not in installed.fix
    assert "HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1" in installed.fix


def test_this_checkout_is_seen_as_one():
    assert doctor.in_checkout()


def test_horovod_mpi4py_and_mpirun_from_two_mpis_fail_the_match(monkeypatch):
    # GIVEN Horovod linked against MPICH, mpi4py and mpirun Open MPI's
    libraries = {"horovod": (doctor.MPICH_ABI, "/opt/mpich/lib/libmpi.so.12"),
                 "mpi4py": (doctor.OPEN_MPI, "/lib/x86_64-linux-gnu/libmpi.so.40")}
    monkeypatch.setattr(doctor, "_linked", lambda path: libraries["horovod" if "horovod" in path else "mpi4py"])
    check = doctor._mpi_match()
    assert check.status == "fail"
    assert "horovod: MPICH" in check.finding and "mpi4py: Open MPI" in check.finding
    assert "one MPI" in check.fix


@pytest.mark.skipif(not HOROVOD, reason="needs the set-up's TensorFlow and Horovod")
def test_on_this_machine_every_check_of_the_set_up_passes():
    # `make setup` built all of it; only the cores check may warn (2 cores, 4 ranks by default)
    checks = {c.name: c for c in doctor.run_checks(1)}
    assert {"python", "tensorflow", "keras", "horovod", "mpirun", "mpi4py", "mpi match", "native marks"} <= set(checks)
    assert [c.name for c in checks.values() if c.status != "ok" and c.name not in ("memory", "cores")] == []
    assert checks["mpi match"].finding == "horovod: Open MPI; mpi4py: Open MPI; mpirun: Open MPI"
