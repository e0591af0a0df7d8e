"""A rolling upgrade of the Compose deployment under a steady client (issue 39,
item 4). The next version is this commit's image plus one new migration
(0007, which creates a table and writes one row into it): `memq init` of the
new image migrates, then every worker replica is replaced one at a time
(stopped, its clone on the new image started and ready, the old one
removed), the other replica of its kind serving meanwhile. Afterwards: no
request failed beyond the client's own retries, nothing acknowledged is lost
or duplicated, and the migration ran once (its row is there once, the
database at 0007).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import agent
import faults
import stack
from images import build
from podctl import Failed, healthcheck, healthy, logs_tail, podman, say, wait_exit

HERE = Path(__file__).resolve().parent
MIGRATION = "0007_deploy_test_upgrade.py"
SITE = "/opt/memq/lib/python3.11/site-packages/memq/workers/sql/migrations/versions"
CONTAINERFILE = f"""\
# The deploy test's "next version": the same code with one new migration.
ARG MEMQ_IMAGE
FROM ${{MEMQ_IMAGE}}
COPY {MIGRATION} {SITE}/{MIGRATION}
"""
MIGRATION_TEXT = '''\
"""deploy test: a migration of the next version

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A second run would fail here (the table exists) or write a second row.
    op.create_table("memq_deploy_test_upgrade", sa.Column("id", sa.Integer, primary_key=True), sa.Column("note", sa.Text))
    op.execute("INSERT INTO memq_deploy_test_upgrade (note) VALUES ('migrated once')")


def downgrade() -> None:
    op.drop_table("memq_deploy_test_upgrade")
'''


def next_image(tag: str) -> str:
    new = tag + "-next"
    with tempfile.TemporaryDirectory(prefix="memq-deploy-test-next-") as tmp:
        ctx = Path(tmp)
        (ctx / "Containerfile").write_text(CONTAINERFILE)
        (ctx / MIGRATION).write_text(MIGRATION_TEXT)
        build(new, ctx / "Containerfile", ctx, "--build-arg", f"MEMQ_IMAGE={tag}")
    return new


def psql(query: str) -> str:
    return podman(
        "exec", stack.name("postgres"), "psql", "-U", "memq", "-d", "memq", "-At", "-c", query, quiet=True
    ).stdout.strip()


def replace(container: str, image: str) -> float:
    """Stop one replica, start its clone on `image`, wait until it is ready, remove the old one."""
    started = time.monotonic()
    clone = container + "-next"
    test = healthcheck(container)  # the clone loses it (Podman 4.3)
    podman("container", "clone", container, clone, image, quiet=True)
    podman("stop", "-t", "30", container, quiet=True)
    podman("start", clone, quiet=True)
    healthy(clone, timeout=240, test=test)
    podman("rm", container, quiet=True)
    return time.monotonic() - started


async def run(secrets: stack.Secrets, env: dict[str, str], tag: str) -> dict[str, object]:
    new = await asyncio.to_thread(next_image, tag)
    client = await agent.connect(
        stack.NATS_URLS, secrets.tls / "ca.crt", stack.APP, secrets.password(f"app-{stack.APP}")
    )
    steady = agent.Steady(client, user="upgrade")
    task = asyncio.create_task(steady.run())
    replaced = []
    try:
        await asyncio.sleep(5)
        say(f"upgrade to {new}: memq init first (it migrates), then each replica in turn")
        init = stack.name("memq-init") + "-next"
        await asyncio.to_thread(podman, "container", "clone", stack.name("memq-init"), init, new, quiet=True)
        await asyncio.to_thread(podman, "start", init, quiet=True)
        code = await asyncio.to_thread(wait_exit, init, 300)
        if code != 0:
            raise Failed(f"memq init of {new} exited {code}:\n{logs_tail(init)}")
        say(
            "  memq init (next): "
            + " / ".join(line for line in logs_tail(init, 8).splitlines() if "revision" in line or "stream" in line)
        )
        for service in stack.WORKERS:
            for container in stack.replicas(service):
                took = await asyncio.to_thread(replace, container, new)
                replaced.append({"replica": container.removeprefix(stack.PROJECT + "_"), "s": round(took, 1)})
                say(
                    f"  replaced {container} in {took:.0f} s; {len(steady.acked)} acknowledged, {len(steady.failures)} failures"
                )
        await asyncio.sleep(5)
    finally:
        steady.stopping = True
        await task
        await client.close()
    images = {
        podman("inspect", "--format", "{{.ImageName}}", c, quiet=True).stdout.strip()
        for s in stack.WORKERS
        for c in stack.replicas(s)
    }
    if images != {new}:
        raise Failed(f"after the upgrade the workers run {images}, not only {new}")
    lag = await faults.consumers_drained(env)
    counts = await asyncio.to_thread(faults.count, steady)
    migrated = {
        "revision": psql("select version_num from alembic_version"),
        "rows": int(psql("select count(*) from memq_deploy_test_upgrade")),
    }
    result = {
        "image": new,
        "replaced": replaced,
        "counts": counts,
        "failures": [f[1] + " " + f[2] for f in steady.failures],
        "reads_ok": steady.reads_ok,
        "migration": migrated,
        "drained": lag,
    }
    say(f"upgrade: {counts}; failures {len(steady.failures)}; migration {migrated}")
    if counts["lost"] or counts["duplicated"] or counts["wrong_seq"] or steady.failures:
        raise Failed(f"the rolling upgrade lost, duplicated or failed requests: {result}")
    if migrated != {"revision": "0007", "rows": 1}:
        raise Failed(f"the migration did not run exactly once: {migrated}")
    return result
