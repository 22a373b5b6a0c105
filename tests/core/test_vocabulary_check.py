"""The vocabulary check of ``make lint`` (tests/vocabulary.py) finds a quoted wire word where the
rule says, names its file, line and protocol name, and leaves alone what the rule exempts."""

from pathlib import Path

from tests import vocabulary


def tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_stray_word_is_reported_with_its_file_line_and_name(tmp_path):
    root = tree(
        tmp_path,
        {
            "controlplane/x.py": 'A = 1\nif t == "lmcache-mp":\n    pass\n',
            "nodeagent/y.py": 'TIER = "GPU"\n',
            "bench/z.py": 'publish(g, "job.update", {})\n',
        },
    )
    assert sorted(vocabulary.hits(root)) == [
        ("bench/z.py", 1, "job.update", "EVENT_JOB_UPDATE"),
        ("controlplane/x.py", 2, "lmcache-mp", "TRANSPORT_LMCACHE_MP"),
        ("nodeagent/y.py", 1, "GPU", "TIER_GPU"),
    ]


def test_what_the_rule_exempts_is_not_reported(tmp_path):
    root = tree(
        tmp_path,
        {
            "wire/protocol.py": 'TIER_GPU = "GPU"\n',
            "controlplane/app/migrations/0001_initial.py": 'STATES = ["landed"]\n',
            "tests/test_wire.py": 'assert state == "succeeded"\n',
            # A sentence, an ambiguous word, a role and a word marked as something else.
            "controlplane/a.py": (
                '"""Copies land in the CPU tier."""\n'
                'user = row["user"]\n'
                'role = "source"\n'
                'if scheme != "tcp":  # not-vocabulary: the URL scheme\n'
                "    pass\n"
            ),
        },
    )
    assert list(vocabulary.hits(root)) == []


def test_a_marker_without_a_reason_does_not_exempt(tmp_path):
    root = tree(tmp_path, {"nodeagent/b.py": 'X = "tcp"  # not-vocabulary:\n'})
    assert [h[:3] for h in vocabulary.hits(root)] == [("nodeagent/b.py", 1, "tcp")]


def test_every_checked_word_is_a_protocol_value():
    from wire import protocol

    words = vocabulary.vocabulary()
    assert {"GPU", "tcp", "warmup", "replicate", "warming", "lmcache-pin", "gateway"} <= set(words)
    assert all(getattr(protocol, name) == word for word, name in words.items())
    assert not set(words) & set(vocabulary.AMBIGUOUS)
