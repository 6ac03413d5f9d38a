//! Unit tests of credential handling: every kubeconfig credential form, every malformed
//! input (the error names the file and the problem), resolution order, KUBECONFIG merging,
//! client certificate reloading and redaction of secrets in `Debug`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use base64::Engine;

use super::credentials::resolve;
use super::*;

struct Pki {
    cert: String,
    key: String,
}

fn pki() -> Pki {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    Pki { cert: ck.cert.pem(), key: ck.signing_key.serialize_pem() }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A kubeconfig with one cluster (CA data), one context and the given user body.
fn kubeconfig(ca: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: main\nclusters:\n- name: c1\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {}\ncontexts:\n- name: main\n  context:\n    cluster: c1\n    user: u1\nusers:\n- name: u1\n  user:\n{user}\n",
        b64(ca)
    )
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&p, text).unwrap();
    p
}

fn load_one(path: &Path, ctx: Option<&str>) -> Result<Credentials, Error> {
    kubeconfig::load(&[path.to_path_buf()], ctx)
}

#[test]
fn client_certificate_and_key_data() {
    let d = tempfile::tempdir().unwrap();
    let p = pki();
    let user = format!("    client-certificate-data: {}\n    client-key-data: {}", b64(&p.cert), b64(&p.key));
    let path = write(d.path(), "config", &kubeconfig(&p.cert, &user));
    let c = load_one(&path, None).unwrap();
    assert_eq!(c.server, "https://127.0.0.1:6443");
    assert_eq!(c.ca, Some(Pem::Data(p.cert.clone().into_bytes())));
    assert_eq!(c.auth, Auth::ClientCert { cert: Pem::Data(p.cert.into_bytes()), key: Pem::Data(p.key.into_bytes()) });
    assert!(!c.insecure_skip_tls_verify);
    assert!(c.identity.contains("client certificate") && c.identity.contains("config"), "{}", c.identity);
    Client::new(c, ClientSettings::default()).expect("a matching pair builds a client");
}

#[test]
fn client_certificate_files_relative_to_the_kubeconfig() {
    let d = tempfile::tempdir().unwrap();
    let p = pki();
    write(d.path(), "k/pki/client.crt", &p.cert);
    write(d.path(), "k/pki/client.key", &p.key);
    write(d.path(), "k/pki/ca.crt", &p.cert);
    let text = kubeconfig(&p.cert, "    client-certificate: pki/client.crt\n    client-key: pki/client.key")
        .replace(&format!("certificate-authority-data: {}", b64(&p.cert)), "certificate-authority: pki/ca.crt");
    let path = write(d.path(), "k/kubelet.kubeconfig", &text);
    let c = load_one(&path, None).unwrap();
    let pki_dir = d.path().join("k/pki");
    assert_eq!(c.ca, Some(Pem::File(pki_dir.join("ca.crt"))));
    assert_eq!(
        c.auth,
        Auth::ClientCert { cert: Pem::File(pki_dir.join("client.crt")), key: Pem::File(pki_dir.join("client.key")) }
    );
    assert!(c.identity.contains("client.crt") && c.identity.contains("kubelet.kubeconfig"), "{}", c.identity);
    Client::new(c, ClientSettings::default()).unwrap();
}

#[test]
fn bearer_token_and_token_file() {
    let d = tempfile::tempdir().unwrap();
    let p = pki();
    let path = write(d.path(), "a", &kubeconfig(&p.cert, "    token: s3cr3t-token"));
    assert_eq!(load_one(&path, None).unwrap().auth, Auth::Token(Secret::new("s3cr3t-token")));
    write(d.path(), "tok/t", "file-token\n");
    let path = write(d.path(), "b", &kubeconfig(&p.cert, "    tokenFile: tok/t"));
    assert_eq!(load_one(&path, None).unwrap().auth, Auth::TokenFile(d.path().join("tok/t")));
}

#[test]
fn insecure_skip_tls_verify_only_when_set() {
    let d = tempfile::tempdir().unwrap();
    let text = "current-context: x\nclusters:\n- name: c\n  cluster:\n    server: https://h:1\n    insecure-skip-tls-verify: true\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nusers:\n- name: u\n  user: {token: t}\n";
    let path = write(d.path(), "insecure", text);
    let c = load_one(&path, None).unwrap();
    assert!(c.insecure_skip_tls_verify);
    assert_eq!(c.ca, None);
    Client::new(c, ClientSettings::default()).unwrap();
    let path =
        write(d.path(), "secure", &text.replace("insecure-skip-tls-verify: true", "insecure-skip-tls-verify: false"));
    let e = load_one(&path, None).unwrap_err().to_string();
    assert!(e.contains("secure") && e.contains("no certificate-authority"), "{e}");
}

#[test]
fn contexts_current_and_explicit() {
    let d = tempfile::tempdir().unwrap();
    let p = pki();
    let ca = b64(&p.cert);
    let text = format!(
        "current-context: a\nclusters:\n- name: ca\n  cluster: {{server: 'https://a:1', certificate-authority-data: {ca}}}\n- name: cb\n  cluster: {{server: 'https://b:2/', certificate-authority-data: {ca}}}\ncontexts:\n- name: a\n  context: {{cluster: ca, user: ua}}\n- name: b\n  context: {{cluster: cb, user: ub}}\nusers:\n- name: ua\n  user: {{token: ta}}\n- name: ub\n  user: {{token: tb}}\n"
    );
    let path = write(d.path(), "config", &text);
    let a = load_one(&path, None).unwrap();
    assert_eq!((a.server.as_str(), a.auth), ("https://a:1", Auth::Token(Secret::new("ta"))));
    let b = load_one(&path, Some("b")).unwrap();
    assert_eq!((b.server.as_str(), b.auth), ("https://b:2", Auth::Token(Secret::new("tb"))));
}

#[test]
fn malformed_kubeconfigs_name_the_file_and_the_problem() {
    let d = tempfile::tempdir().unwrap();
    let p = pki();
    let good = kubeconfig(&p.cert, "    token: t");
    let ca_line = format!("certificate-authority-data: {}", b64(&p.cert));
    write(d.path(), "garbage.pem", "not pem at all");
    let cases: Vec<(&str, String, &str)> = vec![
        ("bad-yaml", "clusters: [unclosed".into(), "not a valid kubeconfig"),
        ("no-current", good.replace("current-context: main\n", ""), "no current-context"),
        (
            "unknown-ctx",
            good.replace("current-context: main", "current-context: nope"),
            "context \"nope\" is not defined",
        ),
        ("no-user", good.replace("- name: u1", "- name: other"), "user \"u1\", which is not defined"),
        ("no-cluster", good.replace("- name: c1", "- name: other"), "cluster \"c1\", which is not defined"),
        ("bad-base64", good.replace(&ca_line, "certificate-authority-data: '!!not base64!!'"), "not valid base64"),
        (
            "bad-pem",
            good.replace(&ca_line, &format!("certificate-authority-data: {}", b64("hello"))),
            "no PEM CERTIFICATE",
        ),
        ("missing-file", good.replace(&ca_line, "certificate-authority: nowhere/ca.crt"), "does not exist"),
        (
            "bad-pem-file",
            good.replace(&ca_line, "certificate-authority: garbage.pem"),
            "garbage.pem: contains no PEM CERTIFICATE",
        ),
        ("http-server", good.replace("https://127.0.0.1", "http://127.0.0.1"), "not an https:// URL"),
        ("no-server", good.replace("    server: https://127.0.0.1:6443\n", ""), "has no server"),
        ("no-creds", good.replace("    token: t", "    {}"), "has no credentials"),
        (
            "key-only",
            good.replace("    token: t", &format!("    client-key-data: {}", b64(&p.key))),
            "no client certificate",
        ),
        (
            "bad-key",
            good.replace(
                "    token: t",
                &format!("    client-certificate-data: {}\n    client-key-data: {}", b64(&p.cert), b64(&p.cert)),
            ),
            "no usable PEM private key",
        ),
    ];
    for (name, text, want) in cases {
        let path = write(d.path(), name, &text);
        let err = load_one(&path, None).expect_err(name);
        let msg = err.to_string();
        assert!(matches!(err, Error::Kubeconfig { .. }), "{name}: {err:?}");
        assert!(msg.contains(&path.display().to_string()), "{name}: the message must name the file: {msg}");
        assert!(msg.contains(want), "{name}: expected {want:?} in {msg}");
    }
    let missing = d.path().join("absent");
    let msg = load_one(&missing, None).unwrap_err().to_string();
    assert!(msg.contains("absent") && msg.contains("cannot read"), "{msg}");
}

#[test]
fn exec_and_auth_provider_are_named_as_unsupported() {
    let d = tempfile::tempdir().unwrap();
    let p = pki();
    let cases = [
        (
            "exec",
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws",
            "exec credential plugin",
        ),
        ("authp", "    auth-provider:\n      name: oidc", "auth-provider"),
    ];
    for (name, user, want) in cases {
        let path = write(d.path(), name, &kubeconfig(&p.cert, user));
        let msg = load_one(&path, None).unwrap_err().to_string();
        assert!(msg.contains(want) && msg.contains("not support") && msg.contains("client certificate"), "{msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
    }
}

#[test]
fn kubeconfig_list_merges_first_definition_wins() {
    let d = tempfile::tempdir().unwrap();
    let p = pki();
    let ca = b64(&p.cert);
    let one = "current-context: main\ncontexts:\n- name: main\n  context: {cluster: c, user: u}\nusers:\n- name: u\n  user: {token: first}\n";
    let two = format!(
        "current-context: other\nclusters:\n- name: c\n  cluster: {{server: 'https://two:1', certificate-authority-data: {ca}}}\nusers:\n- name: u\n  user: {{token: second}}\n"
    );
    let f1 = write(d.path(), "one", one);
    let f2 = write(d.path(), "two", &two);
    let c = kubeconfig::load(&[f1, f2], None).unwrap();
    assert_eq!(c.server, "https://two:1");
    assert_eq!(c.auth, Auth::Token(Secret::new("first")));
}

fn sources(d: &Path, env: &[(&str, String)]) -> Sources {
    Sources {
        kubeconfig: None,
        context: None,
        insecure_skip_tls_verify: false,
        service_account_dir: d.join("sa"),
        k3s_kubelet_kubeconfig: d.join("k3s/kubelet.kubeconfig"),
        k3s_server_kubeconfig: d.join("k3s/k3s.yaml"),
        env: env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<BTreeMap<_, _>>(),
    }
}

fn token_config(p: &Pki, server: &str) -> String {
    kubeconfig(&p.cert, "    token: t").replace("https://127.0.0.1:6443", server)
}

#[test]
fn resolution_order_first_found_wins() {
    let d = tempfile::tempdir().unwrap();
    let dp = d.path();
    let p = pki();
    let none = resolve(&sources(dp, &[])).unwrap_err();
    let msg = none.to_string();
    for want in ["--kubeconfig", "KUBECONFIG", "KUBERNETES_SERVICE_HOST", "kubelet.kubeconfig", "k3s.yaml"] {
        assert!(msg.contains(want), "{want} missing from {msg}");
    }
    write(dp, "k3s/k3s.yaml", &token_config(&p, "https://server:1"));
    assert_eq!(resolve(&sources(dp, &[])).unwrap().server, "https://server:1");
    write(dp, "k3s/kubelet.kubeconfig", &token_config(&p, "https://kubelet:1"));
    assert_eq!(resolve(&sources(dp, &[])).unwrap().server, "https://kubelet:1");
    let in_cluster =
        [("KUBERNETES_SERVICE_HOST", "10.0.0.1".to_string()), ("KUBERNETES_SERVICE_PORT", "443".to_string())];
    // Env set but no token mounted: not in a pod, fall through.
    assert_eq!(resolve(&sources(dp, &in_cluster)).unwrap().server, "https://kubelet:1");
    write(dp, "sa/token", "sa-token\n");
    write(dp, "sa/ca.crt", &p.cert);
    let c = resolve(&sources(dp, &in_cluster)).unwrap();
    assert_eq!(c.server, "https://10.0.0.1:443");
    assert_eq!(c.auth, Auth::TokenFile(dp.join("sa/token")));
    assert_eq!(c.ca, Some(Pem::File(dp.join("sa/ca.crt"))));
    let home_cfg = write(dp, "home/.kube/config", &token_config(&p, "https://home:1"));
    let mut with_home = in_cluster.to_vec();
    with_home.push(("HOME", dp.join("home").display().to_string()));
    assert_eq!(resolve(&sources(dp, &with_home)).unwrap().server, "https://home:1", "~/.kube/config before in-cluster");
    assert!(home_cfg.exists());
    let env_cfg = write(dp, "env/config", &token_config(&p, "https://env:1"));
    let mut env = with_home.to_vec();
    env.push(("KUBECONFIG", format!("{}:{}", dp.join("missing").display(), env_cfg.display())));
    assert_eq!(resolve(&sources(dp, &env)).unwrap().server, "https://env:1");
    let explicit = write(dp, "explicit", &token_config(&p, "https://explicit:1"));
    let mut s = sources(dp, &env);
    s.kubeconfig = Some(explicit);
    s.insecure_skip_tls_verify = true;
    let c = resolve(&s).unwrap();
    assert_eq!(c.server, "https://explicit:1");
    assert!(c.insecure_skip_tls_verify, "the config key turns verification off explicitly");
}

#[test]
fn broken_first_source_is_an_error_not_skipped() {
    let d = tempfile::tempdir().unwrap();
    let p = pki();
    write(d.path(), "k3s/k3s.yaml", &token_config(&p, "https://server:1"));
    let bad = write(d.path(), "bad", "current-context: [");
    let mut s = sources(d.path(), &[]);
    s.kubeconfig = Some(bad.clone());
    let msg = resolve(&s).unwrap_err().to_string();
    assert!(msg.contains(&bad.display().to_string()), "{msg}");
}

#[test]
fn in_cluster_ipv6_host_and_bad_port() {
    let d = tempfile::tempdir().unwrap();
    let p = pki();
    write(d.path(), "sa/token", "t");
    write(d.path(), "sa/ca.crt", &p.cert);
    let env = [("KUBERNETES_SERVICE_HOST", "fd00::1".to_string()), ("KUBERNETES_SERVICE_PORT", "443".to_string())];
    assert_eq!(resolve(&sources(d.path(), &env)).unwrap().server, "https://[fd00::1]:443");
    let env = [("KUBERNETES_SERVICE_HOST", "h".to_string()), ("KUBERNETES_SERVICE_PORT", "https".to_string())];
    let msg = resolve(&sources(d.path(), &env)).unwrap_err().to_string();
    assert!(msg.contains("sa") && msg.contains("not a port number"), "{msg}");
}

#[test]
fn secrets_are_redacted_in_debug() {
    let p = pki();
    let creds = Credentials {
        server: "https://h:1".into(),
        ca: Some(Pem::Data(p.cert.clone().into_bytes())),
        insecure_skip_tls_verify: false,
        tls_server_name: None,
        auth: Auth::Token(Secret::new("very-secret-token-123")),
        identity: "test".into(),
    };
    let dbg = format!("{creds:?}");
    assert!(!dbg.contains("very-secret-token-123"), "{dbg}");
    assert!(dbg.contains("redacted"));
    let key_creds = Credentials {
        auth: Auth::ClientCert { cert: Pem::Data(p.cert.into_bytes()), key: Pem::Data(p.key.clone().into_bytes()) },
        ..creds.clone()
    };
    let dbg = format!("{key_creds:?}");
    assert!(!dbg.contains("PRIVATE KEY") && !dbg.contains(&p.key[40..80]), "{dbg}");
    let client = Client::new(creds, ClientSettings::default()).unwrap();
    assert!(!format!("{client:?}").contains("very-secret-token-123"));
}

#[test]
fn client_certificate_files_are_reloaded_when_they_change() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (pki(), pki());
    let cert = write(d.path(), "c.crt", &a.cert);
    let key = write(d.path(), "c.key", &a.key);
    let r = tls::ReloadingCert::new(Pem::File(cert.clone()), Pem::File(key.clone()), tls::provider()).unwrap();
    let first = r.current().cert[0].clone();
    assert_eq!(r.current().cert[0], first, "unchanged files are not reloaded into something else");
    std::fs::write(&cert, &b.cert).unwrap();
    std::fs::write(&key, &b.key).unwrap();
    let later = SystemTime::now() + Duration::from_secs(5);
    for f in [&cert, &key] {
        std::fs::File::options().write(true).open(f).unwrap().set_modified(later).unwrap();
    }
    let second = r.current().cert[0].clone();
    assert_ne!(second, first, "a re-signed certificate must be picked up");
    // A broken rewrite keeps the last good pair.
    std::fs::write(&key, "garbage").unwrap();
    std::fs::File::options().write(true).open(&key).unwrap().set_modified(later + Duration::from_secs(5)).unwrap();
    assert_eq!(r.current().cert[0], second);
}

#[test]
fn mismatched_certificate_and_key_fail_at_construction() {
    let (a, b) = (pki(), pki());
    let err = tls::ReloadingCert::new(Pem::Data(a.cert.into_bytes()), Pem::Data(b.key.into_bytes()), tls::provider())
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not match"), "{err}");
}

#[test]
fn status_bodies_decode_into_typed_errors() {
    let forbidden = br#"{"kind":"Status","status":"Failure","message":"resourceslices is forbidden: node n1 may only modify its own slices","reason":"Forbidden","code":403}"#;
    let e = Error::from_status("PUT /x".into(), 403, forbidden, None);
    assert!(e.is_forbidden());
    assert!(e.to_string().contains("node n1 may only modify its own slices"), "{e}");
    let invalid = br#"{"kind":"Status","message":"invalid","reason":"Invalid","code":422,"details":{"causes":[{"field":"spec.devices[0].name","message":"Invalid value"}]}}"#;
    let e = Error::from_status("POST /x".into(), 422, invalid, None);
    assert!(e.is_invalid());
    assert_eq!(e.api().unwrap().causes, vec!["spec.devices[0].name: Invalid value".to_string()]);
    let e = Error::from_status("GET /x".into(), 429, br#"{"kind":"Status","details":{"retryAfterSeconds":3}}"#, None);
    assert_eq!(e.api().unwrap().retry_after, Some(3));
    type Pred = fn(&Error) -> bool;
    let cases: [(u16, Pred); 5] = [
        (404, Error::is_not_found),
        (409, Error::is_conflict),
        (410, Error::is_gone),
        (401, Error::is_unauthorized),
        (503, |e| matches!(e, Error::ServerError(_))),
    ];
    for (code, pred) in cases {
        let e = Error::from_status("GET /x".into(), code, b"<html>proxy error</html>", Some(1));
        assert!(pred(&e), "{code}: {e:?}");
        assert_eq!(e.status(), Some(code));
        assert!(e.to_string().contains("proxy error"));
    }
}

#[test]
fn server_supplied_retry_after_is_capped() {
    let body = br#"{"kind":"Status","message":"later","details":{"retryAfterSeconds":18446744073709551615}}"#;
    let e = Error::from_status("GET /x".into(), 429, body, None);
    assert_eq!(e.api().unwrap().retry_after, Some(MAX_RETRY_AFTER.as_secs()));
    let e = Error::from_status("GET /x".into(), 503, b"not a status", Some(u64::MAX));
    assert_eq!(e.api().unwrap().retry_after, Some(MAX_RETRY_AFTER.as_secs()));
    let e = Error::from_status("GET /x".into(), 503, b"", Some(2));
    assert_eq!(e.api().unwrap().retry_after, Some(2), "small delays are kept");
}

#[test]
fn a_retry_after_header_is_any_non_negative_number_and_nothing_else() {
    use super::error::parse_retry_after;
    let cases: [(&str, Option<u64>); 14] = [
        ("3", Some(3)),
        (" 3 ", Some(3)),
        ("0", Some(0)),
        ("0.5", Some(1)),
        ("2.1", Some(3)),
        ("1e308", Some(60)),
        ("1e999", Some(60)),
        ("18446744073709551616", Some(60)),
        ("-1", None),
        ("-0.5", None),
        ("NaN", None),
        ("inf", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),
        ("", None),
    ];
    for (header, want) in cases {
        assert_eq!(parse_retry_after(header), want, "Retry-After: {header:?}");
    }
    // The body's details.retryAfterSeconds is read the same way.
    for (secs, want) in [("0.5", Some(1)), ("1e308", Some(60)), ("-5", None), ("-0.5", None)] {
        let body = format!(r#"{{"kind":"Status","message":"later","details":{{"retryAfterSeconds":{secs}}}}}"#);
        let e = Error::from_status("GET /x".into(), 429, body.as_bytes(), None);
        assert_eq!(e.api().unwrap().retry_after, want, "retryAfterSeconds: {secs}");
    }
}

mod body;
mod files;
pub(crate) mod testserver;
pub(crate) mod transport;
mod watch;
