//! Credential files are read only when they are regular files (links followed) and only up
//! to their limit: a FIFO, a directory, a device and an oversized file are refused at once,
//! through each reader (kubeconfig, its CA and client certificate, the token, the TLS
//! reload).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use super::super::files::{MAX_CREDENTIAL_FILE, read_regular};
use super::*;

/// `f` on another thread, failing the test if it takes longer than a few seconds (a read
/// that blocks on a FIFO or streams /dev/zero would never return).
fn promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10)).expect("the read returns within 10 s instead of blocking")
}

fn fifo(at: &Path) -> PathBuf {
    let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and a mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo: {}", std::io::Error::last_os_error());
    at.to_path_buf()
}

/// Non-regular and oversized files in `d`, each with the words its refusal must contain.
fn bad_files(d: &Path) -> Vec<(PathBuf, &'static str)> {
    let big = d.join("big.pem");
    std::fs::write(&big, vec![b'A'; 2 << 20]).unwrap();
    let dir = d.join("a-dir");
    std::fs::create_dir(&dir).unwrap();
    vec![
        (fifo(&d.join("fifo.pem")), "it is a FIFO, not a regular file"),
        (dir, "it is a directory, not a regular file"),
        (PathBuf::from("/dev/zero"), "it is a device, not a regular file"),
        (big, "it is larger than 1024 KiB"),
    ]
}

#[test]
fn a_link_to_a_regular_file_is_read_and_anything_else_is_refused_promptly() {
    let d = tempfile::tempdir().unwrap();
    let real = write(d.path(), "kubelet-client-2026.pem", "pem bytes");
    let link = d.path().join("kubelet-client-current.pem");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert_eq!(read_regular(&link, MAX_CREDENTIAL_FILE).unwrap(), b"pem bytes");
    let exact = write(d.path(), "exact", &"A".repeat(1 << 20));
    assert_eq!(read_regular(&exact, MAX_CREDENTIAL_FILE).unwrap().len(), 1 << 20, "the limit itself is allowed");
    for (path, want) in bad_files(d.path()) {
        let shown = path.display().to_string();
        let got = promptly(move || read_regular(&path, MAX_CREDENTIAL_FILE));
        let e = got.expect_err(&shown);
        assert!(e.contains(want), "{shown}: {e}");
    }
}

#[test]
fn every_credential_reader_refuses_what_is_not_a_bounded_regular_file() {
    let d = tempfile::tempdir().unwrap();
    let p = pki();
    for (path, want) in bad_files(d.path()) {
        let shown = path.display().to_string();
        // The CA file of a kubeconfig, checked at load.
        let user = format!("    client-certificate-data: {}\n    client-key-data: {}", b64(&p.cert), b64(&p.key));
        let text = kubeconfig(&p.cert, &user).replace(
            &format!("certificate-authority-data: {}", b64(&p.cert)),
            &format!("certificate-authority: {shown}"),
        );
        assert!(text.contains(&shown), "{text}");
        let config = write(d.path(), "config-ca", &text);
        let e = promptly(move || load_one(&config, None)).expect_err(&shown).to_string();
        assert!(e.contains("config-ca") && e.contains(&format!("certificate-authority file {shown}")), "{e}");
        assert!(e.contains(want), "{e}");
        // The kubeconfig itself.
        let at = path.clone();
        let e = promptly(move || load_one(&at, None)).expect_err(&shown).to_string();
        assert!(e.contains(&shown) && e.contains(want), "{e}");
        // The bearer token, read again at each request.
        let at = path.clone();
        let e = promptly(move || credentials::read_token(&at)).expect_err(&shown).to_string();
        assert!(e.contains(&shown) && e.contains(want), "{e}");
        // A client certificate reloaded by the TLS layer.
        let (cert, key) = (Pem::File(path.clone()), Pem::Data(p.key.clone().into_bytes()));
        let e = promptly(move || tls::ReloadingCert::new(cert, key, tls::provider()).err()).expect(&shown).to_string();
        assert!(e.contains(&shown) && e.contains(want), "{e}");
    }
}
