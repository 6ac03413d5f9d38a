//! What a user of the node without privileges can do to `edra run`: directories edra uses
//! that others can write are named at WARN with their fix, once each.

use std::os::unix::fs::PermissionsExt;

use crate::support::agent::{ChildAgent, Cluster};

#[tokio::test]
async fn directories_others_can_write_are_warned_about_once_each_with_the_chmod() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let paths = fs.paths();
    for dir in [&paths.cdi_dynamic_dir, &paths.registry_dir, &paths.state_dir] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).expect("chmod 0777");
    }
    let agent = ChildAgent::start(&cluster, "").await;
    let log = agent.log.clone();
    agent.terminate().await;
    let text = std::fs::read_to_string(log).expect("read the agent's log");
    let warned = |dir: &std::path::Path| {
        text.lines()
            .filter(|l| l.contains(" WARN ") && l.contains("is writable by users other than its owner"))
            .filter(|l| l.contains(&format!("fix: chmod go-w {} ", dir.display())))
            .count()
    };
    assert_eq!(warned(&paths.cdi_dynamic_dir), 1, "{text}");
    assert_eq!(warned(&paths.registry_dir), 1, "{text}");
    // edra gives its state directory mode 0700 before it looks.
    assert_eq!(warned(&paths.state_dir), 0, "{text}");
    let mode = std::fs::metadata(&paths.state_dir).expect("state dir").permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);
}
