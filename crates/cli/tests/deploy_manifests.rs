//! deploy/ without a cluster and without network: the KServe manifests
//! against the committed subsets of their CRD schemas (deploy/schema), the
//! manifests against each other and the Dockerfile, and the runtime's own
//! command line run for real: `pmstate serve` with the ServingRuntime's
//! args answers its readiness probe.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Map, Value};
use yaml_rust2::{Yaml, YamlLoader};

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

/// YAML as JSON values (strings stay strings: "256" is not 256).
fn json_of(y: &Yaml) -> Value {
    match y {
        Yaml::Real(s) => s.parse::<f64>().map_or(Value::Null, Value::from),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::String(s) => Value::from(s.clone()),
        Yaml::Boolean(b) => Value::from(*b),
        Yaml::Array(a) => Value::Array(a.iter().map(json_of).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter().map(|(k, v)| (k.as_str().expect("string keys").to_owned(), json_of(v))).collect::<Map<_, _>>(),
        ),
        _ => Value::Null,
    }
}

fn load_yaml(rel: &str) -> Value {
    let text = std::fs::read_to_string(repo(rel)).unwrap();
    let docs = YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
    assert_eq!(docs.len(), 1, "{rel}: one document");
    json_of(&docs[0])
}

fn type_ok(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        _ => panic!("schema type {t} not supported by this checker"),
    }
}

/// The JSON Schema keywords deploy/schema uses: type, const, enum,
/// properties, required, additionalProperties, items, minItems, minimum,
/// maximum, $ref to #/definitions. Any other keyword is refused, so the
/// checker never passes a schema it does not understand.
fn check(root: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let s = schema.as_object().expect("a schema is an object");
    for k in s.keys() {
        let known = [
            "$comment",
            "$ref",
            "type",
            "const",
            "enum",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "minItems",
            "minimum",
            "maximum",
            "definitions",
        ];
        assert!(known.contains(&k.as_str()), "schema keyword {k} at {at} is not supported by this checker");
    }
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let name = r.strip_prefix("#/definitions/").expect("local $ref");
        return check(root, &root["definitions"][name], v, at, errors);
    }
    if let Some(t) = s.get("type") {
        let ok = match t {
            Value::String(t) => type_ok(t, v),
            Value::Array(ts) => ts.iter().any(|t| type_ok(t.as_str().unwrap(), v)),
            _ => panic!("type at {at}"),
        };
        if !ok {
            errors.push(format!("{at}: {v} is not of type {t}"));
            return;
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            errors.push(format!("{at}: {v}, expected {c}"));
        }
    }
    if let Some(Value::Array(e)) = s.get("enum") {
        if !e.contains(v) {
            errors.push(format!("{at}: {v} is not one of {}", Value::Array(e.clone())));
        }
    }
    if let (Some(min), Some(x)) = (s.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if x < min {
            errors.push(format!("{at}: {x} < minimum {min}"));
        }
    }
    if let (Some(max), Some(x)) = (s.get("maximum").and_then(Value::as_f64), v.as_f64()) {
        if x > max {
            errors.push(format!("{at}: {x} > maximum {max}"));
        }
    }
    if let Value::Object(o) = v {
        let props = s.get("properties").and_then(Value::as_object);
        for r in s.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            if !o.contains_key(r) {
                errors.push(format!("{at}: required field {r} is missing"));
            }
        }
        for (k, x) in o {
            let path = format!("{at}.{k}");
            match (props.and_then(|p| p.get(k)), s.get("additionalProperties")) {
                (Some(ps), _) => check(root, ps, x, &path, errors),
                (None, Some(Value::Bool(false))) => errors.push(format!("{path}: not a field of this CRD (a typo?)")),
                (None, Some(extra @ Value::Object(_))) => check(root, extra, x, &path, errors),
                (None, _) => {}
            }
        }
    }
    if let Value::Array(a) = v {
        if let Some(n) = s.get("minItems").and_then(Value::as_u64) {
            if (a.len() as u64) < n {
                errors.push(format!("{at}: {} items, at least {n} needed", a.len()));
            }
        }
        if let Some(items) = s.get("items") {
            for (i, x) in a.iter().enumerate() {
                check(root, items, x, &format!("{at}[{i}]"), errors);
            }
        }
    }
}

fn validate(manifest: &str, schema: &str) -> Vec<String> {
    let v = load_yaml(manifest);
    let s: Value = serde_json::from_str(&std::fs::read_to_string(repo(schema)).unwrap()).unwrap();
    let mut errors = vec![];
    check(&s, &s, &v, "$", &mut errors);
    errors
}

#[test]
fn manifests_match_their_crd_schemas() {
    for (m, s) in [
        ("deploy/kserve/servingruntime.yaml", "deploy/schema/servingruntime.schema.json"),
        ("deploy/kserve/inferenceservice.yaml", "deploy/schema/inferenceservice.schema.json"),
        ("deploy/kserve/servingruntime-repository.yaml", "deploy/schema/servingruntime.schema.json"),
        ("deploy/kserve/inferenceservice-repository.yaml", "deploy/schema/inferenceservice.schema.json"),
    ] {
        let errors = validate(m, s);
        assert!(errors.is_empty(), "{m}:\n{}", errors.join("\n"));
    }
}

#[test]
fn the_checker_catches_typos_wrong_types_and_missing_fields() {
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(repo("deploy/schema/inferenceservice.schema.json")).unwrap())
            .unwrap();
    let mut v = load_yaml("deploy/kserve/inferenceservice.yaml");
    v["spec"]["predictor"]["maxReplica"] = Value::from(3);
    v["spec"]["predictor"]["minReplicas"] = Value::from("1");
    v["spec"]["predictor"]["scaleMetric"] = Value::from("latency");
    v["spec"]["predictor"]["model"].as_object_mut().unwrap().remove("modelFormat");
    let mut errors = vec![];
    check(&s, &s, &v, "$", &mut errors);
    let all = errors.join("\n");
    for want in ["maxReplica: not a field", "minReplicas: \"1\" is not of type", "latency", "modelFormat is missing"] {
        assert!(all.contains(want), "{want} not in\n{all}");
    }
}

fn container() -> Value {
    load_yaml("deploy/kserve/servingruntime.yaml")["spec"]["containers"][0].clone()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect()
}

#[test]
fn manifests_and_the_image_agree() {
    let rt = load_yaml("deploy/kserve/servingruntime.yaml");
    let isvc = load_yaml("deploy/kserve/inferenceservice.yaml");
    let model = &isvc["spec"]["predictor"]["model"];
    assert_eq!(model["runtime"], rt["metadata"]["name"]);
    let formats: Vec<&Value> =
        rt["spec"]["supportedModelFormats"].as_array().unwrap().iter().map(|f| &f["name"]).collect();
    assert!(formats.contains(&&model["modelFormat"]["name"]));
    assert!(rt["spec"]["protocolVersions"].as_array().unwrap().contains(&model["protocolVersion"]));
    let c = container();
    let args = strings(&c["args"]);
    assert_eq!(args[0], "serve");
    let addr = &args[args.iter().position(|a| a == "--addr").unwrap() + 1];
    let port: i64 = addr.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(c["ports"][0]["containerPort"], port);
    assert_eq!(c["readinessProbe"]["httpGet"], serde_json::json!({"path": "/v2/health/ready", "port": port}));
    assert_eq!(c["livenessProbe"]["httpGet"], serde_json::json!({"path": "/v2/health/live", "port": port}));
    // the image: its entrypoint is pmstate, it exposes the port, its default command serves /mnt/models
    let docker = std::fs::read_to_string(repo("deploy/Dockerfile")).unwrap();
    assert!(docker.contains(&format!("EXPOSE {port}")));
    assert!(docker.contains("ENTRYPOINT [\"/usr/local/bin/pmstate\"]"));
    assert!(docker.contains("cargo build --release --locked -p pmstate-cli"));
    assert!(docker.lines().filter(|l| l.starts_with("FROM ")).count() >= 2, "multi-stage");
}

/// The ServingRuntime's args, with the model folder and the port of this
/// machine, start a server that answers the readiness probe's path.
#[test]
fn the_runtime_command_line_serves_and_is_ready() {
    let c = container();
    let name = load_yaml("deploy/kserve/inferenceservice.yaml")["metadata"]["name"].as_str().unwrap().to_owned();
    let ckpt = repo("testdata/policy/smpl_tracker/last.ckpt").display().to_string();
    let args: Vec<String> = strings(&c["args"])
        .into_iter()
        .map(|a| match a.as_str() {
            "/mnt/models/last.ckpt" => ckpt.clone(),
            "{{.Name}}" => name.clone(),
            a if a.starts_with("0.0.0.0:") => "127.0.0.1:0".into(),
            a => a.into(),
        })
        .collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
        .arg("--json")
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // the first line, read on a thread: a child that prints nothing fails the test (after 120 s, a hang) instead of hanging it
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(std::time::Duration::from_secs(120)).unwrap_or_else(|e| {
        let _ = child.kill();
        panic!("pmstate serve printed no line within 120 s: {e}")
    });
    let first: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    let addr = first["addr"].as_str().unwrap().to_owned();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let path = c["readinessProbe"]["httpGet"]["path"].as_str().unwrap().to_owned();
    let (ready, meta) = rt.block_on(async {
        let cl =
            pmstate_serve::client::Client::new(addr.parse().unwrap()).with_timeout(std::time::Duration::from_secs(120));
        (cl.get(&path).await.unwrap().status, cl.get(&format!("/v2/models/{name}")).await.unwrap().status)
    });
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("pmstate serve did not exit within 120 s of SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert_eq!((ready, meta), (200, 200));
}
