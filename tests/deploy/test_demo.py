"""`make demo` again right after Ctrl-C: a run waits for the previous one to let go of its folder
and port, or says plainly what holds them; two presets live side by side."""

import socket
import sys

import pytest

from harness import launch as demo
from harness.processes import Proc


def _holder(lock_path) -> Proc:
    """A previous run's straggler: a child that inherited the lock and is still stopping."""
    code = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
        "fcntl.flock(fd, fcntl.LOCK_EX); os.pwrite(fd, b'pid straggler', 0); print('held', flush=True);"
        "sys.stdin.read()"
    )
    p = Proc("straggler", [sys.executable, "-c", code, str(lock_path)], pipe=True).start()
    assert p.readline().strip() == "held"
    return p


def test_a_run_waits_for_the_previous_one_then_takes_the_folder(tmp_path, capsys):
    data = tmp_path / "burst"
    straggler = _holder(str(data) + ".lock")
    try:
        with pytest.raises(SystemExit) as refused:
            demo.lock_run(data, timeout_s=0.5)
        assert "another demo of this preset is running (pid straggler" in str(refused.value)
        assert "waiting for the previous demo run to stop" in capsys.readouterr().out
    finally:
        straggler.communicate("")  # it exits, letting go of the lock
    fd = demo.lock_run(data, timeout_s=5)
    try:
        other = demo.lock_run(tmp_path / "steady", timeout_s=0.5)  # another preset: its own lock
        demo.os.close(other)
    finally:
        demo.os.close(fd)


def test_a_taken_port_is_waited_for_then_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not demo.port_free("127.0.0.1", port)
        with pytest.raises(SystemExit) as refused:
            demo.wait_for_port("127.0.0.1", port, timeout_s=0.5)
        assert f"port {port} on 127.0.0.1 is in use" in str(refused.value)
        assert f"PORT={port + 1} make demo" in str(refused.value)
    demo.wait_for_port("127.0.0.1", port, timeout_s=5)  # free again: returns at once


def test_a_measured_run_refuses_bad_policy_fields_and_a_folder_with_files(tmp_path, capsys):
    from harness.demo import main

    for fields, said in (("{", "--policy-fields is not JSON"), ("[1]", "must be a JSON object")):
        with pytest.raises(SystemExit) as refused:
            main(["--policy-fields", fields])
        assert refused.value.code == 2 and said in capsys.readouterr().err
    (tmp_path / "keep.txt").write_text("not the demo's")
    with pytest.raises(SystemExit):
        main(["--preset", "headline", "--once", "--data-dir", str(tmp_path)])
    assert "is not empty: name a new folder" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").exists()
