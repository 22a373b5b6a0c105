"""The per-job transfer secret in ``job.assign``: both roles get the same one, every delivery and
retry the same again (an agent may still be sending an earlier attempt), another job another one,
and it is keyed by SECRET_KEY, not guessable from the job id."""

import uuid

from controlplane.replication.jobs.messages import assign_message
from controlplane.replication.models import ReplicationJob


def test_both_roles_share_one_secret_per_job(db, settings):
    job = ReplicationJob(id=uuid.uuid4(), action="replicate", prefix_keys=[], attempt=1)
    src, tgt = (assign_message(job, r)["job"]["secret"] for r in ("source", "target"))
    assert src == tgt and len(src) == 64 and str(job.pk) not in src
    assert assign_message(job, "target")["job"]["secret"] == tgt  # redelivery: the same
    job.attempt = 2
    assert assign_message(job, "target")["job"]["secret"] == tgt  # a retry: the same job
    other = ReplicationJob(id=uuid.uuid4(), action="replicate", prefix_keys=[], attempt=1)
    assert assign_message(other, "target")["job"]["secret"] != tgt
    job.attempt = 1
    settings.SECRET_KEY = "another-installation-" + "x" * 40
    assert assign_message(job, "target")["job"]["secret"] != tgt  # keyed by SECRET_KEY
