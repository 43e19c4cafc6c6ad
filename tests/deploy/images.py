"""Images for the Docker stack test, made on a machine that reaches no image registry.

A user's machine pulls ``python:3.11-slim-bookworm`` and ``nginx:1.27-alpine`` and takes CPU torch from
the PyTorch index. Here none of those hosts answer, so the test substitutes, and only the test:

- a Debian bookworm minbase made with ``debootstrap`` from Debian's archive and ``docker import``ed,
  carrying the host's CA bundle (the package index is reached through a TLS proxy that bundle trusts);
- on top of it a Python 3.11 image (bookworm's python3) as ``PYTHON_IMAGE`` and a Debian nginx image as
  ``CLOZE_GATEWAY_IMAGE``;
- the CPU torch wheel from the host's wheel folder (/opt/wheels), served with its dependencies as a
  package index on 127.0.0.1 and handed to the Dockerfile through its own ``TORCH_INDEX_URL``.

The Dockerfiles stay what a user builds. Everything made here lives in Docker's own storage (images and
their layer cache), tagged by a hash of the recipe, so a second run reuses it and a changed recipe
rebuilds it. The project's own images keep one build: a build removes the images it replaced.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "deploy"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
DEBIAN_MIRROR = os.environ.get("CLOZE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
TORCH_WHEELS = Path(os.environ.get("CLOZE_TORCH_WHEELS", "/opt/wheels"))
# A fixed port: the index URL is a build argument, and a changed argument would miss the layer cache.
WHEEL_INDEX_PORT = int(os.environ.get("CLOZE_WHEEL_INDEX_PORT", "47811"))
# The CA bundle is copied in last: installing packages that pull ca-certificates regenerates the
# image's own bundle, which does not trust the proxy. PIP_CERT points at a copy nothing regenerates.
CA_IN_IMAGE = "/usr/local/share/cloze-test/host-ca.crt"
CA_STEP = (
    f"COPY host-ca.crt {CA_IN_IMAGE}\n"
    f"COPY host-ca.crt /etc/ssl/certs/ca-certificates.crt\n"
    f"ENV PIP_CERT={CA_IN_IMAGE} SSL_CERT_FILE={CA_IN_IMAGE}\n"
)
APT_INSTALL = (
    "RUN apt-get update \\\n"
    "    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {packages} \\\n"
    "    && rm -rf /var/lib/apt/lists/*\n"
)
# The stand-in for python:3.11-slim-bookworm: `python` on PATH (the Dockerfile calls it), venv, pip.
PYTHON_RECIPE = (
    "FROM {base}\n"
    + APT_INSTALL.format(packages="python3 python3-venv python-is-python3")
    + CA_STEP
    + 'CMD ["python3"]\n'
)
# The stand-in for nginx:1.27-alpine: nginx in the foreground, logs to the container's output, and
# only the conf.d server the compose file mounts (Debian's nginx.conf includes conf.d/*.conf).
NGINX_RECIPE = (
    "FROM {base}\n"
    + APT_INSTALL.format(packages="nginx-light")
    + "RUN rm -f /etc/nginx/sites-enabled/default \\\n"
    "    && ln -sf /dev/stdout /var/log/nginx/access.log \\\n"
    "    && ln -sf /dev/stderr /var/log/nginx/error.log\n"
    + CA_STEP
    + "STOPSIGNAL SIGQUIT\n"
    + 'CMD ["nginx", "-g", "daemon off;"]\n'
)

# The stand-in for minio/minio and minio/mc: moto's S3 server (the version the host's tests use) behind
# `minio`, the image's entrypoint, whatever the compose service's command says; and an `mc` that knows
# the three commands the profile runs. Moto keeps objects in memory: the `s3` volume then holds nothing.
S3_RECIPE = (
    "FROM {base}\n"
    "RUN python -m venv /opt/moto && /opt/moto/bin/pip install --no-cache-dir "
    + f'"moto[server]=={version("moto")}"\n'
    + "COPY minio mc /usr/local/bin/\n"
    + "RUN chmod 755 /usr/local/bin/minio /usr/local/bin/mc\n"
    'ENTRYPOINT ["/usr/local/bin/minio"]\n'
)
MINIO_STANDIN = "#!/bin/sh\nexec /opt/moto/bin/moto_server -H 0.0.0.0 -p 9000\n"
MC_STANDIN = """#!/opt/moto/bin/python
# mc's commands in the compose file: `mc ready local` (the healthcheck) and `mc mb --ignore-existing
# ALIAS/BUCKET` with the alias from MC_HOST_<ALIAS>=http://KEY:SECRET@HOST:PORT.
import os, sys, urllib.parse, urllib.request
import boto3

command, args = sys.argv[1], sys.argv[2:]
if command == "ready":
    urllib.request.urlopen("http://127.0.0.1:9000/", timeout=4)
elif command == "mb":
    alias, bucket = args[-1].split("/", 1)
    url = urllib.parse.urlsplit(os.environ[f"MC_HOST_{alias}"])
    s3 = boto3.client("s3", endpoint_url=f"{url.scheme}://{url.hostname}:{url.port}", region_name="us-east-1",
                      aws_access_key_id=url.username, aws_secret_access_key=url.password)
    if "--ignore-existing" not in args or bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=bucket)
    print(f"Bucket created successfully `{alias}/{bucket}`.")
else:
    sys.exit(f"mc stand-in: {command} is not supported")
"""


def docker(*args: str, check: bool = True, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}"
        )
    return result


def image_exists(name: str) -> bool:
    return image_id(name) is not None


def image_id(name: str) -> str | None:
    result = docker("image", "inspect", "-f", "{{.Id}}", name, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def image_size_mb(name: str) -> float:
    return round(int(docker("image", "inspect", "-f", "{{.Size}}", name).stdout) / 1e6, 1)


def _tag(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
    return digest.hexdigest()[:12]


@functools.cache
def _host_ca() -> bytes:
    assert HOST_CA.is_file(), f"{HOST_CA} missing: the containers could not reach the package index"
    return HOST_CA.read_bytes()


def legacy_build(tag: str, context: Path, log_name: str, *args: str, timeout: float = 1800) -> float:
    """``docker build`` with the classic builder: BuildKit would fetch its Dockerfile frontend image
    (the ``# syntax=`` line) from a registry. ``--network host`` lets RUN steps reach 127.0.0.1."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log = ARTIFACTS / log_name
    with log.open("w") as handle:
        result = subprocess.run(
            ["docker", "build", "--network", "host", "-t", tag, *args, str(context)],
            env={**os.environ, "DOCKER_BUILDKIT": "0"},
            stdout=handle,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
    text = log.read_text()
    assert result.returncode == 0, f"docker build of {tag} failed, log in {log}:\n{text[-6000:]}"
    return round(time.monotonic() - started, 1)


def minbase_image(stages: dict) -> str:
    """Debian bookworm minbase from the archive, imported as an image (no registry involved)."""
    name = f"cloze-test/bookworm-minbase:{_tag('minbase bookworm', DEBIAN_MIRROR, CA_IN_IMAGE, _host_ca())}"
    if image_exists(name):
        stages["base_minbase"] = {"cached": True, "seconds": 0.0}
        return name
    assert shutil.which("debootstrap"), "debootstrap missing: `make docker-engine` installs it"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="cloze-minbase-") as tmp:
        root = Path(tmp) / "rootfs"
        result = subprocess.run(
            ["debootstrap", "--variant=minbase", "bookworm", str(root), DEBIAN_MIRROR],
            capture_output=True,
            text=True,
            timeout=900,
        )
        (ARTIFACTS / "debootstrap.log").write_text(result.stdout + result.stderr)
        assert result.returncode == 0, f"debootstrap failed:\n{result.stderr[-3000:]}"
        # What a fresh image does not need: downloaded .debs and package lists (images run apt-get update)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / junk).glob("*"):
                if path.is_file():
                    path.unlink()
        for target in (CA_IN_IMAGE, "/etc/ssl/certs/ca-certificates.crt"):
            (root / target.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / target.lstrip("/")).write_bytes(_host_ca())
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "--change", f"ENV PIP_CERT={CA_IN_IMAGE} SSL_CERT_FILE={CA_IN_IMAGE}"]
            + ["--change", 'CMD ["bash"]', "-", name],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            timeout=600,
        )
        tar.wait()
        assert imported.returncode == 0 and tar.returncode == 0, f"docker import failed: {imported.stderr}"
    stages["base_minbase"] = {"cached": False, "seconds": round(time.monotonic() - started, 1)}
    return name


def derived_image(
    kind: str, recipe: str, base: str, stages: dict, files: dict[str, str] | None = None
) -> str:
    """``recipe`` on ``base``; ``files`` (name -> text) join the build context and the tag's hash."""
    dockerfile = recipe.format(base=base)
    files = files or {}
    name = f"cloze-test/{kind}:{_tag(dockerfile, _host_ca(), *(key + text for key, text in sorted(files.items())))}"
    if image_exists(name):
        stages[f"base_{kind}"] = {"cached": True, "seconds": 0.0}
        return name
    with tempfile.TemporaryDirectory(prefix=f"cloze-{kind}-") as tmp:
        (Path(tmp) / "Dockerfile").write_text(dockerfile)
        (Path(tmp) / "host-ca.crt").write_bytes(_host_ca())
        for file_name, text in files.items():
            (Path(tmp) / file_name).write_text(text)
        seconds = legacy_build(name, Path(tmp), f"build-{kind}.log", timeout=900)
    stages[f"base_{kind}"] = {"cached": False, "seconds": seconds}
    return name


def s3_image(python_image: str, stages: dict) -> str:
    """The stand-in for MinIO (and its client, ``mc``) of the compose file's `replicas` profile: see
    S3_RECIPE. One image serves both services: ``CLOZE_S3_IMAGE`` and ``CLOZE_S3_CLIENT_IMAGE``."""
    return derived_image(
        "s3", S3_RECIPE, python_image, stages, files={"mc": MC_STANDIN, "minio": MINIO_STANDIN}
    )


def base_images(stages: dict) -> dict[str, str]:
    """{"python": ..., "nginx": ...}: the local stand-ins for the images a user pulls."""
    base = minbase_image(stages)
    return {
        "python": derived_image("python", PYTHON_RECIPE, base, stages),
        "nginx": derived_image("nginx", NGINX_RECIPE, base, stages),
    }


def host_torch_version() -> str:
    """The CPU torch the project is tested with (e.g. 2.13.0+cpu), read without importing torch."""
    return version("torch")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's name
        pass


@contextlib.contextmanager
def torch_wheel_index(torch_version: str) -> Iterator[str]:
    """A PEP 503 index on 127.0.0.1 holding the host's CPU torch wheel and its dependencies.

    ``pip download`` fills it: torch from the wheel folder, its dependencies from the package index
    the host uses. Yields the index URL, for the Dockerfile's TORCH_INDEX_URL.
    """
    with tempfile.TemporaryDirectory(prefix="cloze-wheels-") as tmp:
        flat = Path(tmp) / "flat"
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-cache-dir", "--only-binary", ":all:"]
            + ["--find-links", str(TORCH_WHEELS), "-d", str(flat), f"torch=={torch_version}"],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, f"pip download of torch=={torch_version} failed:\n{result.stderr}"
        simple = Path(tmp) / "simple"
        for wheel in flat.glob("*.whl"):
            project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
            (simple / project).mkdir(parents=True, exist_ok=True)
            os.link(wheel, simple / project / wheel.name)
        handler = functools.partial(_QuietHandler, directory=tmp)
        try:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEEL_INDEX_PORT), handler)
        except OSError as exc:
            raise AssertionError(
                f"127.0.0.1:{WHEEL_INDEX_PORT} is taken; set CLOZE_WHEEL_INDEX_PORT to a free port"
            ) from exc
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{WHEEL_INDEX_PORT}/simple"
        finally:
            server.shutdown()
            server.server_close()


# The images this process's builds replaced (test_stack.py checks that they are gone).
REPLACED: list[str] = []


def project_image(tag: str, dockerfile: str, log_name: str, *build_args: str, timeout: float = 1800) -> dict:
    """One of docker/'s two-stage Dockerfiles, built with its build stage tagged ``<tag>-build``.

    The project's files change from run to run, so each build makes new layers, and the last run's
    build stage and runtime image would stay behind untagged: 2.4 GB a run, which once filled this
    machine's disk. With both stages tagged, the images a new build replaced are known and removed
    once it stands; the layers the builds share (the torch install) have the new images as children,
    so they stay as the cache. Returns the stage's seconds and its cached steps."""
    stage_tag = f"{tag}-build"
    previous = {name: image_id(name) for name in (stage_tag, tag)}
    args = ("-f", str(REPO / "docker" / dockerfile), *build_args)
    seconds = legacy_build(stage_tag, REPO, f"stage-{log_name}", "--target", "build", *args, timeout=timeout)
    seconds += legacy_build(tag, REPO, log_name, *args, timeout=timeout)
    for name, old in previous.items():
        if old is not None and old != image_id(name):
            REPLACED.append(old)
            docker("rmi", old, check=False)  # test_stack.py says so if an old container still holds it
    logs = (ARTIFACTS / f"stage-{log_name}", ARTIFACTS / log_name)
    return {
        "seconds": round(seconds, 1),
        "cached_steps": sum(log.read_text().count("Using cache") for log in logs),
    }


def cpu_image(tag: str, python_image: str, stages: dict) -> str:
    """docker/Dockerfile as it is, with the local Python base and the local torch wheel."""
    torch_version = host_torch_version()
    assert "+cpu" in torch_version, f"the test venv's torch is {torch_version}, not a CPU build"
    with torch_wheel_index(torch_version) as index_url:
        stages["cpu_image"] = project_image(
            tag,
            "Dockerfile",
            "build-cpu.log",
            "--build-arg",
            f"PYTHON_IMAGE={python_image}",
            "--build-arg",
            f"TORCH_INDEX_URL={index_url}",
            "--build-arg",
            f"TORCH_VERSION={torch_version}",
        )
    return tag


def gpu_image(tag: str, debian_base: str, stages: dict) -> str:
    """docker/Dockerfile.gpu on a Debian base: CUDA torch and onnxruntime-gpu come from the package
    index (their wheels bundle the CUDA libraries), so no CUDA base image is needed to build it."""
    stages["gpu_image"] = project_image(
        tag,
        "Dockerfile.gpu",
        "build-gpu.log",
        "--build-arg",
        f"CUDA_IMAGE={debian_base}",
        "--build-arg",
        "TORCH_INDEX_URL=https://pypi.org/simple",
        timeout=3600,
    )
    return tag


def main() -> None:
    """`python -m tests.deploy.images gpu`: build the GPU image on the local Debian base and report."""
    if sys.argv[1:] != ["gpu"]:
        raise SystemExit("usage: python -m tests.deploy.images gpu")
    stages: dict = {}
    tag = gpu_image("cloze-search:test-gpu", minbase_image(stages), stages)
    report = {"stages": stages, "images_mb": {"cloze-search (GPU)": image_size_mb(tag)}}
    (ARTIFACTS / "gpu-image.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
