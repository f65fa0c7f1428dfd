"""Rank, size, local rank, host and job from each launcher's environment (memdiag.agent.launcher_env).

The environments are the variables each launcher was seen to set on a 2-core machine (Open MPI 4.1.4's
mpirun, Slurm 22.05's srun with and without --mpi=pmix, an sbatch script, mpirun inside salloc), cut
to the ones that matter.
"""

from __future__ import annotations

import pytest

from memdiag.agent.launcher_env import HOROVOD, HYDRA, OPENMPI, SLURM, LauncherEnvError, current, detect, tasks_on_node

MPIRUN_RANK1 = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "1925578753",
                "PMIX_NAMESPACE": "1925578753", "PMIX_RANK": "1", "PMIX_HOSTNAME": "node7"}
SRUN_PMIX_RANK3 = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "0",
                   "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_JOB_ID": "812",
                   "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "c402-011", "PMIX_RANK": "3",
                   "PMIX_NAMESPACE": "slurm.pmix.812.0"}
# The allocation's variables as mpirun's ranks inherit them inside salloc or an sbatch script.
ALLOCATION = {"SLURM_JOB_ID": "4", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
              "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "2"}


def test_open_mpi_gives_rank_size_local_rank_host_and_its_job():
    env = detect(MPIRUN_RANK1)
    assert (env.launcher, env.rank, env.size, env.local_rank, env.local_size, env.host) == \
        (OPENMPI, 1, 2, 1, 2, "node7")
    assert env.job_id == "openmpi:1925578753"


def test_srun_gives_the_task_its_node_and_the_tasks_on_that_node():
    env = detect(SRUN_PMIX_RANK3)
    # node 1 of "3,1" holds one task
    assert (env.launcher, env.rank, env.size, env.local_rank, env.local_size, env.host) == \
        (SLURM, 3, 4, 0, 1, "c402-011")
    assert env.job_id == "slurm:812.0"


def test_two_steps_of_one_slurm_job_are_two_jobs():
    assert detect(SRUN_PMIX_RANK3).job_id != detect({**SRUN_PMIX_RANK3, "SLURM_STEP_ID": "1"}).job_id


def test_mpirun_inside_an_allocation_is_open_mpi_and_the_allocation_is_not_held_against_it():
    env = detect({**ALLOCATION, **MPIRUN_RANK1})
    assert (env.launcher, env.rank, env.size) == (OPENMPI, 1, 2)


def test_a_batch_script_itself_is_no_rank():
    with pytest.raises(LauncherEnvError, match="no launcher's environment"):
        detect(ALLOCATION)


def test_no_launcher_at_all_is_refused_in_a_line_that_names_the_launchers():
    with pytest.raises(LauncherEnvError) as error:
        detect({"PATH": "/usr/bin"})
    message = str(error.value)
    assert "\n" not in message and "srun" in message and "mpirun" in message and "memdiag run" in message


def test_open_mpi_and_its_pmix_rank_disagreeing_is_refused():
    with pytest.raises(LauncherEnvError, match="OMPI_COMM_WORLD_RANK=1 but PMIX_RANK=0"):
        detect({**MPIRUN_RANK1, "PMIX_RANK": "0"})


def test_slurm_and_the_pmix_rank_it_set_disagreeing_is_refused():
    with pytest.raises(LauncherEnvError, match="SLURM_PROCID=3 but PMIX_RANK=2"):
        detect({**SRUN_PMIX_RANK3, "PMIX_RANK": "2"})


def test_slurm_pmi2_size_disagreeing_is_refused():
    with pytest.raises(LauncherEnvError, match="SLURM_STEP_NUM_TASKS=4 but PMI_SIZE=8"):
        detect({**SRUN_PMIX_RANK3, "PMI_RANK": "3", "PMI_SIZE": "8"})


def test_horovod_variables_that_differ_from_mpi_are_refused():
    with pytest.raises(LauncherEnvError, match="HOROVOD_SIZE=4 but OMPI_COMM_WORLD_SIZE=2"):
        detect({**MPIRUN_RANK1, "HOROVOD_RANK": "1", "HOROVOD_SIZE": "4"})


def test_horovod_gloo_alone():
    env = detect({"HOROVOD_RANK": "2", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1",
                  "HOROVOD_HOSTNAME": "hostB", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1",
                  "HOROVOD_GLOO_RENDEZVOUS_PORT": "4001"})
    assert (env.launcher, env.rank, env.size, env.host, env.job_id) == (HOROVOD, 2, 3, "hostB",
                                                                      "horovod:10.0.0.1:4001")


def test_hydra():
    env = detect({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2",
                  "PMI_PORT": "node1:4242"})
    assert (env.launcher, env.rank, env.size, env.local_size) == (HYDRA, 0, 2, 2)


@pytest.mark.parametrize("env,needle", [
    ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='x'"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE"),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"}, "rank 2 of 2"),
    ({"PMIX_RANK": "0"}, "how many ranks"),
])
def test_damaged_environments_are_refused_in_one_line(env, needle):
    with pytest.raises(LauncherEnvError) as error:
        detect(env)
    assert needle in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("text,node,count", [("2", 0, 2), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1), ("4,1", 5, None),
                                             ("two", 0, None)])
def test_slurm_tasks_per_node(text, node, count):
    assert tasks_on_node(text, node) == count


def test_current_is_lenient_and_a_lone_process_is_rank_0_of_1():
    assert (current({}).rank, current({}).size) == (0, 1)
    # a disagreement is detect's to refuse; current reads the nearest launcher
    assert current({**MPIRUN_RANK1, "PMIX_RANK": "0"}).rank == 1
    assert current({**SRUN_PMIX_RANK3}).size == 4
