"""Slurm's pure rules (store/backends/slurm.py): what a run may ask, the sbatch command and
script of an attempt, squeue --json read in both shapes. The real cluster:
tests/e2e/test_slurm_backend.py."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from pydantic import ValidationError

from trainctl.store.backends.slurm import (
    SlurmDefaults,
    SlurmOptions,
    batch_script,
    check_partition,
    check_time_limit,
    elastic_nodes,
    nodes_idle,
    nodes_to_exclude,
    nodes_up,
    parse_node_states,
    parse_partitions,
    parse_squeue,
    sbatch_command,
    signal_lead_seconds,
    time_limit_seconds,
)
from trainctl.store.db.placement import Placement

GANG = Placement(nnodes=2, gpus_per_node=8)
CPU = Placement(nnodes=1, gpus_per_node=0, procs_per_node=2)


@pytest.mark.parametrize(
    ("limit", "seconds"),
    [("90", 5400), ("1:30", 90), ("2:00:00", 7200), ("1-0", 86400), ("1-2:03", 93780),
     ("2-01:00:05", 176405)],
)  # fmt: skip
def test_every_slurm_time_format_is_read(limit: str, seconds: int) -> None:
    assert time_limit_seconds(limit) == seconds


@pytest.mark.parametrize("limit", ["", "soon", "1:2:3:4", "-1", "1h", "1:30\n", "1; reboot"])
def test_a_time_limit_in_no_slurm_format_is_refused_by_name(limit: str) -> None:
    with pytest.raises(ValidationError, match="time_limit"):
        SlurmOptions(time_limit=limit)


@pytest.mark.parametrize(
    "options",
    [
        {"partition": "gpu; rm -rf /"},
        {"partition": "$(id)"},
        {"account": "a`id`"},
        {"qos": "normal\n--wrap=x"},
        {"reservation": "r x"},
        {"constraint": "h100;id"},
        {"extra": {"output": "/etc/passwd"}},
        {"extra": {"wrap": "id"}},
        {"extra": {"requeue": "true"}},
        {"extra": {"mem": "10G\n"}},
        {"extra": {"no-container-mount-home": "yes"}},
        {"nodes": 3},
    ],
)
def test_what_a_run_may_not_ask_is_refused(options: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        SlurmOptions.model_validate(options)


def test_an_attempt_is_one_sbatch_with_trainctls_options_then_the_runs() -> None:
    options = SlurmOptions(
        partition="gpu", account="llm", time_limit="4:00:00", exclusive=True,
        extra={"mem": "0", "container-image": "nvcr.io#nvidia/pytorch:25.10-py3"},
    )  # fmt: skip
    args = sbatch_command("r1", 3, GANG, options, SlurmDefaults(qos="normal", partition="cpu"),
                          drain_seconds=120, output="/logs/slurm-r1-%j.out")  # fmt: skip
    assert args[:2] == ["sbatch", "--parsable"]
    for expected in ["--job-name=trainctl-r1", "--comment=trainctl run r1 attempt 3",
                     "--nodes=2", "--ntasks-per-node=1", "--no-requeue", "--signal=TERM@135",
                     "--gres=gpu:8", "--partition=gpu", "--account=llm", "--qos=normal",
                     "--time=4:00:00", "--exclusive", "--mem=0",
                     "--output=/logs/slurm-r1-%j.out"]:  # fmt: skip
        assert expected in args
    assert not any(a.startswith("--container") for a in args), "a container option is srun's"


def test_a_cpu_run_asks_cores_and_the_defaults_fill_what_it_leaves() -> None:
    args = sbatch_command("r2", 1, CPU, None, SlurmDefaults(partition="debug", time_limit="30"),
                          drain_seconds=60, output="o")  # fmt: skip
    assert "--cpus-per-task=2" in args and not any(a.startswith("--gres") for a in args)
    assert "--partition=debug" in args and "--time=30" in args


def test_the_script_quotes_every_word_and_runs_one_worker_per_node() -> None:
    options = SlurmOptions(extra={"container-mounts": "/a b:/c", "container-remap-root": "true"})
    script = batch_script("r3", ["/opt/py it/python", "-I", "-m", "trainctl.worker"], options)
    line = script.splitlines()[1]
    assert line.startswith("exec srun ")
    words = shlex.split(line)
    assert words[1:] == [
        "srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1", "--container-mounts=/a b:/c",
        "--container-remap-root", "/opt/py it/python", "-I", "-m", "trainctl.worker",
        "--slurm-run", "r3",
    ]  # fmt: skip
    # What sh reads is what was meant: no word splits or expands.
    echoed = subprocess.run(["sh", "-c", line.replace("exec srun", "printf '%s\\n'", 1)],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert echoed.splitlines() == words[2:]


def test_a_time_limit_that_leaves_no_time_to_train_is_refused() -> None:
    lead = signal_lead_seconds(15)
    assert lead == 30
    check_time_limit(SlurmOptions(time_limit="2"), SlurmDefaults(), 15)
    with pytest.raises(ValueError, match="leaves no time to train"):
        check_time_limit(SlurmOptions(time_limit="1"), SlurmDefaults(), 15)
    with pytest.raises(ValueError, match="leaves no time to train"):
        check_time_limit(None, SlurmDefaults(time_limit="1:00"), 15)
    check_time_limit(None, SlurmDefaults(), 15)  # the partition's limit: not ours to judge


def test_squeue_json_is_read_in_both_shapes_of_job_state() -> None:
    payload = {
        "jobs": [
            {"job_id": 7, "name": "trainctl-a", "job_state": "PENDING",
             "state_reason": "Resources", "nodes": ""},
            {"job_id": 8, "name": "trainctl-b", "job_state": ["RUNNING"],
             "state_reason": "None", "nodes": "n[1-2]"},
            {"job_id": 9, "name": "trainctl-c", "job_state": ["NODE_FAIL", "COMPLETING"]},
            {"name": "no id"},
            "not a job",
        ]
    }  # fmt: skip
    jobs = parse_squeue(payload)
    assert sorted(jobs) == ["7", "8", "9"]
    assert jobs["7"].pending and jobs["7"].reason == "Resources" and jobs["7"].nodes is None
    assert jobs["8"].state == "RUNNING" and jobs["8"].reason is None and jobs["8"].nodes == "n[1-2]"
    assert jobs["9"].ended and not jobs["8"].ended
    assert parse_squeue({}) == {} and parse_squeue({"jobs": None}) == {}


def test_a_partition_slurm_lacks_or_too_few_nodes_is_refused_before_sbatch() -> None:
    partitions = parse_partitions("debug* 1/2/0/3\ngpu 0/8/0/8\nnot a line\n")
    assert partitions["debug"].default and partitions["gpu"].nodes == 8
    check_partition(partitions, GANG, SlurmOptions(partition="gpu"), SlurmDefaults())
    check_partition(partitions, GANG, None, SlurmDefaults())  # the default: debug, 3 nodes
    with pytest.raises(ValueError, match=r"slurm.partition 'a100': no such partition .*debug, gpu"):
        check_partition(partitions, CPU, SlurmOptions(partition="a100"), SlurmDefaults())
    with pytest.raises(ValueError, match="TRAINCTL_SLURM_PARTITION 'a100'"):
        check_partition(partitions, CPU, None, SlurmDefaults(partition="a100"))
    with pytest.raises(ValueError, match="nnodes 4: partition 'debug' has 3 nodes"):
        check_partition(partitions, Placement(nnodes=4), None, SlurmDefaults())


def test_an_elastic_gang_asks_for_the_nodes_that_are_up_once_its_grace_has_passed() -> None:
    partitions = parse_partitions("debug* 1/1/1/3\n")  # one of three down or drained
    assert partitions["debug"].up == 2
    elastic = Placement(nnodes=3, min_nnodes=2, shrink_after_seconds=60)
    assert elastic_nodes(elastic, up=3, waited=0) == 3  # all up: all of them
    assert elastic_nodes(elastic, up=2, waited=10) is None  # the grace is still running
    assert elastic_nodes(elastic, up=2, waited=61) == 2  # then the nodes that are up
    assert elastic_nodes(elastic, up=1, waited=61) == 2  # never below min: Slurm waits
    assert elastic_nodes(elastic, up=None, waited=0) == 3  # sinfo silent: as asked
    assert elastic_nodes(Placement(nnodes=3), up=1, waited=600) == 3  # not elastic
    # A partition that holds its fewest, not its most, takes it.
    check_partition(partitions, elastic, None, SlurmDefaults())
    with pytest.raises(ValueError, match="nnodes 4: partition 'debug' has 3 nodes"):
        check_partition(partitions, Placement(nnodes=5, min_nnodes=4), None, SlurmDefaults())


def test_node_states_say_which_are_up_and_idle_and_an_attempt_keeps_off_stragglers() -> None:
    # `sinfo -h -N -o "%N %P %t"` as slurmctld 22.05 prints it: a node per partition it is in.
    sinfo = (
        "node1 debug* idle\nnode2 debug* alloc\nnode3 debug* mix\nnode4 debug* down*\n"
        "node5 debug* drain\nnode6 debug* idle~\nnode1 gpu comp\n"
    )
    states = parse_node_states(sinfo)
    up = {partition: nodes_up(nodes) for partition, nodes in states.items()}
    assert up == {"debug": ["node1", "node2", "node3", "node6"], "gpu": ["node1"]}
    assert nodes_idle(states["debug"]) == ["node1", "node6"]  # what an elastic gang grows on
    assert nodes_to_exclude(["node2"], up["debug"], 3) == ["node2"]
    assert nodes_to_exclude(["node2", "node3"], up["debug"], 3) == []  # two up besides
    assert nodes_to_exclude(["node2"], None, 1) == []  # not known: the job could wait for ever
    assert nodes_to_exclude([], up["debug"], 1) == []
    args = sbatch_command("r1", 2, GANG, None, SlurmDefaults(), drain_seconds=60, output="o",
                          exclude=["node2", "node7"])  # fmt: skip
    assert "--exclude=node2,node7" in args
    assert not any(a.startswith("--exclude") for a in sbatch_command(
        "r1", 2, GANG, None, SlurmDefaults(), drain_seconds=60, output="o"))  # fmt: skip
