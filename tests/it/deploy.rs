//! deploy/: the Helm chart (deploy/helm/gpupass) judged with the real Helm, built from its Go
//! module by deploy/tools/build-helm.sh (`helm lint --strict`, `helm template` with the default
//! and with changed values, the output parsed by Kubernetes' own YAML reader through
//! deploy/tools/yaml2json); the ClusterRole against the API calls src/containers/kubelet/api.rs
//! makes and the table of docs/deploy.md; and the image (deploy/image/build.sh): built twice to
//! the same digest, its layout checked blob by blob, loaded and run by podman.
//!
//! Without Go (build-helm.sh) or podman these tests say SKIPPED, except under `CI=true`, where
//! they fail with what to install.

use super::util::{manifest_dir, need_tool};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

const CHART: &str = "deploy/helm/gpupass";
const RELEASE: &str = "gp";
const NAMESPACE: &str = "gpupass-system";

fn ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// `helm` and `yaml2json` from build-helm.sh's cache entry (built once per test run), or None
/// (SKIPPED) without Go outside CI.
fn tools() -> Option<&'static (PathBuf, PathBuf)> {
    static T: OnceLock<Result<(PathBuf, PathBuf), String>> = OnceLock::new();
    let r = T.get_or_init(|| {
        let script = manifest_dir().join("deploy/tools/build-helm.sh");
        let o = Command::new(&script)
            .output()
            .map_err(|e| format!("{}: {e}", script.display()))?;
        if o.status.code() == Some(2) {
            return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
        }
        if !o.status.success() {
            panic!(
                "deploy/tools/build-helm.sh failed ({}):\n{}\n{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let d = Command::new(&script).arg("--print-dir").output().unwrap();
        let dir = PathBuf::from(String::from_utf8(d.stdout).unwrap().trim());
        Ok((dir.join("bin/helm"), dir.join("bin/yaml2json")))
    });
    match r {
        Ok(t) => Some(t),
        Err(why) => {
            assert!(
                !ci(),
                "{why}: CI must run this test (install Go, e.g. /usr/local/go)"
            );
            eprintln!("SKIPPED: {why} (mandatory when CI=true)");
            None
        }
    }
}

fn helm(args: &[&str]) -> std::process::Output {
    let (helm, _) = tools().unwrap();
    let home = tempfile::tempdir().unwrap();
    // No user configuration or cache: every run sees the same Helm.
    Command::new(helm)
        .args(args)
        .current_dir(manifest_dir())
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .unwrap()
}

/// `helm template` of the chart with `--set` pairs, as JSON documents (or the failed output).
fn render(set: &[&str]) -> Result<Vec<Value>, String> {
    let mut args = vec!["template", RELEASE, CHART, "--namespace", NAMESPACE];
    for s in set {
        args.extend(["--set", s]);
    }
    let o = helm(&args);
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    let (_, y2j) = tools().unwrap();
    let mut c = Command::new(y2j)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(&o.stdout).unwrap();
    let j = c.wait_with_output().unwrap();
    assert!(
        j.status.success(),
        "yaml2json on helm template's output: {}\n{}",
        String::from_utf8_lossy(&j.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    Ok(serde_json::from_slice::<Vec<Value>>(&j.stdout).unwrap())
}

fn rendered(set: &[&str]) -> Vec<Value> {
    render(set).unwrap_or_else(|e| panic!("helm template {set:?}: {e}"))
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let v = of_kind(docs, kind);
    assert_eq!(v.len(), 1, "one {kind}: {v:?}");
    v[0]
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// (name, mountPath, hostPath, type, readOnly) of the plugin container's mounts, each joined
/// with its volume.
fn mounts(ds: &Value) -> BTreeSet<(String, String, String, String, bool)> {
    let spec = &ds["spec"]["template"]["spec"];
    let vols = spec["volumes"].as_array().unwrap();
    let c = &spec["containers"][0];
    let m: Vec<&Value> = c["volumeMounts"].as_array().unwrap().iter().collect();
    assert_eq!(
        vols.len(),
        m.len(),
        "a volume without a mount or a mount without a volume"
    );
    m.iter()
        .map(|m| {
            let name = m["name"].as_str().unwrap();
            let v = vols
                .iter()
                .find(|v| v["name"] == name)
                .expect("the mount's volume");
            let hp = &v["hostPath"];
            assert!(hp.is_object(), "volume {name} is not a hostPath: {v}");
            (
                name.to_string(),
                m["mountPath"].as_str().unwrap().to_string(),
                hp["path"].as_str().unwrap().to_string(),
                hp["type"].as_str().unwrap().to_string(),
                m["readOnly"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

fn mount(
    name: &str,
    container: &str,
    host: &str,
    ty: &str,
    ro: bool,
) -> (String, String, String, String, bool) {
    (name.into(), container.into(), host.into(), ty.into(), ro)
}

/// What every render mounts besides the kubelet's directories.
fn host_mounts() -> Vec<(String, String, String, String, bool)> {
    vec![
        mount("cdi", "/var/run/cdi", "/var/run/cdi", "DirectoryOrCreate", false),
        mount(
            "gpupass-run",
            "/run/gpupass",
            "/run/gpupass",
            "DirectoryOrCreate",
            false,
        ),
        mount("sys", "/sys", "/sys", "Directory", false),
        mount("dev-vfio", "/dev/vfio", "/dev/vfio", "DirectoryOrCreate", true),
        mount("lib-modules", "/lib/modules", "/lib/modules", "Directory", true),
    ]
}

// ---------------------------------------------------------------- RBAC: code, doc, chart

/// The (API group, resource, verb) triples src/containers/kubelet/api.rs calls, read from its code:
/// every `Api::<Kind>::<ctor>(...)` and the kube-rs method called on it.
/// The files that talk to the API server: the publisher and claim reads, and the binding
/// conditions' claim watcher.
const API_FILES: [&str; 2] = [
    "src/containers/kubelet/api.rs",
    "src/containers/kubelet/binding.rs",
];

fn rbac_of_code() -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for f in API_FILES {
        rbac_of_file(f, &mut out);
    }
    out
}

fn rbac_of_file(file: &str, out: &mut BTreeSet<(String, String, String)>) {
    let text = std::fs::read_to_string(manifest_dir().join(file)).unwrap();
    let code = text.split("#[cfg(test)]").next().unwrap();
    let mut rest = code;
    while let Some(i) = rest.find("Api::<") {
        rest = &rest[i + "Api::<".len()..];
        let kind = &rest[..rest.find('>').unwrap()];
        // The constructor's arguments, then `.method(`.
        let open = rest.find('(').unwrap();
        let mut depth = 0;
        let mut end = open;
        for (j, ch) in rest[open..].char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + j;
                        break;
                    }
                }
                _ => {}
            }
        }
        let after = rest[end + 1..].trim_start();
        let after = after.strip_prefix('.').unwrap_or_else(|| {
            panic!(
                "Api::<{kind}> not followed by a method call: {}",
                &after[..40.min(after.len())]
            )
        });
        let method: String = after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let (group, resource) = match kind {
            "ResourceClaim" => ("resource.k8s.io", "resourceclaims"),
            "ResourceSlice" => ("resource.k8s.io", "resourceslices"),
            "Node" => ("", "nodes"),
            k => panic!("api.rs calls Api::<{k}>: add its group and resource here, a row to docs/deploy.md's permissions table and a rule to the chart's ClusterRole"),
        };
        let verb = match method.as_str() {
            "get" | "list" | "create" | "delete" | "patch" | "watch" => method.clone(),
            "replace" => "update".into(),
            // A claim's status.devices (binding conditions): the status subresource, and the
            // per-driver synthetic subresource KEP-4817 checks for status.devices writes
            // (`associated-node:` for a service account bound to the claim's node).
            "patch_status" => {
                out.insert((
                    group.to_string(),
                    format!("{resource}/driver"),
                    "associated-node:patch".into(),
                ));
                out.insert((group.to_string(), format!("{resource}/status"), "patch".into()));
                continue;
            }
            m => panic!("{file} calls Api::<{kind}>::{m}: map it to its RBAC verb (and subresource) here"),
        };
        out.insert((group.to_string(), resource.to_string(), verb));
    }
}

/// The rows of docs/deploy.md's permissions table (between `<!-- rbac -->` and `<!-- /rbac -->`).
fn rbac_of_doc() -> BTreeSet<(String, String, String)> {
    let doc = std::fs::read_to_string(manifest_dir().join("docs/deploy.md")).unwrap();
    let start = doc
        .find("<!-- rbac -->")
        .expect("docs/deploy.md has the <!-- rbac --> table");
    let end = doc
        .find("<!-- /rbac -->")
        .expect("docs/deploy.md closes the table with <!-- /rbac -->");
    let mut out = BTreeSet::new();
    for line in doc[start..end].lines().filter(|l| l.starts_with('|')).skip(2) {
        let cells: Vec<&str> = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().trim_matches('`'))
            .collect();
        let group = if cells[0] == "\"\" (core)" { "" } else { cells[0] };
        out.insert((group.to_string(), cells[1].to_string(), cells[2].to_string()));
    }
    out
}

fn rbac_of_chart(docs: &[Value]) -> BTreeSet<(String, String, String)> {
    let role = one(docs, "ClusterRole");
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        let obj = rule.as_object().unwrap();
        let keys: BTreeSet<&str> = obj.keys().map(|k| k.as_str()).collect();
        // resourceNames only where it names the driver (resourceclaims/driver: KEP-4817's
        // per-driver check of status.devices writes).
        let mut allowed = BTreeSet::from(["apiGroups", "resources", "verbs"]);
        if strs(&rule["resources"]) == ["resourceclaims/driver"] {
            allowed.insert("resourceNames");
            assert_eq!(strs(&rule["resourceNames"]).len(), 1, "one driver: {rule}");
        }
        assert_eq!(keys, allowed, "{rule}");
        for field in ["apiGroups", "resources", "verbs"] {
            for s in strs(&rule[field]) {
                assert!(!s.contains('*'), "a wildcard in the ClusterRole: {rule}");
            }
        }
        for g in strs(&rule["apiGroups"]) {
            for r in strs(&rule["resources"]) {
                for v in strs(&rule["verbs"]) {
                    assert!(
                        out.insert((g.clone(), r.clone(), v)),
                        "a rule repeats a permission: {rule}"
                    );
                }
            }
        }
    }
    out
}

#[test]
fn the_cluster_role_is_exactly_the_calls_the_code_makes_and_the_doc_lists() {
    let code = rbac_of_code();
    // What api.rs does today (if this changes, the three below follow).
    assert!(code.contains(&("resource.k8s.io".into(), "resourceslices".into(), "update".into())));
    assert!(
        code.contains(&(
            "resource.k8s.io".into(),
            "resourceclaims/status".into(),
            "patch".into()
        )),
        "binding conditions are written on the claim's status"
    );
    // No other file talks to the API server.
    let out = Command::new("grep")
        .args(["-rl", "--include=*.rs", "Api::<", "src"])
        .current_dir(manifest_dir())
        .output()
        .unwrap();
    let others: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !API_FILES.contains(l))
        .map(String::from)
        .collect();
    assert!(
        others.is_empty(),
        "kube Api calls outside api.rs (extend rbac_of_code): {others:?}"
    );
    assert_eq!(
        rbac_of_doc(),
        code,
        "docs/deploy.md's permissions table against api.rs"
    );
    let Some(_) = tools() else { return };
    for set in [
        &[][..],
        &["driverName=gpu.example.com", "serviceAccount.name=sa1"][..],
    ] {
        let docs = rendered(set);
        assert_eq!(
            rbac_of_chart(&docs),
            code,
            "the chart's ClusterRole against api.rs ({set:?})"
        );
    }
}

// ---------------------------------------------------------------- the chart

#[test]
fn helm_lint_strict_is_clean() {
    let Some(_) = tools() else { return };
    let o = helm(&["lint", "--strict", CHART]);
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "helm lint --strict:\n{out}");
    assert!(out.contains("0 chart(s) failed"), "{out}");
    assert!(!out.contains("[WARNING]") && !out.contains("[ERROR]"), "{out}");
}

#[test]
fn the_chart_version_is_cargos() {
    let chart = std::fs::read_to_string(manifest_dir().join(CHART).join("Chart.yaml")).unwrap();
    let cargo = std::fs::read_to_string(manifest_dir().join("Cargo.toml")).unwrap();
    let version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap();
    assert!(
        chart.lines().any(|l| l == format!("appVersion: \"{version}\"")),
        "Chart.yaml's appVersion must be Cargo.toml's {version}"
    );
}

#[test]
fn the_default_render_is_the_plugin_as_documented() {
    let Some(_) = tools() else { return };
    let docs = rendered(&[]);
    let kinds: BTreeSet<String> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "DaemonSet",
            "DeviceClass",
            "ServiceAccount"
        ]
        .map(String::from)
        .into()
    );
    let ds = one(&docs, "DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], NAMESPACE);
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["priorityClassName"], "system-node-critical");
    // The in-use check walks the host's /proc/<pid>/fd: the host's PID namespace.
    assert_eq!(spec["hostPID"], true);
    assert_eq!(spec["containers"].as_array().unwrap().len(), 1);
    let c = &spec["containers"][0];
    assert_eq!(c["image"], "gpupass.dev/gpupass:0.1.0");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(c["securityContext"]["privileged"], true);
    assert_eq!(c["resources"]["requests"]["cpu"], "10m");
    assert!(c.get("command").is_none(), "the image's entrypoint runs");
    assert_eq!(
        strs(&c["args"]),
        [
            "-v",
            "--log-format=text",
            "dra-plugin",
            "--driver=vfio.gpupass.dev",
            "--backend=auto",
            "--registry-dir=/var/lib/kubelet/plugins_registry",
            "--plugin-dir=/var/lib/kubelet/plugins/vfio.gpupass.dev",
            "--poll-ms=500",
            "--api-timeout-s=10",
            "--binding-conditions=auto",
        ]
    );
    // The node name from the downward API, and nothing else from the environment (no
    // kubeconfig: kube-rs takes the Pod's service account).
    assert_eq!(c["env"].as_array().unwrap().len(), 1);
    assert_eq!(c["env"][0]["name"], "NODE_NAME");
    assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    // The node's network is not the plugin's (it dials the API server as any Pod does); its
    // PID namespace is (asserted above: the in-use check).
    assert!(spec.get("hostNetwork").is_none());
    // Both probes run `gpupass dra probe` on the plugin's two sockets.
    for p in ["startupProbe", "livenessProbe"] {
        assert_eq!(
            strs(&c[p]["exec"]["command"]),
            [
                "/usr/bin/gpupass",
                "dra",
                "probe",
                "--driver=vfio.gpupass.dev",
                "--registry-dir=/var/lib/kubelet/plugins_registry",
                "--plugin-dir=/var/lib/kubelet/plugins/vfio.gpupass.dev",
                "--timeout-s=10",
            ],
            "{p}"
        );
        assert_eq!(c[p]["timeoutSeconds"], 25, "{p}: two calls of 10 s and the start");
    }
    let mut want: BTreeSet<_> = host_mounts().into_iter().collect();
    want.insert(mount(
        "registration-dir",
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins_registry",
        "DirectoryOrCreate",
        false,
    ));
    want.insert(mount(
        "plugin-dir",
        "/var/lib/kubelet/plugins/vfio.gpupass.dev",
        "/var/lib/kubelet/plugins/vfio.gpupass.dev",
        "DirectoryOrCreate",
        false,
    ));
    assert_eq!(mounts(ds), want);
    // The service account the Pod runs as is the one the ClusterRole is bound to.
    let sa = one(&docs, "ServiceAccount");
    assert_eq!(spec["serviceAccountName"], sa["metadata"]["name"]);
    let crb = one(&docs, "ClusterRoleBinding");
    assert_eq!(
        crb["roleRef"]["name"],
        one(&docs, "ClusterRole")["metadata"]["name"]
    );
    assert_eq!(crb["roleRef"]["kind"], "ClusterRole");
    assert_eq!(crb["subjects"].as_array().unwrap().len(), 1);
    assert_eq!(crb["subjects"][0]["kind"], "ServiceAccount");
    assert_eq!(crb["subjects"][0]["name"], sa["metadata"]["name"]);
    assert_eq!(crb["subjects"][0]["namespace"], NAMESPACE);
    // The DeviceClasses of contrib/dra/deviceclass.yaml.
    let classes: BTreeSet<String> = of_kind(&docs, "DeviceClass")
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let contrib = std::fs::read_to_string(manifest_dir().join("contrib/dra/deviceclass.yaml")).unwrap();
    let shipped: BTreeSet<String> = contrib
        .split("\n---")
        .filter_map(|d| {
            d.lines()
                .skip_while(|l| *l != "metadata:")
                .find_map(|l| l.strip_prefix("  name: "))
                .map(String::from)
        })
        .collect();
    assert_eq!(classes, shipped);
    for d in of_kind(&docs, "DeviceClass") {
        let cel = d["spec"]["selectors"][0]["cel"]["expression"].as_str().unwrap();
        assert!(
            cel.starts_with("device.driver == \"vfio.gpupass.dev\" &&"),
            "{cel}"
        );
        let name = d["metadata"]["name"].as_str().unwrap();
        assert!(
            contrib.contains(cel.split("&&").last().unwrap().trim()),
            "{name}: {cel}"
        );
    }
}

#[test]
fn changed_values_reach_the_pod() {
    let Some(_) = tools() else { return };
    let docs = rendered(&[
        "driverName=gpu.example.com",
        "backend=legacy",
        "logLevel=3",
        "logFormat=json",
        "image.repository=registry.example.com/gp",
        "image.tag=v9",
        "image.pullPolicy=Never",
        "kubeletPlugin.nodeSelector.gpupass\\.dev/vfio=true",
        "kubeletPlugin.tolerations[0].key=gpu",
        "kubeletPlugin.tolerations[0].operator=Exists",
        "kubeletPlugin.tolerations[0].effect=NoSchedule",
        "kubeletPlugin.privileged=false",
        "kubeletPlugin.hostPID=false",
        "kubeletPlugin.priorityClassName=",
        "kubeletPlugin.pollMs=250",
        "kubeletPlugin.apiTimeoutSeconds=20",
        "kubeletPlugin.bindingConditions=off",
        "kubeletPlugin.probe.timeoutSeconds=3",
        "kubelet.registrationDir=/var/lib/k0s/kubelet/plugins_registry",
        "kubelet.pluginsDir=/var/lib/k0s/kubelet/plugins",
        "serviceAccount.name=gpu-sa",
        "deviceClasses.nvidiaIommufd=false",
    ]);
    let ds = one(&docs, "DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    assert_eq!(c["image"], "registry.example.com/gp:v9");
    assert_eq!(c["imagePullPolicy"], "Never");
    assert_eq!(c["securityContext"]["privileged"], false);
    assert_eq!(spec["hostPID"], false);
    assert!(spec.get("priorityClassName").is_none());
    assert_eq!(spec["nodeSelector"]["gpupass.dev/vfio"], "true");
    assert_eq!(spec["tolerations"][0]["key"], "gpu");
    assert_eq!(spec["tolerations"][0]["effect"], "NoSchedule");
    assert_eq!(spec["serviceAccountName"], "gpu-sa");
    assert_eq!(
        strs(&c["args"]),
        [
            "-vvv",
            "--log-format=json",
            "dra-plugin",
            "--driver=gpu.example.com",
            "--backend=legacy",
            "--registry-dir=/var/lib/k0s/kubelet/plugins_registry",
            "--plugin-dir=/var/lib/k0s/kubelet/plugins/gpu.example.com",
            "--poll-ms=250",
            "--api-timeout-s=20",
            "--binding-conditions=off",
        ]
    );
    assert_eq!(c["livenessProbe"]["timeoutSeconds"], 11);
    assert!(strs(&c["livenessProbe"]["exec"]["command"]).contains(&"--driver=gpu.example.com".to_string()));
    // Another kubelet root: the sockets move there, and the checkpoint and metadata files stay
    // at /var/lib/kubelet/plugins/<driver> (where the code keeps them), a mount of their own.
    let mut want: BTreeSet<_> = host_mounts().into_iter().collect();
    for (name, path) in [
        ("registration-dir", "/var/lib/k0s/kubelet/plugins_registry"),
        ("plugin-dir", "/var/lib/k0s/kubelet/plugins/gpu.example.com"),
        ("state-dir", "/var/lib/kubelet/plugins/gpu.example.com"),
    ] {
        want.insert(mount(name, path, path, "DirectoryOrCreate", false));
    }
    assert_eq!(mounts(ds), want);
    let classes: BTreeSet<String> = of_kind(&docs, "DeviceClass")
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        classes,
        ["gpu.example.com", "mdev.gpu.example.com", "vm.gpu.example.com"]
            .map(String::from)
            .into()
    );
    for d in of_kind(&docs, "DeviceClass") {
        let cel = d["spec"]["selectors"][0]["cel"]["expression"].as_str().unwrap();
        assert!(
            cel.starts_with("device.driver == \"gpu.example.com\" &&"),
            "{cel}"
        );
        // A class's opaque config names the renamed driver too (vm: kvm: true).
        if let Some(c) = d["spec"]["config"].as_array() {
            assert_eq!(c[0]["opaque"]["driver"], "gpu.example.com");
        }
    }
    // A cluster whose Service ClusterIP does not route from the nodes (no kube-proxy: the
    // cluster lab, docs/deploy.md "Clusters without kube-proxy"): the API server's own address
    // in the two variables kube-rs's in-cluster configuration reads, after NODE_NAME, and the
    // node's network namespace. The credentials stay the service account's.
    let docs = rendered(&[
        "apiServer.host=10.0.2.2",
        "apiServer.port=6443",
        "kubeletPlugin.hostNetwork=true",
    ]);
    let spec = &one(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["dnsPolicy"], "Default");
    let env: Vec<(String, String)> = spec["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"]
                    .as_str()
                    .unwrap_or("(from the downward API)")
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        env,
        [
            ("NODE_NAME", "(from the downward API)"),
            ("KUBERNETES_SERVICE_HOST", "10.0.2.2"),
            ("KUBERNETES_SERVICE_PORT", "6443"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    // logLevel 0: no -v at all.
    let quiet = rendered(&["logLevel=0"]);
    let args = strs(&one(&quiet, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert_eq!(args[0], "--log-format=text");
    // An existing service account: none made, the binding names it.
    let docs = rendered(&["serviceAccount.create=false", "serviceAccount.name=ops-sa"]);
    assert!(of_kind(&docs, "ServiceAccount").is_empty());
    assert_eq!(one(&docs, "ClusterRoleBinding")["subjects"][0]["name"], "ops-sa");
}

#[test]
fn bad_values_are_refused_with_the_field_named() {
    let Some(_) = tools() else { return };
    for (set, says) in [
        ("backend=vfio", "backend"),
        ("logLevel=7", "logLevel"),
        ("driverName=Bad_Name", "driverName"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("kubelet.pluginsDir=relative/plugins", "pluginsDir"),
        ("kubeletPlugin.privilegd=true", "privilegd"),
        ("apiServer.host=https://10.0.2.2", "apiServer/host"),
        ("apiServer.port=70000", "apiServer/port"),
        ("apiServer.hots=10.0.2.2", "hots"),
    ] {
        let e = render(&[set]).expect_err(set);
        assert!(e.contains(says), "{set}: {e}");
    }
    let e = render(&["apiServer.host=10.0.2.2"]).expect_err("a host without a port");
    assert!(
        e.contains("apiServer.port is required with apiServer.host"),
        "{e}"
    );
    let e = render(&["serviceAccount.create=false"]).expect_err("no service account name");
    assert!(e.contains("serviceAccount.name is required"), "{e}");
    // resource.k8s.io/v1 is served from 1.34: an older cluster is refused before anything is made.
    let o = helm(&["template", RELEASE, CHART, "--kube-version", "1.33.0"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains(">=1.34.0-0"), "{e}");
    assert!(helm(&["template", RELEASE, CHART, "--kube-version", "1.34.0"])
        .status
        .success());
}

// ---------------------------------------------------------------- the image

/// A static gpupass with `dra probe`: the package's static release binary (contrib/package.sh,
/// the one tests/it/package.rs builds and installs, so a test run builds it once for both), the
/// QEMU lab's (target/lab) or an image build's (target/image) when one is there already, else
/// the package's built now with `contrib/package.sh --bin-only`.
fn static_binary() -> PathBuf {
    static B: OnceLock<PathBuf> = OnceLock::new();
    B.get_or_init(|| {
        let root = manifest_dir();
        let has_probe = |p: &Path| {
            p.is_file()
                && Command::new(p)
                    .args(["dra", "probe", "--help"])
                    .output()
                    .is_ok_and(|o| o.status.success())
        };
        for p in [
            "target/x86_64-unknown-linux-gnu/release/gpupass",
            "target/lab/x86_64-unknown-linux-gnu/lab/gpupass",
            "target/image/x86_64-unknown-linux-gnu/release/gpupass",
            "target/image/x86_64-unknown-linux-gnu/lab/gpupass",
        ] {
            if has_probe(&root.join(p)) {
                return root.join(p);
            }
        }
        let o = Command::new(root.join("contrib/package.sh"))
            .arg("--bin-only")
            .current_dir(&root)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "contrib/package.sh --bin-only: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let out = String::from_utf8_lossy(&o.stdout);
        let p = root.join(out.lines().last().expect("package.sh names the binary").trim());
        assert!(has_probe(&p), "{} has no `dra probe`", p.display());
        p
    })
    .clone()
}

/// deploy/image/build.sh --binary BIN --tag TAG --out OUT: (digest, size) from its last line.
fn build_image(bin: &Path, tag: &str, out: &Path) -> (String, u64) {
    let o = Command::new(manifest_dir().join("deploy/image/build.sh"))
        .arg("--binary")
        .arg(bin)
        .args(["--tag", tag, "--out"])
        .arg(out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "build.sh: {stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let last = stdout.lines().last().unwrap();
    let w: Vec<&str> = last.split(' ').collect();
    assert_eq!(
        (w[0], w[1], w[2], w[4], w[6]),
        ("image", tag, "digest", "size", "file"),
        "{last}"
    );
    let size: u64 = w[5].parse().unwrap();
    assert_eq!(size, std::fs::metadata(out).unwrap().len());
    (w[3].to_string(), size)
}

fn sha256(p: &Path) -> String {
    let o = Command::new("sha256sum").arg(p).output().unwrap();
    let s = String::from_utf8(o.stdout).unwrap();
    format!("sha256:{}", s.split(' ').next().unwrap())
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

#[test]
fn the_image_is_reproducible_and_a_valid_oci_layout() {
    let bin = static_binary();
    let t = tempfile::tempdir().unwrap();
    let tag = "gpupass.dev/gpupass:test";
    let (d1, s1) = build_image(&bin, tag, &t.path().join("a.tar"));
    let (d2, s2) = build_image(&bin, tag, &t.path().join("b.tar"));
    assert_eq!((&d1, s1), (&d2, s2), "two builds of one source differ");
    assert_eq!(sha256(&t.path().join("a.tar")), sha256(&t.path().join("b.tar")));
    // Another tag: the same manifest (the name is only in the index).
    let (d3, _) = build_image(&bin, "example.com/x:y", &t.path().join("c.tar"));
    assert_eq!(d1, d3);

    let layout = t.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    let st = Command::new("tar")
        .arg("-xf")
        .arg(t.path().join("a.tar"))
        .arg("-C")
        .arg(&layout)
        .status()
        .unwrap();
    assert!(st.success());
    let json = |p: &Path| -> Value { serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap() };
    assert_eq!(json(&layout.join("oci-layout"))["imageLayoutVersion"], "1.0.0");
    let index = json(&layout.join("index.json"));
    assert_eq!(index["schemaVersion"], 2);
    assert_eq!(index["manifests"].as_array().unwrap().len(), 1);
    let m = &index["manifests"][0];
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(m["digest"], d1.as_str());
    assert_eq!(m["annotations"]["org.opencontainers.image.ref.name"], tag);
    assert_eq!(m["annotations"]["io.containerd.image.name"], tag);
    // Every blob is named by its digest and has the size its descriptor says.
    let mut blobs = 0;
    for e in std::fs::read_dir(layout.join("blobs/sha256")).unwrap().flatten() {
        assert_eq!(
            sha256(&e.path()),
            format!("sha256:{}", e.file_name().to_string_lossy())
        );
        blobs += 1;
    }
    assert_eq!(blobs, 3, "manifest, config, one layer");
    let size_ok = |desc: &Value| {
        let p = blob(&layout, desc["digest"].as_str().unwrap());
        assert_eq!(
            desc["size"].as_u64(),
            Some(std::fs::metadata(&p).unwrap().len()),
            "{desc}"
        );
        p
    };
    let manifest = json(&size_ok(m));
    let config_desc = &manifest["config"];
    assert_eq!(
        config_desc["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    let config = json(&size_ok(config_desc));
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(strs(&config["config"]["Entrypoint"]), ["/usr/bin/gpupass"]);
    assert_eq!(strs(&config["config"]["Cmd"]), ["dra-plugin"]);
    assert_eq!(
        config["config"]["Labels"]["org.opencontainers.image.version"],
        "0.1.0"
    );
    // The time stamp is the commit's.
    let ct = Command::new("git")
        .args(["log", "-1", "--format=%cI"])
        .current_dir(manifest_dir())
        .output()
        .unwrap();
    let ct = String::from_utf8(ct.stdout).unwrap();
    let o = Command::new("date")
        .args(["-u", "-d", ct.trim(), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    assert_eq!(config["created"], String::from_utf8(o.stdout).unwrap().trim());
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let layer = size_ok(&layers[0]);
    // diff_id: the digest of the uncompressed layer.
    let raw = t.path().join("layer.tar");
    let o = Command::new("gzip").arg("-dc").arg(&layer).output().unwrap();
    std::fs::write(&raw, &o.stdout).unwrap();
    assert_eq!(strs(&config["rootfs"]["diff_ids"]), [sha256(&raw)]);
    // The layer holds the binary, the directories it runs in and /var/run -> /run: nothing more.
    let o = Command::new("tar").args(["-tvf"]).arg(&raw).output().unwrap();
    let listing = String::from_utf8(o.stdout).unwrap();
    let mut entries = Vec::new();
    for l in listing.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(w[1], "0/0", "owner: {l}");
        entries.push(format!("{} {}", w[0], w[5..].join(" ")));
    }
    assert_eq!(
        entries,
        [
            "drwxr-xr-x ./",
            "drwxr-xr-x ./etc/",
            "drwxr-xr-x ./run/",
            "drwxrwxrwt ./tmp/",
            "drwxr-xr-x ./usr/",
            "drwxr-xr-x ./usr/bin/",
            "-rwxr-xr-x ./usr/bin/gpupass",
            "drwxr-xr-x ./var/",
            "lrwxrwxrwx ./var/run -> ../run",
        ]
    );
}

#[test]
fn the_image_build_refuses_bad_input_with_the_fix() {
    let run = |args: &[&str]| {
        let o = Command::new(manifest_dir().join("deploy/image/build.sh"))
            .args(args)
            .output()
            .unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (rc, e) = run(&["--tag", "Gpupass:1"]);
    assert_eq!(rc, Some(2), "{e}");
    assert!(
        e.contains("invalid --tag 'Gpupass:1'") && e.contains("lower-case"),
        "{e}"
    );
    let (rc, e) = run(&["--tag", "gpupass.dev/gpupass"]);
    assert_eq!(rc, Some(2), "a name without a tag: {e}");
    let (rc, e) = run(&["--binary", "/nonexistent/gpupass"]);
    assert_eq!(rc, Some(2), "{e}");
    assert!(e.contains("no binary at /nonexistent/gpupass"), "{e}");
    // A dynamically linked program: the image has no libc.
    let (rc, e) = run(&["--binary", "/bin/sh"]);
    assert_eq!(rc, Some(1), "{e}");
    assert!(
        e.contains("not statically linked") && e.contains("crt-static"),
        "{e}"
    );
    let (rc, e) = run(&["--frobnicate"]);
    assert_eq!(rc, Some(2), "{e}");
    assert!(e.contains("unknown argument '--frobnicate'"), "{e}");
}

#[test]
fn podman_loads_and_runs_the_image() {
    if !need_tool("podman") {
        return;
    }
    let bin = static_binary();
    let t = tempfile::tempdir().unwrap();
    let tag = "gpupass.dev/gpupass:it-deploy";
    let tar = t.path().join("img.tar");
    let (digest, _) = build_image(&bin, tag, &tar);
    let conf = t.path().join("containers.conf");
    // This workplace's container cannot raise rlimits to podman's defaults (as in containers.rs).
    std::fs::write(
        &conf,
        "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\n[engine]\nruntime = \"runc\"\n",
    )
    .unwrap();
    let podman = |args: &[&str]| {
        let o = Command::new("podman")
            .env("CONTAINERS_CONF", &conf)
            .args(args)
            .output()
            .unwrap();
        (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    };
    let (ok, out) = podman(&["load", "-i", tar.to_str().unwrap()]);
    assert!(ok, "podman load: {out}");
    assert!(out.contains(tag), "podman load names the image {tag}: {out}");
    let (ok, out) = podman(&[
        "image",
        "inspect",
        "--format",
        "{{.Digest}} {{.Config.Entrypoint}}",
        tag,
    ]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), format!("{digest} [/usr/bin/gpupass]"));
    // The entrypoint runs in the container (static: no libc in the image), and the chart's
    // arguments parse with the image's own binary (clap checks every flag before --help).
    let (ok, out) = podman(&["run", "--rm", "--network=none", tag, "--version"]);
    assert!(ok && out.starts_with("gpupass "), "{out}");
    let docs = rendered_or_default();
    let mut run = vec![
        "run".to_string(),
        "--rm".into(),
        "--network=none".into(),
        tag.into(),
    ];
    run.extend(docs.0);
    run.push("--help".into());
    let run: Vec<&str> = run.iter().map(|s| s.as_str()).collect();
    let (ok, out) = podman(&run);
    assert!(ok, "the chart's args in the image: {out}");
    assert!(out.contains("--registry-dir"), "{out}");
    let mut probe = vec![
        "run".to_string(),
        "--rm".into(),
        "--network=none".into(),
        "--entrypoint".into(),
    ];
    probe.push(docs.1[0].clone());
    probe.push(tag.into());
    probe.extend(docs.1[1..].iter().cloned());
    let probe: Vec<&str> = probe.iter().map(|s| s.as_str()).collect();
    // No plugin runs in this container: the probe fails and says which socket it tried.
    let (ok, out) = podman(&probe);
    assert!(!ok, "{out}");
    assert!(
        out.contains("cannot connect to /var/lib/kubelet/plugins_registry/vfio.gpupass.dev-reg.sock"),
        "{out}"
    );
    let _ = podman(&["rmi", "-f", tag]);
}

/// The default render's container args and probe command (or, without Helm, the ones
/// the_default_render_is_the_plugin_as_documented pins).
fn rendered_or_default() -> (Vec<String>, Vec<String>) {
    if tools().is_some() {
        let docs = rendered(&[]);
        let c = &one(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
        return (strs(&c["args"]), strs(&c["livenessProbe"]["exec"]["command"]));
    }
    (
        [
            "-v",
            "--log-format=text",
            "dra-plugin",
            "--driver=vfio.gpupass.dev",
            "--backend=auto",
            "--registry-dir=/var/lib/kubelet/plugins_registry",
            "--plugin-dir=/var/lib/kubelet/plugins/vfio.gpupass.dev",
            "--poll-ms=500",
            "--api-timeout-s=10",
            "--binding-conditions=auto",
        ]
        .map(String::from)
        .into(),
        [
            "/usr/bin/gpupass",
            "dra",
            "probe",
            "--driver=vfio.gpupass.dev",
            "--registry-dir=/var/lib/kubelet/plugins_registry",
            "--plugin-dir=/var/lib/kubelet/plugins/vfio.gpupass.dev",
            "--timeout-s=10",
        ]
        .map(String::from)
        .into(),
    )
}
