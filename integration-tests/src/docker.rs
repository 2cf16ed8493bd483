//! Starting the emulators as Docker containers (feature `docker`).
//!
//! One container per emulator serves all tests of a test binary. The containers are marked
//! reusable (`ReuseDirective::Always`): testcontainers does not remove them when the process
//! ends, and the next test binary or run finds and reuses the same container instead of leaking
//! a new one. Remove them with
//! `docker rm -f $(docker ps -aq --filter label=org.leader-lease.harness=1)`.

use std::time::Duration;

use testcontainers::core::client::docker_client_instance;
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt, ReuseDirective};
use tokio::sync::OnceCell;

use crate::{Emulator, images};

const LABEL: &str = "org.leader-lease.harness";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);

struct Started {
    // Kept so the handle lives as long as the process (reusable: never removed on drop).
    _container: ContainerAsync<GenericImage>,
    url: String,
}

static AZURITE: OnceCell<Started> = OnceCell::const_new();
static LOCALSTACK: OnceCell<Started> = OnceCell::const_new();
static LOCALSTACK_S3: OnceCell<Started> = OnceCell::const_new();
static FAKE_GCS: OnceCell<Started> = OnceCell::const_new();
static ETCD: OnceCell<Started> = OnceCell::const_new();
static ZOOKEEPER: OnceCell<Started> = OnceCell::const_new();

/// Whether a Docker engine answers a ping.
pub(crate) async fn engine_answers() -> bool {
    match docker_client_instance().await {
        Ok(docker) => docker.ping().await.is_ok(),
        Err(_) => false,
    }
}

/// Starts (once per process) or reuses the container of `emulator`; returns its endpoint URL.
pub(crate) async fn start(emulator: Emulator) -> Result<String, String> {
    let cell = match emulator {
        Emulator::Azurite => &AZURITE,
        Emulator::DynamoDb => &LOCALSTACK,
        Emulator::Gcs => &FAKE_GCS,
        Emulator::Etcd => &ETCD,
        Emulator::ZooKeeper => &ZOOKEEPER,
        // No moto image is pinned: both S3 emulators are LocalStack's S3 in Docker.
        Emulator::MotoS3 | Emulator::LocalStackS3 => &LOCALSTACK_S3,
    };
    let started = cell
        .get_or_try_init(|| launch(emulator))
        .await
        .map_err(|e| e.to_string())?;
    Ok(started.url.clone())
}

async fn launch(emulator: Emulator) -> Result<Started, testcontainers::TestcontainersError> {
    // (image, container port, URL scheme, URL path)
    let (image, port, scheme, path) = match emulator {
        Emulator::Azurite => (
            GenericImage::new(images::AZURITE.0, images::AZURITE.1)
                .with_exposed_port(10000.tcp())
                .with_wait_for(WaitFor::message_on_stdout("successfully listens"))
                .with_cmd([
                    "azurite-blob",
                    "--blobHost",
                    "0.0.0.0",
                    "--blobPort",
                    "10000",
                    "--inMemoryPersistence",
                    "--skipApiVersionCheck",
                    "--disableTelemetry",
                ]),
            10000,
            "http://",
            "/devstoreaccount1",
        ),
        Emulator::DynamoDb => (
            GenericImage::new(images::LOCALSTACK.0, images::LOCALSTACK.1)
                .with_exposed_port(4566.tcp())
                .with_wait_for(WaitFor::message_on_stdout("Ready."))
                .with_env_var("SERVICES", "dynamodb"),
            4566,
            "http://",
            "",
        ),
        Emulator::MotoS3 | Emulator::LocalStackS3 => (
            GenericImage::new(images::LOCALSTACK.0, images::LOCALSTACK.1)
                .with_exposed_port(4566.tcp())
                .with_wait_for(WaitFor::message_on_stdout("Ready."))
                .with_env_var("SERVICES", "s3"),
            4566,
            "http://",
            "",
        ),
        Emulator::Gcs => (
            GenericImage::new(images::FAKE_GCS.0, images::FAKE_GCS.1)
                .with_exposed_port(4443.tcp())
                .with_wait_for(WaitFor::message_on_stderr("server started at"))
                .with_cmd(["-scheme", "http", "-port", "4443", "-backend", "memory"]),
            4443,
            "http://",
            "",
        ),
        Emulator::Etcd => (
            GenericImage::new(images::ETCD.0, images::ETCD.1)
                .with_exposed_port(2379.tcp())
                .with_wait_for(WaitFor::message_on_stderr("ready to serve client requests"))
                .with_cmd([
                    "/usr/local/bin/etcd",
                    "--name=leader-test",
                    "--data-dir=/tmp/etcd-data",
                    "--listen-client-urls=http://0.0.0.0:2379",
                    "--advertise-client-urls=http://127.0.0.1:2379",
                    "--listen-peer-urls=http://127.0.0.1:2380",
                    "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                    "--initial-cluster=leader-test=http://127.0.0.1:2380",
                    "--logger=zap",
                ]),
            2379,
            "http://",
            "",
        ),
        // The image writes zoo.cfg from these variables; the settings of scripts/emulators.
        Emulator::ZooKeeper => (
            GenericImage::new(images::ZOOKEEPER.0, images::ZOOKEEPER.1)
                .with_exposed_port(2181.tcp())
                .with_wait_for(WaitFor::message_on_stdout(
                    "PrepRequestProcessor (sid:0) started",
                ))
                .with_env_var("ZOO_TICK_TIME", "200")
                .with_env_var("ZOO_ADMINSERVER_ENABLED", "false")
                .with_env_var("ZOO_4LW_COMMANDS_WHITELIST", "ruok,srvr,stat")
                .with_env_var(
                    "ZOO_CFG_EXTRA",
                    "minSessionTimeout=400 maxSessionTimeout=120000",
                ),
            2181,
            "",
            "",
        ),
    };
    let container = image
        .with_label(LABEL, "1")
        .with_startup_timeout(STARTUP_TIMEOUT)
        .with_reuse(ReuseDirective::Always)
        .start()
        .await?;
    let host = container.get_host().await?;
    let host_port = container.get_host_port_ipv4(port).await?;
    Ok(Started {
        _container: container,
        url: format!("{scheme}{host}:{host_port}{path}"),
    })
}
