"""memq deployed for real, on this machine, with Podman (issue 39): the image
from infra/Dockerfile, infra/compose.yaml whole (3 NATS nodes with TLS and R3
streams, PostgreSQL, Redis, Weaviate, `memq init`, every worker kind with
replicas, the HTTP gateway), faults inside it under a steady client, a rolling
upgrade, and infra/k8s through `podman kube play`. An agent outside the
containers checks each stack. Everything it makes is named memq-deploy-test*
and removed at the end (the images are kept as a cache: --rm-images).

    .venv/bin/python infra/scripts/deploy_test/deploy_test.py [--steps image,compose,faults,upgrade,kube]
    bash infra/dev.sh deploy-test                      # the same, after setting up .venv

It exits non-zero on the first failure, after cleaning up. Results (counts,
timings) go to --out (default bench-results/deploy-test.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import images
import stack
from podctl import PREFIX, Failed, podman, say

ROOT = Path(__file__).resolve().parents[3]
STEPS = ("image", "compose", "faults", "upgrade", "kube")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {','.join(STEPS)}")
    parser.add_argument("--keep", action="store_true", help="leave the stack running (then clean up with --down)")
    parser.add_argument("--down", action="store_true", help="only remove what an earlier --keep run left")
    parser.add_argument("--rm-images", action="store_true", help="also remove the images it built (not the base)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "deploy-test.json")
    args = parser.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    if unknown := set(steps) - set(STEPS):
        parser.error(f"unknown steps {sorted(unknown)}")
    started = time.monotonic()
    results: dict[str, object] = {"steps": steps}
    work = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-"))
    memq = ROOT / ".venv" / "bin" / "memq"
    env: dict[str, str] = {}
    ok = False
    try:
        images.prerequisites()
        if args.down:
            import kube

            stack.down(stack.compose_env(stack.make_secrets(work, memq), {}))
            kube.down(work)
            return 0
        images.base_image()
        images.server_images(work)
        tag = images.memq_image()
        results["image"] = images.check_memq_image(tag)
        built = {
            "MEMQ_IMAGE": tag,
            "NATS_IMAGE": images.NATS,
            "POSTGRES_IMAGE": images.POSTGRES,
            "REDIS_IMAGE": images.REDIS,
            "WEAVIATE_IMAGE": images.WEAVIATE,
        }
        secrets = stack.make_secrets(work, memq)
        env = stack.compose_env(secrets, built)
        if {"compose", "faults", "upgrade"} & set(steps):
            stack.down(env)  # what an interrupted run left
            stack.up(env)
            results["streams"] = stack.check_streams(env)
            say("memq status (inside the deployment):\n    " + "\n    ".join(stack.status(env).strip().splitlines()))
            results["compose"] = asyncio.run(client_check(secrets))
        if "faults" in steps:
            import faults

            results["faults"] = asyncio.run(faults.run(secrets, env))
        if "upgrade" in steps:
            import upgrade

            results["upgrade"] = asyncio.run(upgrade.run(secrets, env, tag))
        if not args.keep:
            stack.down(env)
        if "kube" in steps:
            import kube

            results["kube"] = kube.run(secrets, built, work, keep=args.keep)
        ok = True
    except Failed as exc:
        say(f"FAILED: {exc}")
    except Exception:
        say("FAILED with an unexpected error:\n" + traceback.format_exc())
    finally:
        if not ok and not args.keep and env:
            say("cleaning up after the failure")
            stack.down(env)
            if "kube" in steps:
                import kube

                kube.down(work)
        if args.rm_images:
            for image in (
                images.PYTHON,
                images.NATS,
                images.POSTGRES,
                images.REDIS,
                images.WEAVIATE,
                *images.memq_tags(),
            ):
                podman("rmi", "-f", image, check=False)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)  # the run's secrets and certificates
        left = podman("ps", "-a", "--format", "{{.Names}}", quiet=True).stdout.split()
        if not args.keep and any(n.startswith(PREFIX) for n in left):
            say(f"left behind: {[n for n in left if n.startswith(PREFIX)]}")
            ok = False
    if stack.STUCK:
        results["restarted_stuck_replicas"] = stack.STUCK
        say(
            f"WARNING: {len(stack.STUCK)} replica(s) were not ready and were restarted: {[x['replica'] for x in stack.STUCK]}"
        )
    results["ok"] = ok
    results["seconds"] = round(time.monotonic() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    say(f"{'PASSED' if ok else 'FAILED'} in {results['seconds']} s ({', '.join(steps)}); results in {args.out}")
    return 0 if ok else 1


async def client_check(secrets: stack.Secrets) -> dict[str, object]:
    import agent

    password = secrets.password(f"app-{stack.APP}")
    return await agent.client_check(
        stack.NATS_URLS, secrets.tls / "ca.crt", stack.APP, password, stack.http_url(), secrets.api_key
    )


if __name__ == "__main__":
    sys.exit(main())
