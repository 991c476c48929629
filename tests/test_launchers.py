"""Launcher objects: options from the magic or the profile, and bad input (pure logic, no processes)."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from phalanx.cluster import ClusterError, LaunchOptions
from phalanx.cluster._launchers import LAUNCHERS, make_launcher
from phalanx.cluster._ssh import parse_hosts


def test_every_documented_launcher_has_an_object():
    kinds = {name: make_launcher(name, LaunchOptions()) for name in LAUNCHERS}
    assert all(launcher.name == name for name, launcher in kinds.items())
    # only local engines are their own engine set, so only they restart one rank alone
    assert [n for n, k in kinds.items() if k.one_set_per_engine] == ["local"]
    assert [n for n, k in kinds.items() if k.engines_here] == ["local", "mpi"]


def test_an_unknown_launcher_lists_the_valid_ones():
    with pytest.raises(ClusterError, match="unknown launcher 'kubernetes': choose one of local, mpi"):
        make_launcher("kubernetes", LaunchOptions())


@pytest.mark.parametrize("text,message", [("", "needs hosts"), ("a:x", "cannot read 'a:x'"),
                                          ("a:0", "cannot read 'a:0'"), (":2", "cannot read ':2'")])
def test_bad_hosts_are_refused(text, message):
    with pytest.raises(ClusterError, match=message):
        parse_hosts(text)


def test_hosts_add_up_and_default_to_one_engine():
    assert parse_hosts("a:2, b ,a:1") == {"a": 3, "b": 1}
    assert make_launcher("ssh", LaunchOptions(hosts="a:2,b:2")).default_count() == 4


def test_ssh_reads_hosts_and_options_from_the_profile_unless_the_magic_gives_them():
    config = Config()
    config.SSHEngineSetLauncher.engines = {"p1": 2}
    config.SSHEngineSetLauncher.ssh_args = ["-i", "key"]
    from_profile = make_launcher("ssh", LaunchOptions())
    from_profile.profile_config = config
    assert from_profile.hosts() == {"p1": 2}
    assert from_profile.ssh_args()[-2:] == ["-i", "key"]
    assert "BatchMode=yes" in from_profile.ssh_args()  # never a password prompt in a kernel
    from_magic = make_launcher("ssh", LaunchOptions(hosts="m1:1"))
    from_magic.profile_config = config
    assert from_magic.hosts() == {"m1": 1}


def test_the_controller_address_comes_from_ip_then_the_profile_then_the_route():
    assert make_launcher("slurm", LaunchOptions(ip="10.1.2.3")).listen_address("10.9.9.9") == "10.1.2.3"
    assert make_launcher("ssh", LaunchOptions(hosts="h:1")).listen_address("10.9.9.9") == "10.9.9.9"
    # with neither: the route towards the engines' host (here: this machine itself)
    assert make_launcher("ssh", LaunchOptions(hosts="127.0.0.1:1")).listen_address(None) == "127.0.0.1"
    assert make_launcher("local", LaunchOptions()).listen_address(None) == "127.0.0.1"


def test_batch_flags_go_to_the_submit_command_and_the_script_stays_with_the_cluster():
    slurm = make_launcher("slurm", LaunchOptions(submit_args='--partition=gpu --comment "a b"'))
    slurm.profile_dir = "/profile"
    kwargs = slurm.engine_kwargs("set-3", 2, {"PHALANX_SET": "set-3"})
    assert kwargs["submit_command"][-4:] == ["sbatch", "--partition=gpu", "--comment", "a b"]
    assert kwargs["batch_file_name"] == "/profile/log/slurm-set-3.sh"
    assert kwargs["environment"] == {"PHALANX_SET": "set-3"}
    with pytest.raises(ClusterError, match="--slurm-args"):
        make_launcher("slurm", LaunchOptions(submit_args='"unclosed')).submit_flags()
    with pytest.raises(ClusterError, match="c.LSFEngineSetLauncher.batch_template"):
        make_launcher("lsf", LaunchOptions(submit_args="-q gpu")).engine_kwargs("s", 1, {})
