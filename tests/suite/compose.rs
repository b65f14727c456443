//! `docker-compose.yml` and the `Dockerfile` checked against the repository
//! and the CLI, without a Docker engine: every path they name exists, every
//! flag they pass is one `fusebox serve` accepts, the ports agree, and the
//! mounted config is one the server starts with.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;

use crate::harness::BIN;

/// The repository's root, where the compose file and the Dockerfile live.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The parts of a compose file that these checks read; the rest is ignored.
#[derive(Debug, Deserialize)]
struct Compose {
    services: BTreeMap<String, Service>,
}

#[derive(Debug, Deserialize)]
struct Service {
    #[serde(default)]
    profiles: Vec<String>,
    build: Option<Build>,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    ports: Vec<Port>,
    #[serde(default)]
    volumes: Vec<Volume>,
    #[serde(default)]
    environment: BTreeMap<String, String>,
}

/// `build: DIR` or `build: { context: DIR, dockerfile: FILE }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Build {
    Context(String),
    Long {
        context: Option<String>,
        dockerfile: Option<String>,
    },
}

/// `"HOST:CONTAINER"` (optionally `IP:HOST:CONTAINER/PROTO`) or the long form.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Port {
    Short(String),
    Long { target: u16 },
}

impl Port {
    /// The port inside the container.
    fn container(&self) -> u16 {
        match self {
            Port::Long { target } => *target,
            Port::Short(text) => {
                let last = text.rsplit(':').next().expect("rsplit yields one part");
                let number = last.split('/').next().expect("split yields one part");
                number
                    .parse()
                    .unwrap_or_else(|e| panic!("ports: {text:?} ends in a port number ({e})"))
            }
        }
    }
}

/// `"SOURCE:TARGET[:MODE]"` or `{ type: bind, source, target, read_only }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Volume {
    Short(String),
    Long {
        source: String,
        target: String,
        #[serde(default)]
        read_only: bool,
    },
}

impl Volume {
    /// (host path, container path, read-only).
    fn parts(&self) -> (String, String, bool) {
        match self {
            Volume::Long {
                source,
                target,
                read_only,
            } => (source.clone(), target.clone(), *read_only),
            Volume::Short(text) => {
                let parts: Vec<&str> = text.split(':').collect();
                match parts.as_slice() {
                    [source, target] => (source.to_string(), target.to_string(), false),
                    [source, target, mode] => (
                        source.to_string(),
                        target.to_string(),
                        mode.split(',').any(|m| m == "ro"),
                    ),
                    _ => panic!("volumes: {text:?} is SOURCE:TARGET[:MODE]"),
                }
            }
        }
    }
}

/// The compose file's services.
fn services() -> BTreeMap<String, Service> {
    let path = root().join("docker-compose.yml");
    let text = std::fs::read_to_string(&path).expect("docker-compose.yml at the repository root");
    let compose: Compose = serde_norway::from_str(&text)
        .unwrap_or_else(|e| panic!("docker-compose.yml is a compose file: {e}"));
    compose.services
}

/// The one service that `docker compose up` runs (no profile), by name.
fn service() -> (String, Service) {
    let mut services = services()
        .into_iter()
        .filter(|(_, s)| s.profiles.is_empty());
    let first = services
        .next()
        .expect("docker-compose.yml defines a service");
    assert!(
        services.next().is_none(),
        "docker-compose.yml runs one service by default, fusebox"
    );
    first
}

/// The `fleet` profile: Redis nodes built with the module, and fusebox
/// servers whose `--store` names every one of them.
#[test]
fn the_fleet_profile_runs_fusebox_servers_on_a_cluster_of_its_redis_nodes() {
    let fleet: Vec<(String, Service)> = services()
        .into_iter()
        .filter(|(_, s)| s.profiles.iter().any(|p| p == "fleet"))
        .collect();
    let redis: Vec<&Service> = fleet
        .iter()
        .filter(|(name, _)| name.starts_with("redis-") && name != "redis-cluster")
        .map(|(_, s)| s)
        .collect();
    assert_eq!(redis.len(), 6, "three primaries and three replicas");
    for node in &redis {
        match &node.build {
            Some(Build::Long {
                dockerfile: Some(file),
                ..
            }) => assert!(root().join(file).is_file(), "{file} exists"),
            other => panic!("a Redis node builds redis/Dockerfile, not {other:?}"),
        }
    }
    let servers: Vec<&(String, Service)> = fleet
        .iter()
        .filter(|(name, _)| name.starts_with("fusebox-"))
        .collect();
    assert!(servers.len() >= 2, "at least two fusebox servers");
    for (name, server) in servers {
        let what = format!("docker-compose.yml service {name:?}");
        let flags = serve_command(&what, &server.command);
        let store = flag(&flags, "--store").unwrap_or_else(|| panic!("{what} passes --store"));
        let url = fusebox::engine::redis::StoreUrl::parse(store)
            .unwrap_or_else(|e| panic!("{what}: --store {store}: {e}"));
        assert!(url.cluster && url.nodes.len() == 6, "{what}: {url}");
        for name in ["--listen", "--http"] {
            listen(&what, &flags, name);
        }
    }
}

/// `--flag value` pairs of a `serve` command line; a flag followed by
/// another flag (or nothing) has no value.
fn flags(args: &[String]) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        assert!(
            arg.starts_with("--"),
            "serve takes only --flags, not {arg:?}"
        );
        match args.get(i + 1).filter(|next| !next.starts_with("--")) {
            Some(value) => {
                out.push((arg.clone(), Some(value.clone())));
                i += 2;
            }
            None => {
                out.push((arg.clone(), None));
                i += 1;
            }
        }
    }
    out
}

/// The value of `flag` in a `serve` command line.
fn flag<'a>(flags: &'a [(String, Option<String>)], flag: &str) -> Option<&'a str> {
    flags
        .iter()
        .find(|(name, _)| name == flag)
        .and_then(|(_, value)| value.as_deref())
}

/// The long flags `fusebox serve --help` lists.
fn serve_flags() -> BTreeSet<String> {
    let output = std::process::Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .expect("fusebox runs");
    assert!(output.status.success(), "`fusebox serve --help` succeeds");
    let help = String::from_utf8(output.stdout).expect("UTF-8 help");
    help.split_whitespace()
        .filter(|word| word.starts_with("--"))
        .map(|word| {
            word.trim_end_matches(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .to_owned()
        })
        .collect()
}

/// Checks that `command` is `serve` with flags the CLI accepts, and returns them.
fn serve_command(what: &str, command: &[String]) -> Vec<(String, Option<String>)> {
    assert_eq!(
        command.first().map(String::as_str),
        Some("serve"),
        "{what} runs `fusebox serve`: {command:?}"
    );
    let known = serve_flags();
    assert!(
        known.contains("--config") && known.contains("--listen"),
        "serve --help lists its flags: {known:?}"
    );
    let flags = flags(&command[1..]);
    for (name, _) in &flags {
        assert!(
            known.contains(name),
            "{what} passes {name}, which `fusebox serve --help` does not list ({known:?})"
        );
    }
    flags
}

/// The address a `serve` command line passes in `name` (`--listen`, or
/// `--http`), which must be on every interface.
fn listen(what: &str, flags: &[(String, Option<String>)], name: &str) -> SocketAddr {
    let text = flag(flags, name).unwrap_or_else(|| panic!("{what} passes {name}"));
    let addr: SocketAddr = text
        .parse()
        .unwrap_or_else(|e| panic!("{what}: {name} {text:?} is an address ({e})"));
    assert!(
        addr.ip().is_unspecified(),
        "{what}: inside a container the server must listen on every interface \
         (0.0.0.0), not {name} {addr}, or published ports cannot reach it"
    );
    addr
}

#[tokio::test]
async fn the_compose_service_serves_the_mounted_config_on_its_published_port() {
    let (name, service) = service();
    let what = format!("docker-compose.yml service {name:?}");

    // It builds this repository's Dockerfile.
    let (context, dockerfile) = match &service.build {
        Some(Build::Context(dir)) => (dir.clone(), None),
        Some(Build::Long {
            context,
            dockerfile,
        }) => (
            context.clone().unwrap_or_else(|| ".".into()),
            dockerfile.clone(),
        ),
        None => panic!("{what} builds the image (`build: .`)"),
    };
    let context = root().join(context);
    let dockerfile = context.join(dockerfile.as_deref().unwrap_or("Dockerfile"));
    assert!(
        dockerfile.is_file(),
        "{what} builds {}",
        dockerfile.display()
    );

    let flags = serve_command(&what, &service.command);

    // The published container ports are the ones the server listens on:
    // gRPC and HTTP (the dashboard and metrics).
    let addr = listen(&what, &flags, "--listen");
    let http = listen(&what, &flags, "--http").port();
    let published: Vec<u16> = service.ports.iter().map(Port::container).collect();
    assert_eq!(
        published,
        vec![addr.port(), http],
        "{what}: the container ports in `ports` are the --listen and --http ports"
    );
    // The published ports are never open: the config has [auth], and its
    // admin token comes from the environment, which compose requires.
    let token_env = service
        .environment
        .get("FUSEBOX_TOKEN")
        .unwrap_or_else(|| panic!("{what} passes FUSEBOX_TOKEN"));
    assert!(
        token_env.starts_with("${FUSEBOX_TOKEN:?"),
        "{what}: FUSEBOX_TOKEN is required from the host (`${{FUSEBOX_TOKEN:?...}}`), not {token_env:?}"
    );

    // --config names a file mounted from the repository, read-only.
    let config = flag(&flags, "--config").unwrap_or_else(|| panic!("{what} passes --config"));
    let mounts: Vec<(String, String, bool)> = service.volumes.iter().map(Volume::parts).collect();
    let (host, _, read_only) = mounts
        .iter()
        .find(|(_, target, _)| target == config)
        .unwrap_or_else(|| panic!("{what}: --config {config} is a mounted file ({mounts:?})"));
    assert!(read_only, "{what}: the config is mounted read-only (:ro)");
    let host = root().join(host);
    assert!(
        host.is_file(),
        "{what} mounts {}, which exists in the repository",
        host.display()
    );

    // The server starts with exactly those flags, on a free local port.
    let mut args = vec!["serve".to_owned()];
    for (name, value) in &flags {
        args.push(name.clone());
        match (name.as_str(), value) {
            ("--config", _) => args.push(host.display().to_string()),
            ("--listen" | "--http", _) => args.push("127.0.0.1:0".into()),
            (_, Some(value)) => args.push(value.clone()),
            (_, None) => {}
        }
    }
    let token = "compose-admin-token-0123456789";
    let (_server, address) = serve(&args, token).await;
    // And it answers there, to the token only.
    let get = |token: Option<&str>| {
        let mut command = tokio::process::Command::new(BIN);
        command
            .args(["get", "any/key", "--json", "--server", &address])
            .env_remove("FUSEBOX_TOKEN");
        if let Some(t) = token {
            command.env("FUSEBOX_TOKEN", t);
        }
        command.output()
    };
    let output = get(Some(token)).await.expect("fusebox runs");
    assert!(
        output.status.success(),
        "the server with the compose config answers the admin token: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = get(None).await.expect("fusebox runs");
    assert!(
        !output.status.success()
            && String::from_utf8_lossy(&output.stderr).contains("UNAUTHENTICATED"),
        "without the token the server refuses: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Starts `fusebox ARGS` with `FUSEBOX_TOKEN` set to `token`, checks that
/// its first line is `listening on 127.0.0.1:PORT`, and returns the process
/// (killed when dropped) and that address.
async fn serve(args: &[String], token: &str) -> (tokio::process::Child, String) {
    let mut child = crate::process::spawn(
        tokio::process::Command::new(BIN)
            .args(args)
            .env("FUSEBOX_TOKEN", token)
            .stderr(Stdio::piped()),
        "fusebox starts",
    );
    let (addr, _) = crate::process::addresses(&mut child, Duration::from_secs(30)).await;
    let parsed: SocketAddr = addr
        .parse()
        .unwrap_or_else(|e| panic!("`listening on {addr}` names an address ({e})"));
    assert!(
        parsed.ip().is_loopback() && parsed.port() != 0,
        "`fusebox {}` listens on {addr}",
        args.join(" ")
    );
    (child, addr)
}

/// One instruction of a Dockerfile: its keyword (upper case) and the rest,
/// with line continuations joined.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    rest: String,
}

/// The stages of the Dockerfile, each a list of instructions starting at its `FROM`.
fn dockerfile_stages() -> Vec<Vec<Instruction>> {
    let text = std::fs::read_to_string(root().join("Dockerfile"))
        .expect("a Dockerfile at the repository root");
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    assert!(
        current.is_empty(),
        "the Dockerfile ends inside a continued line"
    );
    let mut stages: Vec<Vec<Instruction>> = Vec::new();
    for line in logical {
        let (keyword, rest) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let instruction = Instruction {
            keyword: keyword.to_ascii_uppercase(),
            rest: rest.trim().to_owned(),
        };
        if instruction.keyword == "FROM" {
            stages.push(Vec::new());
        }
        stages
            .last_mut()
            .expect("the Dockerfile starts with FROM")
            .push(instruction);
    }
    stages
}

/// The instructions of `stage` with `keyword`.
fn all<'a>(stage: &'a [Instruction], keyword: &str) -> Vec<&'a str> {
    stage
        .iter()
        .filter(|i| i.keyword == keyword)
        .map(|i| i.rest.as_str())
        .collect()
}

/// The one instruction of `stage` with `keyword`.
fn one<'a>(stage: &'a [Instruction], keyword: &str) -> &'a str {
    match all(stage, keyword).as_slice() {
        [only] => only,
        other => panic!("the stage has one {keyword}, not {other:?}"),
    }
}

/// An exec-form (JSON array) instruction such as `CMD ["serve"]`.
fn exec_form(keyword: &str, rest: &str) -> Vec<String> {
    serde_json::from_str(rest)
        .unwrap_or_else(|e| panic!("{keyword} is in exec form, a JSON array ({e}): {rest}"))
}

/// The sources of a `COPY` without `--from`: every word but the flags and the last.
fn copy_sources(rest: &str) -> Vec<String> {
    let words: Vec<&str> = rest
        .split_whitespace()
        .filter(|w| !w.starts_with("--"))
        .collect();
    assert!(words.len() >= 2, "COPY SOURCE... DEST: {rest}");
    words[..words.len() - 1]
        .iter()
        .map(|w| w.trim_start_matches("./").trim_end_matches('/').to_owned())
        .collect()
}

#[test]
fn the_dockerfile_builds_this_crate_and_runs_it_unprivileged() {
    let stages = dockerfile_stages();
    assert_eq!(stages.len(), 2, "a builder stage and a runtime stage");
    let (builder, runtime) = (&stages[0], &stages[1]);

    // The builder: the Rust image, building exactly what Cargo.lock pins.
    let from = one(builder, "FROM");
    assert!(
        from.starts_with("rust:1-bookworm ") && from.ends_with(" AS builder"),
        "FROM rust:1-bookworm AS builder, not {from:?}"
    );
    let run = all(builder, "RUN").join(" && ");
    assert!(run.contains("cargo build --release --locked"), "{run}");
    assert!(
        run.contains("/usr/local/bin/fusebox"),
        "the builder puts the binary at /usr/local/bin/fusebox: {run}"
    );

    // Everything it copies exists, and the build needs nothing else.
    let ignored: Vec<String> = std::fs::read_to_string(root().join(".dockerignore"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_start_matches("./").trim_end_matches('/').to_owned())
        .collect();
    let mut copied = BTreeSet::new();
    for rest in all(builder, "COPY") {
        for source in copy_sources(rest) {
            assert!(
                root().join(&source).exists(),
                "the Dockerfile copies {source}, which exists in the repository"
            );
            assert!(
                !ignored.contains(&source),
                "the Dockerfile copies {source}, which .dockerignore leaves out"
            );
            copied.insert(source);
        }
    }
    for needed in ["Cargo.toml", "Cargo.lock", "src", "proto"] {
        assert!(
            copied.contains(needed),
            "the builder copies {needed}: {copied:?}"
        );
    }
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    if manifest.contains("[[bench]]") {
        assert!(
            copied.contains("benches"),
            "Cargo.toml names a bench target, so the build needs benches/"
        );
    }

    // The runtime: slim Debian, the binary alone, not root.
    assert_eq!(one(runtime, "FROM"), "debian:bookworm-slim");
    let copies = all(runtime, "COPY");
    assert_eq!(
        copies.first().copied(),
        Some("--from=builder /usr/local/bin/fusebox /usr/local/bin/fusebox")
    );
    // Besides the binary, only the config its CMD serves.
    let configs: Vec<(String, String)> = copies[1..]
        .iter()
        .map(|rest| {
            let sources = copy_sources(rest);
            assert_eq!(sources.len(), 1, "one file per COPY: {rest}");
            assert!(
                root().join(&sources[0]).is_file(),
                "{rest}: the file exists"
            );
            let dest = rest.split_whitespace().last().expect("a destination");
            (sources[0].clone(), dest.to_owned())
        })
        .collect();
    let user = one(runtime, "USER");
    let name = user.split(':').next().expect("a user");
    assert!(
        !name.is_empty() && name != "root" && name != "0",
        "the server runs as an unprivileged user, not {user:?}"
    );

    // Its command agrees with the CLI, with EXPOSE and with the compose file.
    assert_eq!(
        exec_form("ENTRYPOINT", one(runtime, "ENTRYPOINT")),
        vec!["fusebox"]
    );
    let cmd = exec_form("CMD", one(runtime, "CMD"));
    let flags = serve_command("the Dockerfile's CMD", &cmd);
    let addr = listen("the Dockerfile's CMD", &flags, "--listen");
    let http = listen("the Dockerfile's CMD", &flags, "--http").port();
    let config = flag(&flags, "--config").expect("the CMD passes --config");
    assert!(
        configs.iter().any(|(_, dest)| dest == config),
        "the CMD's --config {config} is a file the image copies: {configs:?}"
    );
    let exposed: Vec<u16> = one(runtime, "EXPOSE")
        .split_whitespace()
        .map(|p| {
            p.trim_end_matches("/tcp")
                .parse()
                .expect("EXPOSE names ports")
        })
        .collect();
    assert_eq!(
        exposed,
        vec![addr.port(), http],
        "EXPOSE is the CMD's --listen and --http ports"
    );
    let (name, service) = service();
    let published: Vec<u16> = service.ports.iter().map(Port::container).collect();
    assert_eq!(
        published, exposed,
        "docker-compose.yml service {name:?} publishes the ports the Dockerfile exposes"
    );
    // The image's config and the one compose mounts are the same file.
    let mounted: Vec<String> = service.volumes.iter().map(|v| v.parts().0).collect();
    assert!(
        configs
            .iter()
            .any(|(source, _)| mounted.iter().any(|m| m.trim_start_matches("./") == source)),
        "compose mounts the config the image copies: {configs:?} vs {mounted:?}"
    );
}
