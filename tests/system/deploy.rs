//! The deployment files against the Rust code they deploy.
//!
//! * The service template: `scripts/new-service` renders `deploy/template/` into a copy of
//!   the workspace, and the generated crate must build and pass its own tests.
//! * Config consistency: every `APP_*` variable that `docker-compose.yml` or the rendered
//!   k8s overlays set for a service is a key of that service's real `Settings` type (env
//!   names are derived from `Settings::default()` serialized to JSON), the ports are the
//!   `Settings` defaults, image names agree, `deploy/config-keys.txt` lists exactly the
//!   names in use, and the values load through `sagaworks_config::load_from`. The services
//!   and their ports come from `services.toml`.
//!
//! Needs `kubectl` (for `kubectl kustomize`); a missing tool fails the tests, it never
//! skips them.

use serde::de::DeserializeOwned;
use serde::{Deserialize as _, Serialize};
use serde_json::Value as Json;
use serde_norway::Value as Yaml;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};
use system_tests::services::{Kind, ServiceEntry, ServicesToml};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

fn output_text(out: &Output) -> String {
    format!(
        "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// --- the services and their Settings ---------------------------------------------------

/// One service as the Rust code defines it.
struct Service {
    name: String,
    /// `Settings::default()` as JSON.
    defaults: Json,
    /// `sagaworks_config::load_from::<Settings>(None)` as JSON, with the current env.
    load: fn() -> Result<Json, String>,
    /// services.toml (docs/design.md, "Services, ports, config", for people).
    design_http: u16,
    design_grpc: Option<u16>,
}

fn load<S: Serialize + DeserializeOwned + Default>() -> Result<Json, String> {
    let settings = sagaworks_config::load_from::<S>(None).map_err(|e| e.to_string())?;
    serde_json::to_value(settings).map_err(|e| e.to_string())
}

/// The gateway's [`load`]: `auth.jwt_secret` serializes as `[REDACTED]`, so its loaded
/// value is put back for the comparison with the deploy files.
fn load_gateway() -> Result<Json, String> {
    use secrecy::ExposeSecret;
    let settings =
        sagaworks_config::load_from::<gateway::config::Settings>(None).map_err(|e| e.to_string())?;
    let mut json = serde_json::to_value(&settings).map_err(|e| e.to_string())?;
    if let Some(secret) = &settings.auth.jwt_secret {
        json["auth"]["jwt_secret"] = secret.expose_secret().into();
    }
    Ok(json)
}

impl Service {
    fn of<S: Serialize + DeserializeOwned + Default>(name: &str, http: u16, grpc: Option<u16>) -> Self {
        let defaults = serde_json::to_value(S::default()).expect("Settings serialize to JSON");
        Self { name: name.to_string(), defaults, load: load::<S>, design_http: http, design_grpc: grpc }
    }

    fn default_port(&self, section: &str) -> Option<u16> {
        self.defaults.get(section)?.get("port")?.as_u64().and_then(|p| u16::try_from(p).ok())
    }

    /// The env names this service's Settings accept.
    fn keys(&self) -> EnvKeys {
        let mut keys = EnvKeys::default();
        keys.collect(&mut Vec::new(), &self.defaults);
        keys
    }
}

/// The services of services.toml, each with its Settings type (the one thing the file
/// cannot say).
fn services() -> Vec<Service> {
    let of = |entry: &ServiceEntry| {
        let (name, http, grpc) = (entry.name.as_str(), entry.http_port, entry.grpc_port);
        match name {
            "gateway" => {
                Service { load: load_gateway, ..Service::of::<gateway::config::Settings>(name, http, grpc) }
            }
            "order" => Service::of::<order::config::Settings>(name, http, grpc),
            "inventory" => Service::of::<inventory::config::Settings>(name, http, grpc),
            "payment" => Service::of::<payment::config::Settings>(name, http, grpc),
            other => {
                panic!("services.toml names {other}: add its Settings to tests/system/deploy.rs's services()")
            }
        }
    };
    ServicesToml::workspace().services.iter().map(of).collect()
}

/// Env names accepted by a Settings type: `APP_` + the key path upper-cased, joined by
/// `__`. An empty object in the defaults is a map (`routes`, `properties`): any sub-key.
#[derive(Default)]
struct EnvKeys {
    exact: BTreeSet<String>,
    map_prefixes: BTreeSet<String>,
}

fn env_name(path: &[String]) -> String {
    format!("APP_{}", path.join("__").to_uppercase())
}

impl EnvKeys {
    fn collect(&mut self, path: &mut Vec<String>, value: &Json) {
        match value {
            Json::Object(fields) if fields.is_empty() && !path.is_empty() => {
                self.map_prefixes.insert(format!("{}__", env_name(path)));
            }
            Json::Object(fields) => {
                for (key, value) in fields {
                    path.push(key.clone());
                    self.collect(path, value);
                    path.pop();
                }
            }
            _ => {
                self.exact.insert(env_name(path));
            }
        }
    }

    fn accepts(&self, name: &str) -> bool {
        self.exact.contains(name)
            || self.map_prefixes.iter().any(|p| name.len() > p.len() && name.starts_with(p.as_str()))
    }
}

// --- what the deploy files set -----------------------------------------------------------

/// One service as a deployment file runs it.
#[derive(Debug)]
struct Deployed {
    /// `compose`, `k8s/dev`, `k8s/prod`.
    origin: String,
    service: String,
    /// Env of the container; `None` = the value comes from a Secret.
    env: BTreeMap<String, Option<String>>,
    /// Image without the tag, e.g. `sagaworks/order`.
    image_repo: String,
    /// Ports the platform sends traffic to: (what, port).
    ports: Vec<(String, u16)>,
}

impl Deployed {
    fn where_(&self) -> String {
        format!("{}/{}", self.origin, self.service)
    }

    fn app_env(&self) -> impl Iterator<Item = (&String, &Option<String>)> {
        self.env.iter().filter(|(k, _)| k.starts_with("APP_"))
    }
}

fn image_repo(image: &str) -> String {
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo.to_string(),
        _ => image.to_string(),
    }
}

fn scalar(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Compose interpolation with the environment of a fresh checkout: `${VAR:-default}` and
/// `${VAR-default}` give the default, `$$` is a literal `$`. A variable without a default
/// is an error (the file would depend on the caller's environment).
fn interpolate(text: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body.find('}').ok_or_else(|| format!("unclosed ${{ in {text:?}"))?;
            let expr = &body[..end];
            let default = expr
                .split_once(":-")
                .or_else(|| expr.split_once('-'))
                .map(|(_, d)| d)
                .ok_or_else(|| format!("${{{expr}}} has no default in {text:?}"))?;
            out.push_str(default);
            rest = &body[end + 1..];
        } else {
            return Err(format!("bare $ in {text:?}"));
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn compose() -> Yaml {
    let text =
        std::fs::read_to_string(workspace_root().join("docker-compose.yml")).expect("docker-compose.yml");
    let mut doc: Yaml = serde_norway::from_str(&text).expect("docker-compose.yml is YAML");
    // One pass resolves one level: a merged anchor may carry a `<<` of its own.
    loop {
        let before = doc.clone();
        doc.apply_merge().expect("compose merge keys (<<) resolve");
        if doc == before {
            return doc;
        }
    }
}

fn compose_deployments(names: &[&str]) -> Vec<Deployed> {
    let doc = compose();
    names
        .iter()
        .map(|&name| {
            let spec = &doc["services"][name];
            assert!(spec.is_mapping(), "compose has no service {name}");
            let env = spec["environment"]
                .as_mapping()
                .unwrap_or_else(|| panic!("compose/{name}: environment must be a mapping"))
                .iter()
                .map(|(k, v)| {
                    let key = scalar(k).expect("env name");
                    let value = scalar(v).unwrap_or_else(|| panic!("compose/{name}: {key} is not a scalar"));
                    let value = interpolate(&value).unwrap_or_else(|e| panic!("compose/{name}: {key}: {e}"));
                    (key, Some(value))
                })
                .collect();
            let image = interpolate(spec["image"].as_str().unwrap_or_default()).expect("image interpolates");
            let mut ports = Vec::new();
            for p in spec["ports"].as_sequence().into_iter().flatten() {
                let text = scalar(p).expect("short port syntax");
                let target =
                    text.split('/').next().and_then(|t| t.rsplit(':').next()).and_then(|t| t.parse().ok());
                ports.push(("published".to_string(), target.expect("container port")));
            }
            if let Some(test) = spec["healthcheck"]["test"].as_sequence() {
                let test: Vec<String> = test.iter().filter_map(scalar).collect();
                if let ["CMD", "http-probe", port, _] =
                    test.iter().map(String::as_str).collect::<Vec<_>>()[..]
                {
                    ports.push(("healthcheck".to_string(), port.parse().expect("healthcheck port")));
                }
            }
            Deployed {
                origin: "compose".into(),
                service: name.into(),
                env,
                image_repo: image_repo(&image),
                ports,
            }
        })
        .collect()
}

fn kustomize(overlay: &str) -> Vec<Yaml> {
    let dir = workspace_root().join("k8s/overlays").join(overlay);
    let out =
        Command::new("kubectl").arg("kustomize").arg(&dir).output().unwrap_or_else(|e| {
            panic!("kubectl is needed to render the k8s overlays (kubectl kustomize): {e}")
        });
    assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), output_text(&out));
    let text = String::from_utf8(out.stdout).expect("UTF-8 manifests");
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Yaml::deserialize(doc).expect("rendered manifest is YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

fn k8s_deployments(overlay: &str, names: &[&str]) -> Vec<Deployed> {
    let docs = kustomize(overlay);
    let of_kind = |kind: &str| -> BTreeMap<String, &Yaml> {
        docs.iter()
            .filter(|d| d["kind"].as_str() == Some(kind))
            .map(|d| (d["metadata"]["name"].as_str().expect("metadata.name").to_string(), d))
            .collect()
    };
    let (deployments, configmaps, k8s_services) =
        (of_kind("Deployment"), of_kind("ConfigMap"), of_kind("Service"));
    let origin = format!("k8s/{overlay}");
    names
        .iter()
        .map(|&name| {
            let deployment =
                deployments.get(name).unwrap_or_else(|| panic!("{origin}: no Deployment {name}"));
            let containers =
                deployment["spec"]["template"]["spec"]["containers"].as_sequence().expect("containers");
            assert_eq!(containers.len(), 1, "{origin}/{name}: one container");
            let container = &containers[0];
            let mut env = BTreeMap::new();
            for source in container["envFrom"].as_sequence().into_iter().flatten() {
                let cm = source["configMapRef"]["name"].as_str().expect("envFrom is a configMapRef");
                let data = configmaps
                    .get(cm)
                    .unwrap_or_else(|| panic!("{origin}/{name}: ConfigMap {cm} not rendered"));
                for (k, v) in data["data"].as_mapping().into_iter().flatten() {
                    env.insert(scalar(k).expect("key"), Some(scalar(v).expect("ConfigMap value")));
                }
            }
            for item in container["env"].as_sequence().into_iter().flatten() {
                let key = item["name"].as_str().expect("env name").to_string();
                let value = if item["valueFrom"]["secretKeyRef"].is_mapping() {
                    None
                } else {
                    Some(
                        scalar(&item["value"])
                            .unwrap_or_else(|| panic!("{origin}/{name}: {key} has no literal value")),
                    )
                };
                env.insert(key, value);
            }
            let mut ports = Vec::new();
            for p in container["ports"].as_sequence().into_iter().flatten() {
                let port_name = p["name"].as_str().expect("named container port");
                let port = p["containerPort"].as_u64().expect("containerPort") as u16;
                ports.push((format!("containerPort {port_name}"), port));
            }
            let svc = k8s_services.get(name).unwrap_or_else(|| panic!("{origin}: no Service {name}"));
            for p in svc["spec"]["ports"].as_sequence().into_iter().flatten() {
                let port_name = p["name"].as_str().expect("named Service port");
                ports.push((format!("Service port {port_name}"), p["port"].as_u64().expect("port") as u16));
            }
            let image = container["image"].as_str().expect("image");
            Deployed {
                origin: origin.clone(),
                service: name.into(),
                env,
                image_repo: image_repo(image),
                ports,
            }
        })
        .collect()
}

const OVERLAYS: &[&str] = &["dev", "prod"];

fn all_deployments(names: &[&str]) -> Vec<Deployed> {
    let mut all = compose_deployments(names);
    for overlay in OVERLAYS {
        all.extend(k8s_deployments(overlay, names));
    }
    all
}

fn service_names(services: &[Service]) -> Vec<&str> {
    services.iter().map(|s| s.name.as_str()).collect()
}

// --- config consistency ------------------------------------------------------------------

#[test]
fn every_app_env_var_in_compose_and_k8s_is_a_key_of_that_services_settings() {
    let services = services();
    let deployed = all_deployments(&service_names(&services));
    let mut problems = Vec::new();
    for d in &deployed {
        let service = services.iter().find(|s| s.name == d.service).expect("known service");
        let keys = service.keys();
        for (name, _) in d.app_env() {
            if !keys.accepts(name) {
                problems.push(format!(
                    "{}: {name} is not a key of {}::config::Settings",
                    d.where_(),
                    service.name
                ));
            }
        }
    }
    assert!(problems.is_empty(), "unknown settings:\n{}", problems.join("\n"));
}

/// The Kafka ACLs name each service's consumer groups literally (services.toml's
/// `groups`), so the group a service joins by default must be one of them, and the
/// dead-letter host's reader group too.
#[test]
fn each_services_consumer_groups_are_those_its_kafka_acls_name() {
    let file = ServicesToml::workspace();
    for service in services() {
        let entry = file.services.iter().find(|e| e.name == service.name).expect("listed");
        let mut used: Vec<&str> =
            service.defaults.pointer("/consumer/group_id").and_then(Json::as_str).into_iter().collect();
        if entry.operates_dead_letters {
            used.push(sagaworks_outbox::dead_letter::READER_GROUP);
        }
        for group in used {
            assert!(
                entry.groups.iter().any(|g| g == group),
                "{}: group {group:?} is not in services.toml's groups {:?}",
                service.name,
                entry.groups
            );
        }
    }
}

#[test]
fn compose_and_k8s_ports_are_the_settings_default_ports() {
    let services = services();
    let deployed = all_deployments(&service_names(&services));
    let mut problems = Vec::new();
    for service in &services {
        let http = service.default_port("http");
        let grpc = service.default_port("grpc");
        assert_eq!(http, Some(service.design_http), "{}: default http.port is the design's", service.name);
        assert_eq!(grpc, service.design_grpc, "{}: default grpc.port is the design's", service.name);
        for d in deployed.iter().filter(|d| d.service == service.name) {
            let mut expect = |what: &str, actual: Option<u16>, want: Option<u16>| {
                if actual != want {
                    problems
                        .push(format!("{}: {what} is {actual:?}, Settings default is {want:?}", d.where_()));
                }
            };
            let env_port = |name: &str| d.env.get(name).cloned().flatten().and_then(|v| v.parse().ok());
            expect("APP_HTTP__PORT", env_port("APP_HTTP__PORT"), http);
            expect("APP_GRPC__PORT", env_port("APP_GRPC__PORT"), grpc);
            for (what, port) in &d.ports {
                let want = if what.ends_with("grpc") { grpc } else { http };
                expect(what, Some(*port), want);
            }
        }
    }
    assert!(problems.is_empty(), "ports disagree:\n{}", problems.join("\n"));
}

#[test]
fn image_names_match_across_compose_and_k8s() {
    let services = services();
    let deployed = all_deployments(&service_names(&services));
    for service in &services {
        let repos: BTreeMap<String, &str> = deployed
            .iter()
            .filter(|d| d.service == service.name)
            .map(|d| (d.origin.clone(), d.image_repo.as_str()))
            .collect();
        assert_eq!(
            repos.len(),
            1 + OVERLAYS.len(),
            "{}: deployed by compose and every overlay",
            service.name
        );
        let want = format!("sagaworks/{}", service.name);
        assert!(repos.values().all(|r| *r == want), "{}: image repositories differ: {repos:?}", service.name);
    }
}

/// `deploy/config-keys.txt` as {env name: services}; `@all` and `@backends` stand for
/// every service of services.toml and those of kind backend.
fn config_keys() -> BTreeMap<String, BTreeSet<String>> {
    let path = workspace_root().join("deploy/config-keys.txt");
    let text = std::fs::read_to_string(&path).expect("deploy/config-keys.txt");
    let listed = ServicesToml::workspace();
    let group = |word: &str| -> Vec<String> {
        let of_kind = |kind: Option<Kind>| {
            listed
                .services
                .iter()
                .filter(|s| kind.is_none_or(|k| s.kind == k))
                .map(|s| s.name.clone())
                .collect()
        };
        match word {
            "@all" => of_kind(None),
            "@backends" => of_kind(Some(Kind::Backend)),
            name => vec![name.to_string()],
        }
    };
    let mut keys = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let mut words = line.split_whitespace();
        let Some(name) = words.next() else { continue };
        let readers: BTreeSet<String> = words.flat_map(group).collect();
        assert!(!readers.is_empty(), "{}:{}: {name} names no service", path.display(), number + 1);
        assert!(
            keys.insert(name.to_string(), readers).is_none(),
            "{}:{}: {name} twice",
            path.display(),
            number + 1
        );
    }
    keys
}

#[test]
fn config_keys_txt_lists_exactly_the_env_names_the_deploy_files_set() {
    let services = services();
    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for d in all_deployments(&service_names(&services)) {
        for (name, _) in d.app_env() {
            used.entry(name.clone()).or_default().insert(d.service.clone());
        }
    }
    let listed = config_keys();
    let only_listed: Vec<_> = listed.keys().filter(|k| !used.contains_key(*k)).collect();
    let only_used: Vec<_> = used.keys().filter(|k| !listed.contains_key(*k)).collect();
    assert!(only_listed.is_empty(), "config-keys.txt lists names no deploy file sets: {only_listed:?}");
    assert!(only_used.is_empty(), "deploy files set names config-keys.txt does not list: {only_used:?}");
    for (name, readers) in &listed {
        assert_eq!(
            readers, &used[name],
            "config-keys.txt: services of {name} vs the deploy files that set it"
        );
    }
}

// --- the deploy values load into the real Settings ----------------------------------------

/// The value at a key path, as the env would spell it (`8082`, `true`, `http://...`).
fn value_at<'a>(settings: &'a Json, name: &str) -> Option<&'a Json> {
    name.strip_prefix("APP_")?.split("__").try_fold(settings, |v, key| v.get(key.to_lowercase()))
}

fn env_text(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        // A list setting given as a comma-separated string (rate_limit.trusted_proxies).
        Json::Array(items) if items.iter().all(Json::is_string) => {
            items.iter().filter_map(Json::as_str).collect::<Vec<_>>().join(",")
        }
        other => other.to_string(),
    }
}

/// Loads the service's Settings with exactly the env of each of its deployments and
/// checks every variable landed in its key with its value.
fn deploy_env_loads_into_settings(name: &str) {
    let services = services();
    let service = services.iter().find(|s| s.name == name).expect("known service");
    for d in all_deployments(&[name]) {
        for (key, _) in std::env::vars() {
            if key.starts_with("APP_") {
                // SAFETY: nextest runs each test in its own process; this one has no other threads.
                unsafe { std::env::remove_var(key) };
            }
        }
        let literal: Vec<(&String, &String)> =
            d.app_env().filter_map(|(k, v)| v.as_ref().map(|v| (k, v))).collect();
        for (key, value) in &literal {
            // SAFETY: as above.
            unsafe { std::env::set_var(key, value) };
        }
        let loaded = (service.load)().unwrap_or_else(|e| panic!("{}: settings do not load: {e}", d.where_()));
        for (key, value) in literal {
            let got = value_at(&loaded, key).map(env_text);
            assert_eq!(
                got.as_deref(),
                Some(value.as_str()),
                "{}: {key} did not load into its key",
                d.where_()
            );
        }
    }
}

/// Every service of services.toml, in turn (one process: each load starts from no APP_*
/// variable).
#[test]
fn compose_and_k8s_env_of_every_service_loads_into_its_settings() {
    let names: Vec<String> = services().into_iter().map(|s| s.name).collect();
    assert!(names.len() >= 4, "services.toml's services: {names:?}");
    for name in &names {
        deploy_env_loads_into_settings(name);
    }
}

#[test]
fn env_key_derivation_follows_the_config_loader() {
    let keys = services().into_iter().find(|s| s.name == "order").expect("order").keys();
    for name in [
        "APP_DATABASE__URL",
        "APP_INVENTORY__RETRY__MAX_ATTEMPTS",
        "APP_OUTBOX__ENABLED",
        "APP_SAGA__LEASE_MS",
    ] {
        assert!(keys.accepts(name), "{name}");
    }
    assert!(keys.accepts("APP_KAFKA__PROPERTIES__SECURITY.PROTOCOL"), "maps take any sub-key");
    assert!(keys.accepts("APP_PAYMENT__ROUTES__CHARGE"), "maps take any sub-key");
    for name in ["APP_OUTBOX__RELAY_ENABLED", "APP_DATABASE", "APP_KAFKA__PROPERTIES__", "APP_NOPE"] {
        assert!(!keys.accepts(name), "{name}");
    }
    assert_eq!(interpolate("a${X:-b}c$${Y}").as_deref(), Ok("abc${Y}"));
    assert!(interpolate("${NO_DEFAULT}").is_err());
}

// --- the service template -------------------------------------------------------------------

/// Copies `from` into `to` (not `target/`, `.git/`, `.dev/`), keeping modification times
/// so cargo's fingerprints of an unchanged copy stay fresh between runs.
fn copy_workspace(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        if [".git", ".dev", "target"].iter().any(|skip| name == *skip) {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_workspace(&src, &dst)?;
        } else if kind.is_file() {
            match std::fs::copy(&src, &dst) {
                // Others work in this tree: a file may go away while it is copied.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                result => result?,
            };
            let modified =
                std::fs::metadata(&src).and_then(|m| m.modified()).unwrap_or_else(|_| SystemTime::now());
            std::fs::File::options().write(true).open(&dst)?.set_modified(modified)?;
        }
    }
    Ok(())
}

/// A directory lock: one run of the template test per target directory at a time.
struct DirLock(PathBuf);

impl DirLock {
    fn acquire(path: PathBuf) -> Self {
        let stale = Duration::from_secs(20 * 60);
        loop {
            match std::fs::create_dir(&path) {
                Ok(()) => return Self(path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let age = std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| SystemTime::now().duration_since(t).ok());
                    if age.is_some_and(|a| a > stale) {
                        let _ = std::fs::remove_dir(&path);
                    } else {
                        std::thread::sleep(Duration::from_millis(500));
                    }
                }
                Err(e) => panic!("cannot create lock {}: {e}", path.display()),
            }
        }
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Runs `command` to completion (killing it after `deadline`) and asserts it succeeded.
fn run(what: &str, command: &mut Command, scratch: &Path, deadline: Duration) {
    // The nested cargo/nextest must not think it runs inside this test.
    for (key, _) in std::env::vars() {
        if key.starts_with("NEXTEST") || key.starts_with("__NEXTEST") || key == "RUST_TEST_THREADS" {
            command.env_remove(key);
        }
    }
    let log = scratch.join("command.log");
    let file = std::fs::File::create(&log).expect("command log");
    command.stdout(file.try_clone().expect("log handle")).stderr(file);
    let started = std::time::Instant::now();
    let mut child = command.spawn().unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the command") {
            break Some(status);
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("{what}: {:?}", started.elapsed());
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    match status {
        Some(status) if status.success() => {}
        Some(status) => panic!("{what} failed ({status}):\n{output}"),
        None => panic!("{what} did not finish within {deadline:?}:\n{output}"),
    }
}

#[test]
fn new_service_template_generates_a_crate_that_builds_and_passes_its_test() {
    let root = workspace_root();
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    // A fixed place under the target directory: the copied workspace crates keep their
    // paths, hence their cargo hashes, so reruns reuse them instead of piling up copies.
    let scratch = target.join("new-service-check");
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    let _lock = DirLock::acquire(scratch.join("lock"));
    let copy = scratch.join("workspace");
    if copy.exists() {
        std::fs::remove_dir_all(&copy).expect("remove the previous copy");
    }
    copy_workspace(&root, &copy).unwrap_or_else(|e| panic!("copy the workspace to {}: {e}", copy.display()));

    let name = "sample";
    let minute = Duration::from_secs(60);
    run("scripts/new-service", Command::new(copy.join("scripts/new-service")).arg(name), &scratch, minute);
    let manifest = std::fs::read_to_string(copy.join("Cargo.toml")).expect("Cargo.toml");
    assert!(manifest.contains(&format!("\"services/{name}\"")), "added to the workspace members");
    // Added to services.toml, after what was there, so the scripts and deploy checks know it.
    let (before, after) = (ServicesToml::workspace(), ServicesToml::read(&copy));
    assert_eq!(
        after.services[..before.services.len()],
        before.services[..],
        "services.toml keeps its services"
    );
    let entry = after.get(name).unwrap_or_else(|| panic!("services.toml of the copy names {name}"));
    assert_eq!(after.services.len(), before.services.len() + 1, "one service added");
    assert_eq!(entry.kind, Kind::Backend);
    let database = entry.database.as_ref().expect("the new service owns a database");
    assert_eq!((database.suffix.as_str(), database.role.as_str()), (name, format!("{name}_svc").as_str()));
    let config =
        std::fs::read_to_string(copy.join("services").join(name).join("src/config.rs")).expect("config.rs");
    for port in [Some(entry.http_port), entry.grpc_port] {
        let port = port.expect("HTTP and gRPC ports");
        assert!(
            config.contains(&format!("\"127.0.0.1\", {port})")),
            "services.toml's port {port} is the Settings default"
        );
    }
    let mut dirs: Vec<String> = std::fs::read_dir(copy.join("services"))
        .expect("services/")
        .filter_map(|e| {
            e.ok().filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().into_owned())
        })
        .collect();
    let mut listed: Vec<String> = after.services.iter().map(|s| s.name.clone()).collect();
    dirs.sort();
    listed.sort();
    assert_eq!(dirs, listed, "services.toml of the copy names exactly its services/ directories");
    assert!(copy.join("migrations").join(name).is_dir(), "migrations/{name} created");
    // Its CI pipeline (deploy/consistency.py checks its content; deploy/test_deploy.py the rendering).
    let workflow = std::fs::read_to_string(copy.join(".github/workflows").join(format!("{name}.yml")))
        .unwrap_or_else(|e| panic!(".github/workflows/{name}.yml of the copy: {e}"));
    assert!(workflow.contains(&format!("service: \"{name}\"")), "the workflow runs the pipeline of {name}");

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let cargo_in_copy = |args: &[&str]| {
        let mut c = Command::new(&cargo);
        c.args(args).current_dir(&copy).env("CARGO_TARGET_DIR", &target).env("CARGO_TERM_COLOR", "never");
        c
    };
    // Generous: the target directory is shared, so these may first wait for other builds.
    run("cargo build", &mut cargo_in_copy(&["build", "-p", name]), &scratch, 15 * minute);
    let nextest = ["nextest", "run", "-p", name, "--no-fail-fast", "--no-tests=fail"];
    run("cargo nextest run", &mut cargo_in_copy(&nextest), &scratch, 15 * minute);
    std::fs::remove_dir_all(&copy).expect("remove the copy");
}
