//! What can be checked of `deploy/` without a container engine or a cluster: the compose file
//! resolves, every Kubernetes manifest parses with the fields the API server requires, the
//! probes and grace periods are there, and the KEDA scaler watches the jobs queue the topology
//! declares, counting unacknowledged messages.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml_ng::Value;
use skilleval_infra::config::Settings;
use skilleval_infra::topology::{Lane, Topology};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

use serde::Deserialize as _;

/// Runs a command; `None` when the program is not installed.
fn run(program: &str, args: &[&str]) -> Option<std::process::Output> {
    match Command::new(program).args(args).output() {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("running {program}: {e}"),
    }
}

/// `docker compose ... config --quiet` (or the standalone v1 tool) on `files`, merged in
/// order: `true` when one validated them, `false` when neither is installed; panics when one
/// rejects them.
fn compose_config(files: &[&Path]) -> bool {
    let mut file_args = Vec::new();
    for file in files {
        file_args.push("-f");
        file_args.push(file.to_str().unwrap());
    }
    let plugin: Vec<&str> = ["compose"]
        .into_iter()
        .chain(file_args.iter().copied())
        .chain(["config", "--quiet"])
        .collect();
    let standalone: Vec<&str> = file_args
        .iter()
        .copied()
        .chain(["config", "--quiet"])
        .collect();
    // The compose plugin, then the standalone v1 tool; both validate without an engine.
    for (program, args) in [("docker", plugin), ("docker-compose", standalone)] {
        match run(program, &args) {
            Some(out) if out.status.success() => return true,
            Some(out) => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                if stderr.contains("unknown command")
                    || stderr.contains("is not a docker command")
                    || stderr.contains("unknown shorthand flag")
                {
                    eprintln!(
                        "{program}: no compose support here ({}); trying the next tool",
                        stderr.trim()
                    );
                    continue;
                }
                panic!("{program} rejects {files:?}: {stderr}");
            }
            None => eprintln!("{program} is not installed"),
        }
    }
    false
}

#[test]
fn compose_file_resolves() {
    let file = deploy_dir().join("docker/compose.yaml");
    if !compose_config(&[&file]) {
        eprintln!("compose_file_resolves: no `docker compose` or `docker-compose` here: falling back to a YAML check");
    }
    // Either way, check the structure this deployment relies on.
    let doc = yaml_docs(&file).remove(0);
    let services = doc["services"].as_mapping().expect("services");
    for name in ["postgres", "rabbitmq", "migrate", "coordinator", "worker"] {
        assert!(services.contains_key(name), "service {name} missing");
    }
    assert!(
        doc["services"]["worker"]["deploy"]["replicas"]
            .as_u64()
            .unwrap_or(0)
            >= 2
    );
    for name in ["postgres", "rabbitmq", "coordinator", "worker"] {
        assert!(
            doc["services"][name]["healthcheck"]["test"].is_sequence(),
            "{name} has no healthcheck"
        );
    }
    assert_eq!(
        doc["services"]["coordinator"]["depends_on"]["migrate"]["condition"].as_str(),
        Some("service_completed_successfully")
    );
    for dockerfile in ["coordinator.Dockerfile", "worker.Dockerfile"] {
        let text = std::fs::read_to_string(deploy_dir().join("docker").join(dockerfile)).unwrap();
        assert!(
            text.matches("FROM ").count() >= 2,
            "{dockerfile} is not multi-stage"
        );
    }
    let worker = std::fs::read_to_string(deploy_dir().join("docker/worker.Dockerfile")).unwrap();
    for package in ["bubblewrap", "python3", "nodejs"] {
        assert!(worker.contains(package), "the worker image lacks {package}");
    }
}

/// The three-node option: compose.cluster.yaml over compose.yaml resolves, adds two RabbitMQ
/// nodes clustered with the first, and gives every service of ours the three addresses, which
/// the configuration accepts, with every queue replicated.
#[test]
fn compose_cluster_option_resolves() {
    let base = deploy_dir().join("docker/compose.yaml");
    let cluster = deploy_dir().join("docker/compose.cluster.yaml");
    if !compose_config(&[&base, &cluster]) {
        eprintln!("compose_cluster_option_resolves: no `docker compose` or `docker-compose` here: falling back to a YAML check");
    }
    let mut doc = yaml_docs(&cluster).remove(0);
    doc.apply_merge().expect("the merge keys resolve");
    let services = doc["services"].as_mapping().expect("services");
    for name in ["rabbitmq", "rabbitmq-2", "rabbitmq-3"] {
        assert!(services.contains_key(name), "node {name} missing");
        assert!(
            doc["services"][name]["healthcheck"]["test"].is_sequence(),
            "{name} has no healthcheck"
        );
        assert_eq!(doc["services"][name]["hostname"].as_str(), Some(name));
    }
    let conf = doc["configs"]["rabbitmq-cluster-conf"]["content"]
        .as_str()
        .expect("the cluster's rabbitmq.conf");
    for name in ["rabbitmq", "rabbitmq-2", "rabbitmq-3"] {
        assert!(
            conf.contains(&format!("= rabbit@{name}\n")),
            "{name} is not a peer: {conf}"
        );
    }
    for name in ["migrate", "coordinator", "worker"] {
        let env = &doc["services"][name]["environment"];
        let url = env["AMQP_URL"].as_str().expect("AMQP_URL");
        let settings = Settings::load_from(&std::collections::HashMap::from([
            (
                "SKILLEVAL_CONFIG_DIR".to_string(),
                "/nonexistent".to_string(),
            ),
            ("AMQP_URL".to_string(), url.to_string()),
            (
                "SKILLEVAL__AMQP__REPLICATED_QUEUES".to_string(),
                env["SKILLEVAL__AMQP__REPLICATED_QUEUES"]
                    .as_str()
                    .expect("replicated queues")
                    .to_string(),
            ),
        ]))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(settings.amqp.connect_urls().len(), 3, "{name}: {url}");
        assert!(settings.amqp.replicated_queues, "{name}");
    }
}

fn manifests() -> Vec<(PathBuf, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir().join("k8s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for file in files {
        for doc in yaml_docs(&file) {
            out.push((file.clone(), doc));
        }
    }
    out
}

#[test]
fn kubernetes_manifests_have_the_required_fields_probes_and_grace() {
    let all = manifests();
    assert!(all.len() >= 9, "{} documents", all.len());
    for (file, doc) in &all {
        let kind = doc["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no kind", file.display()));
        assert!(
            doc["apiVersion"].is_string(),
            "{}: {kind} has no apiVersion",
            file.display()
        );
        if kind != "Kustomization" {
            assert!(
                doc["metadata"]["name"].is_string(),
                "{}: {kind} has no metadata.name",
                file.display()
            );
        }
    }
    let find = |kind: &str, name: &str| {
        all.iter()
            .find(|(_, d)| d["kind"] == kind && d["metadata"]["name"] == name)
            .map(|(_, d)| d.clone())
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    for name in ["skilleval-coordinator", "skilleval-worker"] {
        let d = find("Deployment", name);
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert!(
            c["livenessProbe"].is_mapping() && c["readinessProbe"].is_mapping(),
            "{name} probes"
        );
        assert!(c["envFrom"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|e| e["secretRef"]["name"] == "skilleval-secrets"));
    }
    find("Service", "skilleval-coordinator");
    find("ConfigMap", "skilleval-config");
    let job = find("Job", "skilleval-migrate");
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["args"][0],
        "migrate"
    );
    // Above the longest case timeout the worker allows, plus its shutdown grace.
    let worker = find("Deployment", "skilleval-worker");
    let grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    let settings = Settings::default();
    assert!(
        grace > 120 && grace > settings.worker.shutdown_grace_secs,
        "grace {grace}s"
    );

    if let Some(out) = run(
        "kubectl",
        &["kustomize", deploy_dir().join("k8s").to_str().unwrap()],
    ) {
        assert!(
            out.status.success(),
            "kubectl kustomize: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            rendered.matches("\nkind: ").count() + usize::from(rendered.starts_with("kind: ")),
            8
        );
    } else {
        eprintln!("kubectl is not installed: skipping the kustomize render");
    }
}

#[test]
fn keda_scales_workers_on_every_lane_counting_unacked_messages() {
    let all = manifests();
    let (_, scaled) = all
        .iter()
        .find(|(_, d)| d["kind"] == "ScaledObject")
        .expect("a KEDA ScaledObject");
    assert_eq!(scaled["spec"]["scaleTargetRef"]["name"], "skilleval-worker");
    let triggers = scaled["spec"]["triggers"]
        .as_sequence()
        .expect("a list of triggers");
    let topology = Topology::from_settings(&Settings::default());
    for lane in Lane::ALL {
        let queue = topology.queue(lane);
        let trigger = triggers
            .iter()
            .find(|t| t["metadata"]["queueName"].as_str() == Some(queue.as_str()))
            .unwrap_or_else(|| panic!("no KEDA trigger on {queue}, which workers consume"));
        assert_eq!(trigger["type"], "rabbitmq");
        assert_eq!(trigger["metadata"]["mode"], "QueueLength");
        // Only the management API (http) counts unacknowledged messages.
        assert_eq!(trigger["metadata"]["protocol"], "http");
        assert_ne!(trigger["metadata"]["excludeUnacknowledged"], "true");
        assert!(
            trigger["metadata"]["value"]
                .as_str()
                .and_then(|v| v.parse::<u32>().ok())
                .is_some_and(|v| v > 0),
            "{queue}: a positive target value"
        );
    }
}

/// The configuration files the images, compose file and manifests name exist, and the images
/// ship them where the binaries look (`config/` in the working directory).
#[test]
fn images_ship_the_config_files_their_environment_names() {
    let repo = deploy_dir().join("..");
    for dockerfile in ["coordinator.Dockerfile", "worker.Dockerfile"] {
        let text = std::fs::read_to_string(deploy_dir().join("docker").join(dockerfile)).unwrap();
        assert!(
            text.contains("COPY config /app/config") && text.contains("WORKDIR /app"),
            "{dockerfile} does not ship config/ into its working directory"
        );
        let env = text
            .split("SKILLEVAL_ENV=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("{dockerfile} sets no SKILLEVAL_ENV"));
        assert!(
            repo.join("config").join(format!("{env}.toml")).is_file(),
            "{dockerfile}: SKILLEVAL_ENV={env} but config/{env}.toml does not exist"
        );
    }
    assert!(repo.join("config/default.toml").is_file());
    let compose = yaml_docs(&deploy_dir().join("docker/compose.yaml"));
    let env = compose[0]["x-app-env"]["SKILLEVAL_ENV"].as_str().unwrap();
    assert!(repo.join("config").join(format!("{env}.toml")).is_file());
    for (file, doc) in manifests() {
        if let Some(env) = doc["data"]["SKILLEVAL_ENV"].as_str() {
            assert!(
                repo.join("config").join(format!("{env}.toml")).is_file(),
                "{}: SKILLEVAL_ENV={env} names no file in config/",
                file.display()
            );
        }
    }
}

/// The example collector configuration (`deploy/otel-collector.yaml`): every component a
/// pipeline names is defined, and its `otlphttp` exporter sends to the trace ingest route the
/// router serves (the exporter appends `/v1/traces` to its endpoint), gzip-compressed, with a
/// bearer token. No collector runs here: its own validation is `otelcol-contrib validate`.
#[test]
fn the_collector_example_sends_genai_traces_to_the_served_ingest_route_with_a_token() {
    let docs = yaml_docs(&deploy_dir().join("otel-collector.yaml"));
    let config = &docs[0];
    let pipelines = config["service"]["pipelines"]
        .as_mapping()
        .expect("service.pipelines");
    assert!(!pipelines.is_empty());
    for (name, pipeline) in pipelines {
        for (kind, section) in [
            ("receivers", "receivers"),
            ("processors", "processors"),
            ("exporters", "exporters"),
        ] {
            for component in pipeline[kind].as_sequence().into_iter().flatten() {
                let component = component.as_str().expect("a component name");
                assert!(
                    config[section].get(component).is_some(),
                    "pipeline {name:?} names {kind} `{component}`, which is not defined"
                );
            }
        }
    }
    let exporter = &config["exporters"]["otlphttp/skilleval"];
    let endpoint = exporter["endpoint"].as_str().expect("an endpoint");
    let path = endpoint
        .split_once('}')
        .map(|(_, rest)| rest)
        .expect("the endpoint is the service's URL variable and a path");
    let route = format!("{path}/v1/traces");
    assert!(
        skilleval_coordinator::routes::ROUTES.contains(&("post", route.as_str())),
        "{route} is not served"
    );
    assert_eq!(exporter["compression"].as_str(), Some("gzip"));
    assert!(exporter["headers"]["Authorization"]
        .as_str()
        .is_some_and(|h| h.starts_with("Bearer ")));
    let filters = config["processors"]["filter/genai"]["traces"]["span"]
        .as_sequence()
        .expect("span conditions");
    assert!(filters
        .iter()
        .any(|c| c.as_str() == Some("attributes[\"gen_ai.operation.name\"] == nil")));
}

/// The brokers of every deployment set `consumer_timeout`, the same value the workers are told
/// (`worker.broker_consumer_timeout_ms`, which the configuration accepts with its claim
/// settings), on every node of the cluster option too.
#[test]
fn every_deployment_sets_the_consumer_timeout_its_workers_are_told() {
    let base = deploy_dir().join("docker/compose.yaml");
    let doc = yaml_docs(&base).remove(0);
    let conf = doc["configs"]["rabbitmq-consumer-timeout"]["content"]
        .as_str()
        .expect("the broker's consumer_timeout file");
    let timeout: u64 = conf
        .lines()
        .find_map(|l| l.strip_prefix("consumer_timeout = "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no consumer_timeout in {conf:?}"));
    let mounted = |service: &Value| {
        service["configs"]
            .as_sequence()
            .is_some_and(|c| c.iter().any(|c| c["source"] == "rabbitmq-consumer-timeout"))
    };
    assert!(mounted(&doc["services"]["rabbitmq"]), "compose's broker");
    let told = doc["services"]["worker"]["environment"]
        ["SKILLEVAL__WORKER__BROKER_CONSUMER_TIMEOUT_MS"]
        .as_str()
        .expect("the workers are told the timeout");
    assert_eq!(told, timeout.to_string());
    let settings = Settings::load_from(&std::collections::HashMap::from([
        (
            "SKILLEVAL_CONFIG_DIR".to_string(),
            "/nonexistent".to_string(),
        ),
        (
            "SKILLEVAL__WORKER__BROKER_CONSUMER_TIMEOUT_MS".to_string(),
            told.to_string(),
        ),
    ]))
    .expect("the workers' settings");
    assert_eq!(settings.worker.broker_consumer_timeout_ms, Some(timeout));

    let mut cluster = yaml_docs(&deploy_dir().join("docker/compose.cluster.yaml")).remove(0);
    cluster.apply_merge().expect("the merge keys resolve");
    for name in ["rabbitmq", "rabbitmq-2", "rabbitmq-3"] {
        assert!(mounted(&cluster["services"][name]), "cluster node {name}");
    }

    let configmap = yaml_docs(&deploy_dir().join("k8s/configmap.yaml")).remove(0);
    assert_eq!(
        configmap["data"]["SKILLEVAL__WORKER__BROKER_CONSUMER_TIMEOUT_MS"].as_str(),
        Some(told),
        "the Kubernetes workers"
    );
    let lib = std::fs::read_to_string(deploy_dir().join("local/lib.sh")).unwrap();
    assert!(
        lib.contains(&format!("\nCONSUMER_TIMEOUT_MS={timeout}\n")),
        "deploy/local's clusters"
    );
}
