"""The compose files are valid for every profile and the GPU override, and say what the deployment needs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.service.main import create_app
from app.settings import Settings
from tests.deploy.conftest import COMPOSE_FILE, GPU_OVERRIDE, REPO, VARIANTS, compose_config, save_artifact

EXPECTED_SERVICES = {
    "default": {"api", "gateway"},
    "batch": {"api", "gateway", "indexer", "collection-indexer"},
    "train": {"api", "gateway", "trainer"},
    "gpu": {"api", "gateway", "indexer", "collection-indexer", "trainer"},
    "replicas": {"api", "gateway", "s3", "s3-bucket", "writer", "replica-1", "replica-2", "replicas-gateway"},
}
EXPECTED_SERVICES["all"] = (
    EXPECTED_SERVICES["batch"] | EXPECTED_SERVICES["train"] | EXPECTED_SERVICES["replicas"]
)
MODEL_SERVICES = ("api", "indexer", "collection-indexer", "trainer")
REPLICATION_SERVERS = ("writer", "replica-1", "replica-2")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_compose_config_is_valid(variant: str, env_project: Path) -> None:
    config, as_yaml = compose_config(variant, env_project)
    save_artifact(f"compose-config-{variant}.yml", as_yaml)
    print(as_yaml)
    assert set(config["services"]) == EXPECTED_SERVICES[variant]
    dockerfile = "docker/Dockerfile.gpu" if variant == "gpu" else "docker/Dockerfile"
    for name in set(MODEL_SERVICES + REPLICATION_SERVERS) & set(config["services"]):
        service = config["services"][name]
        assert service["build"]["dockerfile"] == dockerfile
        assert service["environment"]["CLOZE_BACKEND"] == "auto", "the .env reaches the containers"


def test_gpu_override_reserves_nvidia_devices() -> None:
    services = compose_config("gpu")[0]["services"]
    for name in MODEL_SERVICES:
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
        assert services[name]["image"].endswith(":gpu")
    assert services["api"]["deploy"]["replicas"] == 2, "the override keeps the base file's settings"
    assert "reservations" not in services["gateway"].get("deploy", {}).get("resources", {})


def test_api_replicas_read_the_index_the_indexer_writes() -> None:
    services = compose_config("batch")[0]["services"]
    api, indexer = services["api"], services["indexer"]
    api_index = next(v for v in api["volumes"] if v["target"] == "/data/index")
    indexer_index = next(v for v in indexer["volumes"] if v["target"] == "/data/index")
    assert api_index["source"] == indexer_index["source"] == "index"
    assert api_index.get("read_only") and not indexer_index.get("read_only")
    assert api["environment"]["CLOZE_INDEX"] == "/data/index"
    assert indexer["command"][indexer["command"].index("--out") + 1] == "/data/index"
    assert api["deploy"]["replicas"] >= 2 and api["restart"] == "unless-stopped"
    assert {"cpus", "memory"} <= set(api["deploy"]["resources"]["limits"])
    assert "/healthz" in " ".join(api["healthcheck"]["test"])


def test_api_replicas_read_the_collections_the_collection_indexer_writes() -> None:
    services = compose_config("batch")[0]["services"]
    api, indexer = services["api"], services["collection-indexer"]
    api_root = next(v for v in api["volumes"] if v["target"] == "/data/collections")
    indexer_root = next(v for v in indexer["volumes"] if v["target"] == "/data/collections")
    assert api_root["source"] == indexer_root["source"] == "collections"
    assert api_root.get("read_only") and not indexer_root.get("read_only")
    assert api["environment"]["CLOZE_COLLECTIONS_DIR"] == "/data/collections"
    command = indexer["command"]
    assert command[command.index("--root") + 1] == "/data/collections" and "--collection" in command


def test_gateway_waits_for_a_healthy_api() -> None:
    gateway = compose_config("default")[0]["services"]["gateway"]
    assert gateway["depends_on"]["api"]["condition"] == "service_healthy"
    assert gateway["ports"][0]["target"] == 8080
    conf = (REPO / "docker" / "nginx.conf").read_text()
    assert "listen 8080;" in conf and "http://api:8000" in conf


def test_env_example_names_are_real_settings_or_compose_variables() -> None:
    names = re.findall(r"^(CLOZE_[A-Z_]+)=", (REPO / ".env.example").read_text(), flags=re.M)
    settings = {f"CLOZE_{field.upper()}" for field in Settings.model_fields}
    compose_text = COMPOSE_FILE.read_text() + GPU_OVERRIDE.read_text()
    unknown = [n for n in names if n not in settings and f"${{{n}" not in compose_text]
    assert not unknown, f".env.example names that nothing reads: {unknown}"
    # CLOZE_INDEX and CLOZE_INDEX_READ_ONLY are set per service by the compose file itself
    undocumented = settings - set(names) - {"CLOZE_INDEX", "CLOZE_INDEX_READ_ONLY", "CLOZE_ONNX_CACHE"}
    assert not undocumented, f"settings missing from .env.example: {sorted(undocumented)}"


def test_replicas_profile_gives_each_server_its_own_volume_and_the_bucket_its_own_network() -> None:
    services = compose_config("replicas")[0]["services"]
    roles = {name: services[name]["environment"]["CLOZE_REPLICATION_ROLE"] for name in REPLICATION_SERVERS}
    assert roles == {"writer": "writer", "replica-1": "replica", "replica-2": "replica"}
    volumes = {}
    for name in REPLICATION_SERVERS:
        env = services[name]["environment"]
        assert env["CLOZE_REPLICATION_BUCKET"] == "s3://cloze-replicas/cluster"
        assert env["CLOZE_REPLICATION_ENDPOINT"] == "http://s3:9000"
        assert env["CLOZE_INDEX_READ_ONLY"] == "false" and env["CLOZE_INDEX"] == "/data/index"
        # the index, the other collections and the replication work folder all live on the server's volume
        assert env["CLOZE_COLLECTIONS_DIR"] == "/data/collections"
        data = next(v for v in services[name]["volumes"] if v["target"] == "/data")
        assert not data.get("read_only")
        volumes[name] = data["source"]
        assert set(services[name]["networks"]) == {"front", "wan"}
        assert services[name]["depends_on"]["s3-bucket"]["condition"] == "service_completed_successfully"
    assert len(set(volumes.values())) == 3, volumes
    assert not (services["writer"]["networks"]["front"] or {}).get("aliases")  # reads never reach it
    assert all(services[n]["networks"]["front"]["aliases"] == ["replica"] for n in ("replica-1", "replica-2"))
    assert set(services["s3"]["networks"]) == set(services["s3-bucket"]["networks"]) == {"wan"}
    assert services["s3"]["volumes"][0]["source"] == "s3"
    assert services["s3"]["ports"][0]["host_ip"] == "127.0.0.1", "the bucket's port is loopback by default"
    assert services["s3-bucket"]["command"] == ["mb", "--ignore-existing", "s3/cloze-replicas"]
    gateway = services["replicas-gateway"]
    assert set(gateway["networks"]) == {"front"} and gateway["ports"][0]["target"] == 8080
    assert {gateway["depends_on"][n]["condition"] for n in REPLICATION_SERVERS} == {"service_healthy"}
    assert gateway["volumes"][0]["source"].endswith("docker/nginx-replicas.conf")
    assert services["api"] == compose_config("default")[0]["services"]["api"], (
        "the default stack is unchanged"
    )


def test_replicas_gateway_sends_every_write_route_to_the_writer(tmp_path: Path) -> None:
    """The nginx map against the app's own route table: what a write key calls goes to the writer (replicas
    answer 409), and the jobs and snapshots, which live on the writer's disk; every other read to a replica."""
    conf = (REPO / "docker" / "nginx-replicas.conf").read_text()
    rules = re.findall(r'^\s+"~([^"]+)"\s+http://(\w+):8000;', conf, flags=re.M)
    assert rules and re.search(r"default\s+http://replica:8000;", conf)
    app = create_app(Settings(index=tmp_path / "index"), lane=False)
    checked: dict[str, int] = {"writer": 0, "replica": 0}
    for entry in app.state.routes.entries:
        path = re.sub(r"{[^}]+}", "x", entry.template)
        for method in entry.methods or ():
            access = app.state.routes.resolve_path(method, path).access
            expected = (
                "writer"
                if access in ("write", "admin") or re.search(r"/(jobs|snapshots)(/|$)", path)
                else "replica"
            )
            sent = next(
                (target for pattern, target in rules if re.search(pattern, f"{method} {path}")), "replica"
            )
            assert sent == expected, f"{method} {entry.template} goes to {sent}"
            checked[sent] += 1
    assert checked["writer"] >= 12 and checked["replica"] >= 40, checked
