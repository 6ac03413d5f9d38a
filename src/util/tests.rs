use super::*;

#[test]
fn a_child_past_its_limit_is_killed_and_its_output_capped() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let mut slow = Command::new("sleep").arg("30").spawn().unwrap();
    let started = Instant::now();
    let waited = wait_bounded(&mut slow, Duration::from_millis(100), Duration::from_millis(5)).unwrap();
    assert!(waited.is_none() && started.elapsed() < Duration::from_secs(10));
    assert!(slow.try_wait().unwrap().is_some(), "killed and reaped");
    let mut chatty =
        Command::new("sh").args(["-c", "head -c 200000 /dev/zero; exit 3"]).stdout(Stdio::piped()).spawn().unwrap();
    let out = read_capped(chatty.stdout.take(), 1000);
    let status = wait_bounded(&mut chatty, Duration::from_secs(30), Duration::from_millis(5)).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(3), "it ran to its end: the pipe never filled");
    assert_eq!(out.join().unwrap().len(), 1000);
}

#[test]
fn a_stale_temp_file_or_a_link_planted_under_its_name_is_replaced_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let (path, tmp, elsewhere) = (dir.path().join("f"), dir.path().join(".f.tmp"), dir.path().join("elsewhere"));
    std::fs::write(&tmp, b"stale").unwrap();
    write_atomically(&path, &tmp, b"one", 0o640).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"one");
    assert!(!tmp.exists());
    std::fs::write(&elsewhere, b"keep").unwrap();
    std::os::unix::fs::symlink(&elsewhere, &tmp).unwrap();
    write_atomically(&path, &tmp, b"two", 0o640).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"two");
    assert_eq!(std::fs::read(&elsewhere).unwrap(), b"keep");
    assert!(std::fs::symlink_metadata(&tmp).is_err());
    use std::os::unix::fs::PermissionsExt;
    assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o640);
}

#[test]
fn a_directory_mode_is_set_on_the_directory_never_through_a_link() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let (dir, target, link) = (tmp.path().join("d"), tmp.path().join("target"), tmp.path().join("link"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
    set_dir_mode(&dir, 0o1777).unwrap();
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o1777);
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = set_dir_mode(&link, 0o1777).unwrap_err();
    assert!(err.to_string().contains("is a symbolic link; edra does not follow it"), "{err}");
    assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777, 0o755);
}

#[test]
fn a_failed_create_leaves_the_file_as_it_was_and_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let (path, tmp) = (dir.path().join("f"), dir.path().join(".f.tmp"));
    std::fs::write(&path, b"old").unwrap();
    let mut calls = 0;
    let err = replace_atomically(&path, &tmp, |tmp| {
        calls += 1;
        std::fs::write(tmp, b"half")?;
        Err(std::io::Error::other("disk full"))
    })
    .unwrap_err();
    assert_eq!(err.to_string(), "disk full");
    assert_eq!(calls, 1);
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    assert!(!tmp.exists());
    // Exclusive creation that keeps finding the name taken gives up after one removal.
    let mut calls = 0;
    let err = replace_atomically(&path, &tmp, |tmp| {
        calls += 1;
        std::fs::write(tmp, b"x")?;
        Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists))
    })
    .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(calls, 2);
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    assert!(!tmp.exists());
}

#[test]
fn a_private_socket_is_0600_and_files_other_threads_create_meanwhile_keep_their_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &std::path::Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
    let reference = dir.path().join("reference");
    std::fs::create_dir(&reference).unwrap();
    let expected = mode(&reference);
    assert_ne!(expected & 0o111, 0, "the test's umask leaves directories searchable");
    let sockets = dir.path().join("sockets");
    std::fs::create_dir(&sockets).unwrap();
    let binding = std::thread::spawn(move || {
        for i in 0..300 {
            let at = sockets.join(format!("{i}.sock"));
            drop(listen_private(&at).unwrap());
            assert_eq!(std::fs::symlink_metadata(&at).unwrap().permissions().mode() & 0o777, 0o600);
        }
    });
    let mut created = 0;
    while !binding.is_finished() || created == 0 {
        let made = dir.path().join(format!("dir-{created}"));
        std::fs::create_dir(&made).unwrap();
        assert_eq!(mode(&made), expected, "a directory made while a socket was bound");
        created += 1;
    }
    binding.join().unwrap();
    let long = dir.path().join("x".repeat(200));
    assert_eq!(listen_private(&long).unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn an_agents_socket_replaces_a_stale_socket_and_refuses_any_other_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("run/edra/agent.sock");
    drop(bind_replacing(&at).unwrap());
    assert!(at.exists(), "a dropped listener leaves its socket file, as a killed agent does");
    let listener = bind_replacing(&at).unwrap();
    assert_eq!(std::fs::metadata(&at).unwrap().permissions().mode() & 0o777, 0o600);
    tokio::net::UnixStream::connect(&at).await.unwrap();
    drop(listener);
    std::fs::remove_file(&at).unwrap();
    std::fs::write(&at, "someone's file").unwrap();
    let refused = bind_replacing(&at).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::AlreadyExists);
    assert!(refused.to_string().contains("not a socket"), "{refused}");
    assert_eq!(std::fs::read(&at).unwrap(), b"someone's file");
}

#[test]
fn control_characters_are_shown_never_interpreted() {
    let hostile = "\u{1b}]0;owned\u{7}\u{1b}[2J\r\nFAKE LINE: all GPUs healthy\u{9b}31m\u{7f}\t";
    let shown = escape_controls(hostile);
    assert_eq!(shown, "\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{d}\\u{a}FAKE LINE: all GPUs healthy\\u{9b}31m\\u{7f}\\u{9}");
    assert!(!shown.chars().any(is_control));
    // Text without control characters, other languages' letters included, is untouched.
    for plain in ["gpu-0", "Xid 79: GPU has fallen off the bus", "Grafikkarte ü ñ 显卡 é\u{a0}", ""] {
        assert!(matches!(escape_controls(plain), std::borrow::Cow::Borrowed(p) if p == plain), "{plain:?}");
    }
    assert_eq!(escape_controls("\u{0}\u{1f} \u{80}\u{9f}\u{a0}"), "\\u{0}\\u{1f} \\u{80}\\u{9f}\u{a0}");
}

#[test]
fn json_keeps_its_meaning_with_del_and_c1_escaped() {
    let value = serde_json::json!({"message": "\u{1b}[2J\r\n\u{9b}2J\u{7f}", "n": 1});
    let text = serde_json::to_string_pretty(&value).unwrap();
    assert!(text.contains('\u{9b}'), "serde_json passes C1 through: {text}");
    let escaped = escape_json_controls(&text);
    assert!(!escaped.chars().any(|c| is_control(c) && c != '\n'), "{escaped}");
    assert!(escaped.contains("\\u009b2J\\u007f"), "{escaped}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&escaped).unwrap(), value);
}
